"""Throughput of the in-process runner per policy, and the Parquet logging overhead as a share of run time.

    python benchmarks/bench_runner.py [--benchmark DIR|demo] [--split dev] [--budgets XS,S,M,L] [--seeds 0]
                                      [--limit N] [--policies a,b,...]

Prints one line per policy: episodes, episodes/s of playing time (policy + env, warm DB handles), turns logged,
logging time (row building, validation, Parquet writes, fsync) and its share of the run's wall time (target < 1%).

One cost is paid once per process, not per episode: pyarrow's first Python-to-Arrow conversion imports pandas
(≈ 0.2 s). It is measured first, on its own, so the per-policy rows show the steady per-episode overhead; the last
line adds it back to give the share of the whole benchmark process.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import pyarrow as pa

from bapsql.policies.registry import policy_names
from bapsql.rollout.runner import evaluate

DEFAULT_POLICIES = ("workflow.direct_aggregation", "workflow.estimate_rewrite", "workflow.verify_answer",
                    "workflow.restore_after_archive", "scripted.drafter@raw", "scripted.drafter@adaptive_posthoc",
                    "workflow.estimate_rewrite@shuffled_estimate")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--benchmark", default="demo")
    ap.add_argument("--split", default="dev")
    ap.add_argument("--budgets", default="XS,S,M,L")
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--policies", default=",".join(DEFAULT_POLICIES))
    args = ap.parse_args()
    policies = [p for p in args.policies.split(",") if p] if args.policies != "all" else list(policy_names())
    budgets = args.budgets.split(",")
    seeds = [int(s) for s in args.seeds.split(",")]
    print(f"benchmark={args.benchmark} split={args.split} budgets={args.budgets} seeds={args.seeds} "
          f"limit={args.limit}")
    print(f"{'policy':<48}{'episodes':>9}{'eps/s':>9}{'turns':>8}{'wall s':>9}{'log s':>8}{'log %':>8}")
    t0 = time.perf_counter()
    pa.array([0])  # the once-per-process initialisation the first Parquet flush would otherwise pay
    once_s = time.perf_counter() - t0
    print(f"one-time pyarrow initialisation (first conversion, imports pandas): {once_s:.3f} s")
    tot_log = tot_wall = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        for name in policies:
            t0 = time.perf_counter()
            s = evaluate(args.benchmark, args.split, name, budgets, seeds, Path(tmp) / name.replace("+", "_"),
                         limit=args.limit)
            turns = sum(1 for f in s.files if "/turns/" in str(f))  # files, not rows; rows below
            from bapsql.logs.reader import read_turns

            n_turns = len(read_turns(Path(tmp) / name.replace("+", "_")))
            tot_log += s.log_s
            tot_wall += s.wall_s
            print(f"{name:<48}{s.episodes_run:>9}{s.episodes_per_s:>9.1f}{n_turns:>8}{s.wall_s:>9.2f}"
                  f"{s.log_s:>8.3f}{100 * s.log_share:>7.2f}%  ({turns} turn files, {time.perf_counter() - t0:.1f}s)")
    print(f"{'all (steady)':<48}{'':>9}{'':>9}{'':>8}{tot_wall:>9.2f}{tot_log:>8.3f}{100 * tot_log / tot_wall:>7.2f}%")
    tot_log, tot_wall = tot_log + once_s, tot_wall + once_s
    print(f"{'all, with the one-time initialisation':<48}{'':>9}{'':>9}{'':>8}{tot_wall:>9.2f}{tot_log:>8.3f}"
          f"{100 * tot_log / tot_wall:>7.2f}%")


if __name__ == "__main__":
    main()
