"""Benchmark of the offline analysis job at paper scale.

Writes a synthetic run like a real one (1,523 tasks × 8 methods × 4 budgets × 3 seeds ≈ 146k episodes over 11
databases, plus a turns table, hive-partitioned Parquet), then runs the full analysis — 10,000 database-cluster
bootstrap replicates for every pairwise comparison (8 methods → 28 pairs × XS/S/M/L) — in a fresh child process
and prints its wall time, phase times and peak resident memory. When chromium is installed it also renders
report.html headless and reports the screenshot. Target: analysis under 30 s on the 2-core dev machine.

    python benchmarks/bench_analysis.py [--tasks 1523] [--replicates 10000] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LADDER = ("XS", "S", "M", "L")
# The paper's Table 2 cells as planted success probabilities; tokens fall with the paper's XS/S savings for RL.
TABLE2 = {
    "Raw agent": (17.9, 19.1, 19.7, 19.9), "Dashboard": (17.7, 17.6, 17.4, 19.0),
    "Adaptive post-hoc": (26.0, 29.2, 31.5, 33.5), "BAP-SQL SFT": (31.4, 34.0, 36.2, 37.5),
    "SQL-RL (matched)": (32.2, 35.2, 38.7, 40.4), "Context-only RL": (32.3, 35.0, 37.0, 38.0),
    "BACM-RL (adapted)": (33.4, 36.0, 38.2, 39.4), "BAP-SQL RL": (34.8, 37.6, 39.2, 39.0),
}
TOKENS = (1470.0, 1680.0, 1900.0, 2150.0)


def _child(run: str, out: str, replicates: int) -> None:
    from bapsql.analysis.analyze import analyze_runs

    start = time.perf_counter()
    phases: list[tuple[str, float]] = []
    summary = analyze_runs([run], out, replicates=replicates, seed=0,
                           progress=lambda m: phases.append((m, time.perf_counter() - start)))
    wall = time.perf_counter() - start
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime, "phases": phases,
                      "comparisons": len(summary.comparisons), "episodes": summary.episodes,
                      "maxrss_mb": usage.ru_maxrss / 1024}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=1523)
    ap.add_argument("--replicates", type=int, default=10_000)
    ap.add_argument("--workdir", default=None, help="keep the run and report here (default: a temp dir)")
    ap.add_argument("--child", nargs=2, metavar=("RUN", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(args.child[0], args.child[1], args.replicates)
        return

    from bapsql.analysis.synthetic import SyntheticSpec, synthetic_run, write_run

    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="bench_analysis_"))
    run, out = work / "run", work / "report"
    shutil.rmtree(run, ignore_errors=True)
    tokens = {m: dict(zip(LADDER, TOKENS)) for m in TABLE2}
    tokens["BAP-SQL RL"] = dict(zip(LADDER, (TOKENS[0] * 0.955, TOKENS[1] * 0.95, TOKENS[2] * 0.97, TOKENS[3])))
    spec = SyntheticSpec(
        success={m: {lv: v / 100 for lv, v in zip(LADDER, cells)} for m, cells in TABLE2.items()},
        tokens=tokens, n_tasks=args.tasks, n_databases=11, seeds=(0, 1, 2), turns_per_episode=3.0,
    )
    t0 = time.perf_counter()
    episodes, turns = synthetic_run(spec)
    write_run(run, episodes, turns)
    gen = time.perf_counter() - t0
    size_mb = sum(f.stat().st_size for f in run.rglob("*.parquet")) / 2**20
    print(f"input: {episodes.num_rows:,} episodes, {turns.num_rows:,} turns, {len(TABLE2)} methods × 4 budgets × "
          f"3 seeds, 11 databases; {size_mb:.1f} MiB Parquet written in {gen:.1f} s")

    proc = subprocess.run([sys.executable, __file__, "--child", str(run), str(out), "--replicates",
                           str(args.replicates)], capture_output=True, text=True, check=True)
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"analysis: {res['wall_s']:.2f} s wall ({res['cpu_s']:.2f} s CPU incl. imports) for {res['episodes']:,} episodes, {res['comparisons']} paired "
          f"comparisons × {args.replicates:,} replicates (+ {len(TABLE2) * 4} success intervals)")
    print(f"peak RSS of the analysis process: {res['maxrss_mb']:.0f} MiB")
    marks = res["phases"] + [["done", res["wall_s"]]]
    for (message, t), (_, t_next) in zip(marks, marks[1:]):
        print(f"  {t_next - t:6.2f} s  {message}")

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium:
        shot = work / "report.png"
        t1 = time.perf_counter()
        subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                        "--disable-background-networking", "--disable-component-update", "--disable-sync",
                        f"--user-data-dir={work / 'chromium-profile'}", f"--screenshot={shot}",
                        "--window-size=1280,2000", (out / "report.html").as_uri()],
                       capture_output=True, timeout=120, check=True)
        print(f"chromium render: {shot} ({shot.stat().st_size / 1024:.0f} KiB) in {time.perf_counter() - t1:.1f} s")
    else:
        print("chromium not installed: render check skipped")
    if args.workdir:
        print(f"report: {out / 'report.html'}")
    else:
        shutil.rmtree(work, ignore_errors=True)
        print("(temporary run and report removed; pass --workdir DIR to keep them)")


if __name__ == "__main__":
    main()
