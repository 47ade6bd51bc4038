"""Sweeps on a simulated multi-node Ray cluster vs the in-process runner, on the same scripted work, in one run.

    python benchmarks/bench_cluster.py [--rounds 2]

The work: scripted episodes (estimate→rewrite and the raw agent at XS and L, seed 0) over every task of the
embedded benchmark's train split (236 tasks on 6 databases: 944 episodes), logged to Parquet either way.

1. overhead: the in-process runner (`bapsql.rollout.runner.evaluate`, one process, no Ray) and the Ray sweep with
   ONE env worker on a worker node of the simulated cluster (`tests.rollout.ray_cluster.SimCluster`: a head without
   env resources and two worker nodes offering ``env_node``), alternated ``--rounds`` times after a warm-up of each;
   the overhead share is (Ray rollout time − in-process time) / Ray rollout time, on the best (load only ever adds
   time) and on the median of the rounds. Target <= 10 %.
2. scaling: the Ray sweep with 1, 2 and 4 env workers spread over the two worker nodes: episodes per second of
   rollout time (actor setup excluded, printed apart). On a machine with C cores, more than C busy workers cannot
   scale.

Prints one line per measurement and a summary; the cluster is private (own temp dir, never ``ray stop``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
METHODS = ("workflow.estimate_rewrite", "scripted.drafter@raw")
LEVELS = ("XS", "L")


def _cfg(workers: int):
    from bapsql.experiment import ExperimentConfig, RayConfig, WorkersConfig, validate

    return validate(ExperimentConfig(
        run="bench", methods=METHODS, benchmark="demo", split="train", budgets=LEVELS, seeds=(0,),
        workers=WorkersConfig(env_workers=workers, env_worker_cpus=0.5, in_flight=64, scripted_batch=4,
                              env_resources={"env_node": 1.0}),
        ray=RayConfig(preflight=True)))


def inprocess(work: Path, tag: str) -> tuple[int, float]:
    from bapsql.rollout.runner import evaluate

    t0 = time.perf_counter()
    n = sum(evaluate("demo", "train", m, LEVELS, [0], work / f"inproc-{tag}", run_name="bench").episodes_run
            for m in METHODS)
    dt = time.perf_counter() - t0
    print(f"in-process runner ({tag}): {n} episodes in {dt:.2f} s = {n / dt:.1f} episodes/s", flush=True)
    return n, dt


def on_ray(address: str, work: Path, workers: int, tag: str) -> tuple[int, float, float]:
    from bapsql.rollout.ray_shell import join_ray
    from bapsql.rollout.sweep import run_sweep

    with join_ray(address):
        s = run_sweep(_cfg(workers), out_dir=work / f"ray-{tag}")
    r = s.result
    print(f"Ray sweep, {workers} env worker(s) ({tag}): {r.episodes_run} episodes, rollout {r.wall_s:.2f} s = "
          f"{r.episodes_per_s:.1f} episodes/s (actor setup {s.setup_s:.1f} s)", flush=True)
    return r.episodes_run, r.wall_s, s.setup_s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=2, help="alternations of in-process and Ray runs (overhead)")
    a = ap.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.update(RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0",
                      PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    from bapsql.rollout.ray_shell import short_temp_dir
    from bapsql.rollout.sweep import benchmark_dir
    from tests.rollout.ray_cluster import SimCluster

    print(f"bench_cluster: {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} CPUs, load "
          f"{os.getloadavg()[0]:.1f}", flush=True)
    benchmark_dir(_cfg(1))  # build the embedded benchmark before timing anything
    work = Path(tempfile.mkdtemp(prefix="bench-cluster-"))
    cluster = SimCluster(short_temp_dir(work))
    try:
        for _ in range(2):
            cluster.add(num_cpus=2, resources={"env_node": 2})
        inprocess(work, "warm-up")
        on_ray(cluster.address, work, 1, "warm-up")
        inproc, ray1 = [], []
        for i in range(a.rounds):
            inproc.append(inprocess(work, f"round {i + 1}")[1])
            ray1.append(on_ray(cluster.address, work, 1, f"round {i + 1}")[1])
        scale = {}
        for w in (1, 2, 4):
            n, wall, _ = on_ray(cluster.address, work, w, f"scaling {w}")
            scale[w] = n / wall
    finally:
        cluster.close()
        shutil.rmtree(work, ignore_errors=True)
    for name, agg in (("best", min), ("median", statistics.median)):
        m_in, m_ray = agg(inproc), agg(ray1)
        print(f"overhead ({name} of {a.rounds}): Ray sweep (1 env worker on a worker node) {m_ray:.2f} s vs "
              f"in-process {m_in:.2f} s: overhead share {(m_ray - m_in) / m_ray:+.1%} of the Ray rollout time")
    print("scaling: " + ", ".join(f"{w} env worker(s) {eps:.1f} episodes/s ({eps / scale[1]:.2f}x)"
                                  for w, eps in scale.items()))


if __name__ == "__main__":
    main()
