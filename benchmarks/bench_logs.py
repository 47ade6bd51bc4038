"""Benchmark of the trajectory log writer and readers (bapsql/logs).

Writes a sweep-sized run through `TrajectoryWriter` (episodes with their turns, methods × budgets × seeds × tasks,
default flush size), then reads it back with `read_episodes` / `read_turns` (pandas, schema-conformed), DuckDB
(`read_parquet(..., hive_partitioning=1)`) and polars (`scan_parquet`), and prints rows/s, files and bytes.

    python benchmarks/bench_logs.py [--tasks 500] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bapsql.logs.reader import read_episodes, read_turns  # noqa: E402
from bapsql.logs.writer import TrajectoryWriter  # noqa: E402
from tests.logs._rows import episode_row, turn_rows  # noqa: E402

METHODS, BUDGETS, SEEDS = ("raw", "dashboard", "bap_sql_sft", "bap_sql_rl"), ("XS", "S", "M", "L"), (0, 1, 2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=500)
    ap.add_argument("--workdir", type=Path, default=None)
    args = ap.parse_args()
    root = args.workdir or Path(tempfile.mkdtemp(prefix="bench_logs_"))
    shutil.rmtree(root, ignore_errors=True)

    rows = [(e := episode_row("bench", m, b, s, t), turn_rows(e))
            for s in SEEDS for m in METHODS for b in BUDGETS for t in range(args.tasks)]
    n_ep, n_turns = len(rows), sum(len(t) for _, t in rows)
    t0 = time.perf_counter()
    with TrajectoryWriter(root, "bench") as w:
        for e, turns in rows:
            w.add_episode(e, turns)
    write_s = time.perf_counter() - t0
    files = list(root.rglob("part-*.parquet"))
    size = sum(f.stat().st_size for f in files)
    print(f"write: {n_ep} episodes + {n_turns} turns in {write_s:.2f} s "
          f"({(n_ep + n_turns) / write_s:,.0f} rows/s, validation included); {len(files)} files, {size / 2**20:.1f} MiB")

    t0 = time.perf_counter()
    ep, tu = read_episodes(root), read_turns(root)
    read_s = time.perf_counter() - t0
    assert len(ep) == n_ep and len(tu) == n_turns
    print(f"read_episodes + read_turns (pandas): {read_s:.2f} s ({(n_ep + n_turns) / read_s:,.0f} rows/s)")

    import duckdb
    t0 = time.perf_counter()
    got = duckdb.sql(f"SELECT method, budget, avg(success::INT) FROM read_parquet('{root}/episodes/**/*.parquet', "
                     "hive_partitioning=1) GROUP BY ALL").fetchall()
    print(f"duckdb success by method x budget: {len(got)} cells in {time.perf_counter() - t0:.2f} s")

    import polars as pl
    t0 = time.perf_counter()
    frame = pl.scan_parquet(f"{root}/turns/**/*.parquet", hive_partitioning=True).select(pl.len()).collect()
    print(f"polars count of turns: {frame.item()} in {time.perf_counter() - t0:.2f} s")
    if args.workdir is None:
        shutil.rmtree(root)


if __name__ == "__main__":
    main()
