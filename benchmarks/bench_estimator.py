"""Estimator cost vs execution cost on a synthetic database with a 1M-row table (benchmarks/RESULTS.md, "Estimator").

Builds (once, in a temporary folder) ``events`` (1,000,000 rows, skewed columns, two indexes) and ``users`` (50,000
rows), builds the catalog (timed), then for each query measures the wall time of `Estimator.estimate` (check, plan,
LIMIT 0 probe, analysis, bytecode model; analysis cache cleared each time) and of a full uncapped read-only
execution, best of ``--repeat`` runs each. Prints one line per query and the median estimate/execution ratio over
queries that run >= 10 ms (target <= 5%), plus p50/p95 against the actual rows and VM steps.

    python benchmarks/bench_estimator.py [--rows 1000000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import apsw

from bapsql.db.calibration import load_calibration
from bapsql.db.catalog import build_catalog
from bapsql.db.handle import default_counter, open_database

QUERIES = [
    "SELECT count(*) FROM events",
    "SELECT count(*) FROM events WHERE kind = 'view'",
    "SELECT kind, count(*) FROM events GROUP BY kind",
    "SELECT user_id, sum(amount) FROM events GROUP BY user_id ORDER BY 2 DESC LIMIT 10",
    "SELECT avg(amount) FROM events WHERE ts BETWEEN 100000 AND 300000",
    "SELECT * FROM events WHERE user_id = 4242",
    "SELECT id, amount FROM events ORDER BY amount DESC LIMIT 20",
    "SELECT count(DISTINCT user_id) FROM events WHERE kind = 'buy'",
    "SELECT u.country, count(*) FROM events e JOIN users u ON u.id = e.user_id WHERE e.kind = 'buy' GROUP BY u.country",
    "SELECT u.name, e.amount FROM events e JOIN users u ON u.id = e.user_id WHERE e.amount > 990",
    "SELECT kind, max(ts) FROM events WHERE note LIKE 'n1%' GROUP BY kind",
    "SELECT count(*) FROM events WHERE user_id IN (SELECT id FROM users WHERE country = 'FR')",
    "WITH big AS (SELECT user_id, count(*) AS n FROM events GROUP BY user_id) SELECT count(*) FROM big WHERE n > 25",
    "SELECT DISTINCT kind FROM events WHERE amount < 1",
]


def build(path: Path, rows: int) -> None:
    conn = apsw.Connection(str(path))
    conn.execute(
        """
        PRAGMA journal_mode = OFF; PRAGMA synchronous = OFF;
        CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT NOT NULL, country TEXT);
        CREATE TABLE events (id INTEGER PRIMARY KEY, user_id INTEGER REFERENCES users(id), kind TEXT, amount REAL,
                             ts INTEGER, note TEXT);
        BEGIN;
        WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 50000)
        INSERT INTO users SELECT x, 'user' || x,
            CASE x % 10 WHEN 0 THEN 'FR' WHEN 1 THEN 'DE' WHEN 2 THEN 'DE' ELSE 'US' END FROM c;
        """
    ).fetchall()
    conn.execute(
        f"""
        WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < {rows})
        INSERT INTO events SELECT x,
            1 + ((x * 2654435761) % 1000003) % 50000 * ((x % 7) + 1) % 50000,
            CASE WHEN x % 100 < 70 THEN 'view' WHEN x % 100 < 90 THEN 'click' WHEN x % 100 < 98 THEN 'cart'
                 ELSE 'buy' END,
            ((x * 40503) % 100000) / 100.0,
            x / 3,
            'n' || ((x * 7919) % 10007)
        FROM c;
        COMMIT;
        CREATE INDEX events_user ON events(user_id);
        CREATE INDEX events_kind ON events(kind);
        """
    ).fetchall()
    conn.close()


def best(fn, repeat: int) -> tuple[float, object]:
    out, times = None, []
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return min(times), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "bench.sqlite"
        t0 = time.perf_counter()
        build(db, args.rows)
        print(f"built {args.rows:,}-row table in {time.perf_counter() - t0:.1f} s")
        t0 = time.perf_counter()
        build_catalog(db)
        print(f"catalog build: {time.perf_counter() - t0:.2f} s (uncached)")
        h = open_database(db, token_counter=default_counter(), calibration=load_calibration(), cache_dir=Path(tmp))
        ratios = []
        print(f"{'est ms':>8} {'exec ms':>9} {'ratio':>7} {'rows p50/p95/actual':>28} {'VM p50/p95/actual':>36}  query")
        for sql in QUERIES:
            def run_est():
                h.estimator._cache.clear()
                return h.estimator.estimate(sql, vm_step_cap=10**12)
            t_est, est = best(run_est, args.repeat)
            t_exe, res = best(lambda: h.sandbox.query(sql, vm_step_cap=None, max_rows=0), args.repeat)
            ratio = t_est / t_exe
            if t_exe >= 0.010:
                ratios.append(ratio)
            rows = f"{est.rows.p50:,.0f}/{est.rows.p95:,.0f}/{res.rows_total:,}"
            vm = f"{est.vm_steps.p50:,.0f}/{est.vm_steps.p95:,.0f}/{res.vm_steps:,}"
            print(f"{1e3 * t_est:8.2f} {1e3 * t_exe:9.1f} {100 * ratio:6.1f}% {rows:>28} {vm:>36}  {sql[:70]}")
        h.close()
        if ratios:
            print(f"\nmedian estimate/execution over {len(ratios)} queries running >= 10 ms: "
                  f"{100 * statistics.median(ratios):.2f}% (target <= 5%)")


if __name__ == "__main__":
    main()
