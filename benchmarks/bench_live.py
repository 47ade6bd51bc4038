"""Episodes per second on a database another process inserts into (100 rows/s) against the same database idle.

For each journal mode (WAL, rollback/DELETE) it builds ``orders`` (``--rows`` rows) and ``customers`` (2,000 rows),
then plays scripted episodes through the real environment (`BudgetedSQLEnv` with warm `DatabaseHandles`: reset,
two execute_query turns — a selective aggregate and a join with GROUP BY — and an answer) in alternating blocks of
``--seconds`` seconds: idle, live (a writer process inserting ``--rate`` rows/s, one transaction each), idle, live,
... (``--blocks`` pairs), so both conditions see the same machine noise. Reports per condition the median
episodes/s over blocks, their ratio, the rate the writer actually achieved (rows committed / block time: a
rollback-journal writer must wait while an episode holds its snapshot), busy rejections, the largest turn wait and
the catalog rebuilds logged.

    python benchmarks/bench_live.py [--rows 200000] [--seconds 8] [--blocks 3] [--rate 100]
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

import apsw

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' writer process

from bapsql.budgets import get_budget  # noqa: E402
from bapsql.env.actions import AnswerAction, ExecuteQuery, render_action
from bapsql.env.episode import BudgetedSQLEnv
from bapsql.env.handles import DatabaseHandles
from bapsql.env.records import EnvOptions
from bapsql.tokens import RegexTokenCounter
from bapsql.types import Task
from tests.db.writers import inserter  # noqa: E402  (the tests' writer process)

ORDERS_INSERT = "INSERT INTO orders(customer_id, amount, status) VALUES (1 + :n % 2000, :n % 997, 'live')"
QUERIES = (
    "SELECT count(*), round(avg(amount), 2) FROM orders WHERE customer_id = 42",
    "SELECT c.region, count(*) FROM orders o JOIN customers c ON c.id = o.customer_id "
    "WHERE o.amount > 900 GROUP BY c.region",
)


class _Count(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.rebuilds = 0

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        self.rebuilds += "rebuilt" in msg or "reopening" in msg


def build(path: Path, rows: int, wal: bool) -> None:
    # apsw, not stdlib sqlite3, for in-process access: a second SQLite library closing its file on the database would
    # drop the POSIX locks the environment's (apsw) connections hold on it.
    con = apsw.Connection(str(path))
    con.execute(f"PRAGMA journal_mode={'WAL' if wal else 'DELETE'}").fetchall()
    con.execute(f"""
        CREATE TABLE customers(id INTEGER PRIMARY KEY, name TEXT, region TEXT);
        CREATE TABLE orders(id INTEGER PRIMARY KEY, customer_id INTEGER, amount REAL, status TEXT);
        CREATE INDEX ix_orders_customer ON orders(customer_id);
        WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r WHERE x < 2000)
        INSERT INTO customers SELECT x, 'customer ' || x, CASE x % 4 WHEN 0 THEN 'north' WHEN 1 THEN 'south'
            WHEN 2 THEN 'east' ELSE 'west' END FROM r;
        WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r WHERE x < {rows})
        INSERT INTO orders SELECT x, 1 + (x * 7919) % 2000, ((x * 2654435761) % 100000) / 100.0,
            CASE x % 3 WHEN 0 THEN 'paid' WHEN 1 THEN 'shipped' ELSE 'done' END FROM r;
    """).fetchall()
    if wal:  # start from a checkpointed, empty WAL, as a database that has been in use for a while
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    con.close()


def max_id(path: Path) -> int:
    con = apsw.Connection(str(path))
    con.set_busy_timeout(30_000)
    try:
        return con.execute("SELECT max(id) FROM orders").fetchall()[0][0]
    finally:
        con.close()


def play(env: BudgetedSQLEnv, task: Task, budget) -> tuple[bool, float]:
    """One episode; (any busy rejection, largest turn wait)."""
    env.reset(task, budget)
    for sql in QUERIES:
        env.step(render_action(ExecuteQuery(sql)))
    env.step(render_action(AnswerAction("scalar", (0,), ("E1",))))
    recs = env.turn_records
    return any("busy" in r.message for r in recs), max(r.db_wait_s for r in recs)


def block(env, task, budget, seconds: float) -> tuple[int, int, float]:
    n = busy = 0
    worst = 0.0
    t_end = time.perf_counter() + seconds
    while time.perf_counter() < t_end:
        b, w = play(env, task, budget)
        n += 1
        busy += b
        worst = max(worst, w)
    return n, busy, worst


def run_mode(tmp: Path, wal: bool, args) -> dict:
    db = tmp / f"live_{'wal' if wal else 'rollback'}.sqlite"
    build(db, args.rows, wal)
    counter = RegexTokenCounter()
    handles = DatabaseHandles(counter, cache_dir=tmp / "cache")
    env = BudgetedSQLEnv(token_counter=counter, handles=handles, options=EnvOptions(busy_timeout_s=3.0))
    task = Task(task_id="bench", db_id=db.stem, db_path=str(db), question="bench", gold_sql=QUERIES[0])
    budget = get_budget("L")
    play(env, task, budget)  # warm: catalog built, handle open
    counter_log = _Count()
    logging.getLogger("bapsql").addHandler(counter_log)
    logging.getLogger("bapsql").setLevel(logging.INFO)
    rates = {"idle": [], "live": []}
    writer_rates, busy_total, worst = [], 0, 0.0
    try:
        for _ in range(args.blocks):
            n, b, w = block(env, task, budget, args.seconds)
            rates["idle"].append(n / args.seconds)
            before = max_id(db)
            proc = inserter(db, args.rate, ORDERS_INSERT)
            t0 = time.perf_counter()
            n, b, w = block(env, task, budget, args.seconds)
            proc.kill()
            proc.wait()
            proc.stdout.close()
            writer_rates.append((max_id(db) - before) / (time.perf_counter() - t0))
            rates["live"].append(n / args.seconds)
            busy_total += b
            worst = max(worst, w)
    finally:
        logging.getLogger("bapsql").removeHandler(counter_log)
        handles.close()
    idle, live = statistics.median(rates["idle"]), statistics.median(rates["live"])
    return {"mode": "WAL" if wal else "rollback", "idle": idle, "live": live, "ratio": live / idle,
            "writer": statistics.median(writer_rates), "busy": busy_total, "worst_wait": worst,
            "rebuilds": counter_log.rebuilds}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--blocks", type=int, default=3)
    ap.add_argument("--rate", type=float, default=100.0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        results = [run_mode(Path(d), wal, args) for wal in (True, False)]
    print(f"orders rows: {args.rows:,}; blocks: {args.blocks} x ({args.seconds:g} s idle + {args.seconds:g} s live); "
          f"writer target {args.rate:g} inserts/s")
    print(f"{'mode':9s} {'idle ep/s':>10s} {'live ep/s':>10s} {'live/idle':>10s} {'writer rows/s':>14s} "
          f"{'busy':>5s} {'max wait s':>11s} {'rebuilds':>9s}")
    for r in results:
        print(f"{r['mode']:9s} {r['idle']:10.1f} {r['live']:10.1f} {r['ratio']:10.2f} {r['writer']:14.1f} "
              f"{r['busy']:5d} {r['worst_wait']:11.3f} {r['rebuilds']:9d}")


if __name__ == "__main__":
    main()
