"""Embedded-benchmark generation time and the budget profile of its tasks; optionally calibration coverage.

Builds the embedded benchmark at each requested scale into a work folder and prints wall and CPU time (this process
and its worker processes), task count, the shares of budget-sensitive and XS-unanswerable tasks, and the shares of
tasks whose gold / naive query exceeds the XS and S budgets when run unshielded (result tokens or VM steps). With
``--calibrate`` it then fits the estimator's calibration on the training databases of the full-scale build (and of
``--spider DIR`` when given, split by database) and prints p95 coverage on the held-out databases.

    python benchmarks/bench_datagen.py [--scale small,full] [--workdir DIR] [--workers 2] [--calibrate]
                                       [--spider ../shared/data/spider_train] [--target-coverage 0.998]
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
from pathlib import Path


def _cpu() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _load_avg() -> str:
    try:
        return Path("/proc/loadavg").read_text().split()[0]
    except OSError:
        return "?"


def build(scale: str, out: Path, workers: int) -> None:
    from bapsql.data.demo import build_demo

    t0, c0 = time.perf_counter(), _cpu()
    res = build_demo(out, scale=scale, seed=0, workers=workers)
    wall, cpu = time.perf_counter() - t0, _cpu() - c0
    s = res.shares
    print(f"[{scale}] {res.databases} databases, {res.tasks:,} tasks in {wall:.1f} s wall, {cpu:.1f} s CPU "
          f"({workers} workers, load avg {_load_avg()})")
    print(f"[{scale}] budget_sensitive {s['budget_sensitive']:.1%}, unanswerable_xs {s['unanswerable_xs']:.1%}")
    print(f"[{scale}] exceed XS: gold {s['gold_exceeds_XS']:.1%}, naive {s['naive_exceeds_XS']:.1%}; "
          f"exceed S: gold {s['gold_exceeds_S']:.1%}, naive {s['naive_exceeds_S']:.1%}")


def calibrate(label: str, root: Path, target: float, cache: Path) -> None:
    from bapsql.data.load import load_benchmark
    from bapsql.data.calibrate import calibrate_benchmark

    t0 = time.perf_counter()
    rep = calibrate_benchmark(load_benchmark(root, cache_dir=cache), target_coverage=target, cache_dir=cache)
    cov = rep.coverage_heldout
    slack = ", ".join(f"{q} {v['median_p95_over_actual']:.2f}" for q, v in cov.items())
    print(f"[calibrate {label}] target {target}: fit on {len(rep.train_databases)} train databases "
          f"({rep.train_samples:,} samples); held-out {len(rep.heldout_databases)} databases "
          f"({rep.heldout_samples:,} samples) p95 coverage rows {cov['rows']['p95']:.1%}, result tokens "
          f"{cov['result_tokens']['p95']:.1%}, VM steps {cov['vm_steps']['p95']:.1%}; median p95/actual: {slack}; "
          f"{time.perf_counter() - t0:.0f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scale", default="small,full", help="comma-separated scales to build")
    ap.add_argument("--workdir", type=Path, default=None, help="where to build (default: a temp folder)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--calibrate", action="store_true", help="fit calibration on the full build (and --spider)")
    ap.add_argument("--spider", type=Path, default=None, help="a Spider layout to calibrate on as well")
    ap.add_argument("--target-coverage", type=float, default=None, help="default: the calibrate command's default")
    args = ap.parse_args()
    from bapsql.data.calibrate import DEFAULT_TARGET

    target = args.target_coverage or DEFAULT_TARGET
    work = args.workdir or Path(tempfile.mkdtemp(prefix="bench_datagen_"))
    for scale in args.scale.split(","):
        build(scale, work / scale, args.workers)
    if args.calibrate:
        if "full" in args.scale.split(","):
            calibrate("demo full", work / "full", target, work / "cache")
        if args.spider is not None:
            calibrate("spider", args.spider, target, work / "cache")


if __name__ == "__main__":
    main()
