"""Overhead of the runtime shield against plain apsw on a 1M-row database.

Builds ``orders`` (1,000,000 rows) and ``customers`` (10,000 rows) in a temporary folder, then runs each query
raw (a plain read-only apsw connection: no authorizer, no progress handler; fetchall, then every row rendered with
`bapsql.db.rows`) and shielded (`Shield.execute` with caps large enough never to truncate, tokens counted with the
packaged tokenizer), interleaved and alternating the order, for several repetitions. Prints per-query medians and
the median of the per-query ratios (target <= 1.10x).

    python benchmarks/bench_shield.py [--rows 1000000] [--reps 7] [--tokenizer default]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import apsw

from bapsql.db.rows import render_header, render_row
from bapsql.db.sandbox import Sandbox
from bapsql.db.shield import Caps, Shield
from bapsql.tokens import load_token_counter

QUERIES: dict[str, str] = {
    "selective_aggregate": "SELECT count(*), avg(amount) FROM orders WHERE customer_id = 4242",
    "group_by": "SELECT status, count(*), sum(amount) FROM orders GROUP BY status",
    "filtered_scan": "SELECT count(*) FROM orders WHERE amount > 990 AND status = 'shipped'",
    "join_group": "SELECT c.region, count(*), round(avg(o.amount), 2) FROM orders o "
    "JOIN customers c ON c.id = o.customer_id WHERE o.amount > 900 GROUP BY c.region",
    "top_k": "SELECT id, customer_id, amount FROM orders ORDER BY amount DESC LIMIT 10",
    "broad_limit_100": "SELECT * FROM orders LIMIT 100",
    "distinct_count": "SELECT count(DISTINCT customer_id) FROM orders",
    "having": "SELECT customer_id, count(*) FROM orders GROUP BY customer_id HAVING count(*) > 125",
    "month_range": "SELECT substr(created, 1, 7) AS month, count(*) FROM orders "
    "WHERE created >= '2023-06-01' GROUP BY month ORDER BY month",
    "in_subquery": "SELECT count(*) FROM orders WHERE customer_id IN (SELECT id FROM customers WHERE region = 'north')",
    "window_rank": "SELECT id, amount, rank() OVER (ORDER BY amount DESC) FROM orders WHERE customer_id = 77",
}
CAPS = Caps(vm_steps=10**9, result_tokens=10**9, rows=10**9, bytes=10**9)


def build(path: Path, n_rows: int) -> None:
    """Write the benchmark database (one transaction, recursive-CTE inserts)."""
    conn = apsw.Connection(str(path))
    conn.execute(
        f"""
        CREATE TABLE customers(id INTEGER PRIMARY KEY, name TEXT, region TEXT);
        CREATE TABLE orders(id INTEGER PRIMARY KEY, customer_id INTEGER, product_id INTEGER, amount REAL,
                            status TEXT, created TEXT);
        BEGIN;
        WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r WHERE x < 10000)
        INSERT INTO customers SELECT x, 'customer ' || x,
            CASE x % 4 WHEN 0 THEN 'north' WHEN 1 THEN 'south' WHEN 2 THEN 'east' ELSE 'west' END FROM r;
        WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r WHERE x < {n_rows})
        INSERT INTO orders SELECT x, 1 + (x * 7919) % 10000, 1 + (x * 104729) % 500,
            ((x * 2654435761) % 100000) / 100.0,
            CASE x % 5 WHEN 0 THEN 'pending' WHEN 1 THEN 'paid' WHEN 2 THEN 'shipped' WHEN 3 THEN 'delivered'
                       ELSE 'returned' END,
            date('2023-01-01', '+' || (x % 365) || ' days') FROM r;
        CREATE INDEX orders_customer ON orders(customer_id);
        COMMIT;
        """
    )
    conn.close()


def run_raw(conn: apsw.Connection, sql: str) -> int:
    cur = conn.cursor()
    cur.execute(sql)
    try:
        columns = [d[0] for d in cur.description]
    except apsw.ExecutionCompleteError:  # no rows at all
        return 0
    rows = cur.fetchall()
    text = [render_header(columns), *(render_row(r) for r in rows)]
    return len(text) - 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--tokenizer", default="default", help="token counter spec (default, regex or a path)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.db"
        t0 = time.perf_counter()
        build(path, args.rows)
        print(f"built {args.rows:,} rows in {time.perf_counter() - t0:.1f} s ({path.stat().st_size / 2**20:.0f} MiB)")
        raw = apsw.Connection(path.as_uri() + "?mode=ro", flags=apsw.SQLITE_OPEN_READONLY | apsw.SQLITE_OPEN_URI)
        shield = Shield(Sandbox(path), load_token_counter(args.tokenizer))
        times: dict[str, dict[str, list[float]]] = {q: {"raw": [], "shield": []} for q in QUERIES}
        for name, sql in QUERIES.items():  # warm the page cache and check both paths agree
            r = shield.execute(sql, CAPS)
            assert r.status == "ok", (name, r.status, r.message)
            assert run_raw(raw, sql) == len(r.rows), name
        for rep in range(args.reps):
            for name, sql in QUERIES.items():
                order = ("raw", "shield") if rep % 2 == 0 else ("shield", "raw")
                for kind in order:
                    t = time.perf_counter()
                    if kind == "raw":
                        run_raw(raw, sql)
                    else:
                        shield.execute(sql, CAPS)
                    times[name][kind].append(time.perf_counter() - t)
        ratios = []
        print(f"{'query':22s} {'raw ms':>9s} {'shield ms':>10s} {'ratio':>7s} {'VM steps':>12s} {'rows':>6s}")
        for name, sql in QUERIES.items():
            raw_ms = statistics.median(times[name]["raw"]) * 1e3
            sh_ms = statistics.median(times[name]["shield"]) * 1e3
            ratios.append(sh_ms / raw_ms)
            r = shield.execute(sql, CAPS)
            print(f"{name:22s} {raw_ms:9.2f} {sh_ms:10.2f} {sh_ms / raw_ms:6.3f}x {r.cost.vm_steps:12,d} "
                  f"{len(r.rows):6d}")
        print(f"median ratio {statistics.median(ratios):.3f}x over {len(QUERIES)} queries, {args.reps} reps "
              f"(tokenizer: {args.tokenizer}; target <= 1.10x)")


if __name__ == "__main__":
    main()
