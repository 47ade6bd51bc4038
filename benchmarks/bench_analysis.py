"""Benchmark of the offline analysis job at paper scale and beyond: the out-of-core scan against the old path.

Writes a synthetic run like a real one (1,523 tasks × 8 methods × 4 budgets × 3 seeds ≈ 146k episodes over 11
databases, plus a turns table of ~3 turns per episode, hive-partitioned Parquet, written one partition at a time so
any size fits), then runs the full analysis — 10,000 database-cluster bootstrap replicates for every pairwise
comparison (8 methods → 28 pairs × XS/S/M/L) — in a fresh child process per path and size, and prints wall time,
phase times and peak resident memory of the child, imports included. Peak memory is the child's own ``VmHWM``
(``/proc/self/status``), not ``ru_maxrss``: Linux carries a parent's peak RSS into a spawned child's
``ru_maxrss`` across ``exec``, so a child spawned by a parent that had just written 1.9 GiB of Parquet reported the
parent's ~2 GiB. The synthetic run is written in a child process of its own, for the same reason. Paths:

- ``new``: `analyze_runs` — the Parquet scan into per-cluster aggregates (`bapsql.analysis.scan`);
- ``old``: `load_runs` (every episode and turn in pandas) + the per-episode reference
  (`bapsql.analysis.source.EpisodeSource`) + the same report writer: the analysis before issue 33.

With both paths at a size, their ``summary.json`` files are compared (every number to 1e-9 relative). Several
``--tasks`` sizes run in one invocation, and the end prints the issue-33 ratios: new peak RSS at the largest size ÷
at the smallest, and new ÷ old wall time at each size both ran. The old path is skipped above
``--old-max-episodes`` (it holds every episode and turn in memory). When chromium is installed the first new report
is rendered headless.

    python benchmarks/bench_analysis.py [--tasks 1523 152300] [--path both|new|old] [--replicates 10000]
                                        [--old-max-episodes 2000000] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import json
import math
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
SEEDS = (0, 1, 2)


def _child(run: str, out: str, path: str, replicates: int) -> None:
    start = time.perf_counter()
    phases: list[tuple[str, float]] = []

    def progress(message: str) -> None:
        phases.append((message, time.perf_counter() - start))

    if path == "new":
        from bapsql.analysis.analyze import analyze_runs

        summary = analyze_runs([run], out, replicates=replicates, seed=0, progress=progress)
    else:
        from bapsql.analysis.analyze import summarize_source, write_report
        from bapsql.analysis.load import load_runs
        from bapsql.analysis.source import EpisodeSource

        progress("loading 1 run(s) into pandas")
        source = EpisodeSource(load_runs([run]))
        summary = write_report(summarize_source(source, replicates=replicates, seed=0, progress=progress), out,
                               progress=progress)
    wall = time.perf_counter() - start
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime, "phases": phases,
                      "comparisons": len(summary.comparisons), "episodes": summary.episodes,
                      "maxrss_mb": peak_rss_mb()}))


def peak_rss_mb() -> float:
    """This process's own peak resident memory in MiB: ``VmHWM`` of its address space (Linux), which starts afresh
    at ``exec``; elsewhere ``ru_maxrss`` (which on Linux would include the spawning parent's peak)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return maxrss / 2**20 if sys.platform == "darwin" else maxrss / 1024


def _write(run: Path, tasks: int) -> tuple[int, int]:
    """Write the synthetic run in a child process (the parent stays small; see the module docstring)."""
    proc = subprocess.run([sys.executable, __file__, "--write", str(run), str(tasks)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"writing the synthetic run failed:\n{proc.stderr[-4000:]}")
    episodes, turns = json.loads(proc.stdout.strip().splitlines()[-1])
    return episodes, turns


def _write_here(run: Path, tasks: int) -> tuple[int, int]:
    from bapsql.analysis.synthetic import SyntheticSpec, write_synthetic_run

    tokens = {m: dict(zip(LADDER, TOKENS)) for m in TABLE2}
    tokens["BAP-SQL RL"] = dict(zip(LADDER, (TOKENS[0] * 0.955, TOKENS[1] * 0.95, TOKENS[2] * 0.97, TOKENS[3])))
    spec = SyntheticSpec(
        success={m: {lv: v / 100 for lv, v in zip(LADDER, cells)} for m, cells in TABLE2.items()},
        tokens=tokens, n_tasks=tasks, n_databases=11, seeds=SEEDS, turns_per_episode=3.0,
    )
    shutil.rmtree(run, ignore_errors=True)
    return write_synthetic_run(run, spec)


def _max_difference(a: object, b: object, path: str = "") -> tuple[float, str]:
    """Largest relative difference between two summary.json documents (inf where their structure differs)."""
    if isinstance(a, dict) and isinstance(b, dict):
        if list(a) != list(b):
            return math.inf, path
        return max((_max_difference(a[k], b[k], f"{path}/{k}") for k in a), default=(0.0, path))
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return math.inf, path
        return max((_max_difference(x, y, f"{path}[{i}]") for i, (x, y) in enumerate(zip(a, b))), default=(0.0, path))
    if isinstance(a, float) and isinstance(b, (int, float)) or isinstance(b, float) and isinstance(a, (int, float)):
        return abs(a - b) / max(1.0, abs(a), abs(b)), path
    return (0.0 if a == b else math.inf), path


def _run_child(run: Path, out: Path, path: str, replicates: int) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--child", str(run), str(out), path, "--replicates",
                           str(replicates)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{path} analysis failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, nargs="+", default=[1523], help="task counts (sizes) to run, in order")
    ap.add_argument("--path", choices=("both", "new", "old"), default="both")
    ap.add_argument("--replicates", type=int, default=10_000)
    ap.add_argument("--old-max-episodes", type=int, default=2_000_000,
                    help="skip the old path above this many episodes (it holds them all in memory)")
    ap.add_argument("--workdir", default=None, help="keep the runs and reports here (default: a temp dir)")
    ap.add_argument("--child", nargs=3, metavar=("RUN", "OUT", "PATH"), help=argparse.SUPPRESS)
    ap.add_argument("--write", nargs=2, metavar=("RUN", "TASKS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.write:
        print(json.dumps(_write_here(Path(args.write[0]), int(args.write[1]))))
        return
    if args.child:
        _child(*args.child, args.replicates)
        return

    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="bench_analysis_"))
    results: dict[tuple[int, str], dict] = {}
    rendered = False
    for tasks in args.tasks:
        run = work / f"run-{tasks}"
        t0 = time.perf_counter()
        episodes, turns = _write(run, tasks)
        size_mb = sum(f.stat().st_size for f in run.rglob("*.parquet")) / 2**20
        print(f"\n== {tasks:,} tasks: {episodes:,} episodes, {turns:,} turns, {len(TABLE2)} methods × 4 budgets × "
              f"{len(SEEDS)} seeds, 11 databases; {size_mb:.1f} MiB Parquet written in "
              f"{time.perf_counter() - t0:.1f} s")
        paths = ["new", "old"] if args.path == "both" else [args.path]
        for path in paths:
            if path == "old" and episodes > args.old_max_episodes:
                print(f"old path skipped: {episodes:,} episodes > --old-max-episodes {args.old_max_episodes:,}")
                continue
            res = _run_child(run, work / f"report-{tasks}-{path}", path, args.replicates)
            results[(tasks, path)] = res
            print(f"[{path}] {res['wall_s']:.2f} s wall ({res['cpu_s']:.2f} s CPU incl. imports) for "
                  f"{res['episodes']:,} episodes, {res['comparisons']} paired comparisons × {args.replicates:,} "
                  f"replicates; peak RSS {res['maxrss_mb']:.0f} MiB")
            # the scan's progress lines ("scanning episodes: 3/32 ...") belong to the loading phase
            marks = [m for m in res["phases"] if not m[0].startswith("scanning")] + [["done", res["wall_s"]]]
            for (message, t), (_, t_next) in zip(marks, marks[1:]):
                print(f"  {t_next - t:6.2f} s  {message}")
        if (tasks, "new") in results and (tasks, "old") in results:
            docs = [json.loads((work / f"report-{tasks}-{p}" / "summary.json").read_text()) for p in ("new", "old")]
            diff, where = _max_difference(*docs)
            print(f"summary.json new vs old: largest relative difference {diff:.2e}"
                  + (f" at {where}" if diff else "") + (" — EQUAL to 1e-9" if diff <= 1e-9 else " — DIFFERENT"))
        if (tasks, "new") in results and not rendered:
            rendered = _render(work, work / f"report-{tasks}-new")
        if not args.workdir:
            shutil.rmtree(run, ignore_errors=True)

    print("\n| episodes | path | wall time | peak RSS |\n|---|---|---|---|")
    for (tasks, path), res in results.items():
        print(f"| {res['episodes']:,} | {path} | {res['wall_s']:.1f} s | {res['maxrss_mb']:,.0f} MiB |")
    sizes = [t for t in args.tasks if (t, "new") in results]
    if len(sizes) > 1:
        small, large = results[(min(sizes), "new")], results[(max(sizes), "new")]
        print(f"new peak RSS at {large['episodes']:,} ÷ at {small['episodes']:,} episodes: "
              f"{large['maxrss_mb'] / small['maxrss_mb']:.2f} (target ≤ 2)")
    for tasks in args.tasks:
        if (tasks, "new") in results and (tasks, "old") in results:
            new, old = results[(tasks, "new")], results[(tasks, "old")]
            print(f"new ÷ old wall time at {new['episodes']:,} episodes: {new['wall_s'] / old['wall_s']:.2f} "
                  f"(target ≤ 1.2); peak RSS {new['maxrss_mb']:.0f} vs {old['maxrss_mb']:.0f} MiB")
    if args.workdir:
        print(f"runs and reports: {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
        print("(temporary runs and reports removed; pass --workdir DIR to keep them)")


def _render(work: Path, out: Path) -> bool:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if not chromium:
        print("chromium not installed: render check skipped")
        return True
    shot = work / "report.png"
    t1 = time.perf_counter()
    subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                    "--disable-background-networking", "--disable-component-update", "--disable-sync",
                    f"--user-data-dir={work / 'chromium-profile'}", f"--screenshot={shot}",
                    "--window-size=1280,2000", (out / "report.html").as_uri()],
                   capture_output=True, timeout=120, check=True)
    print(f"chromium render: {shot} ({shot.stat().st_size / 1024:.0f} KiB) in {time.perf_counter() - t1:.1f} s")
    return True


if __name__ == "__main__":
    main()
