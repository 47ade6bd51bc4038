"""Cost of the episode environment on top of the shield, and scripted-episode throughput.

Builds ``orders`` (N rows, default 200,000) and ``customers`` (10,000 rows) in a temporary folder. For each query,
times (interleaved, several repetitions) a bare `Shield.execute` against one full ``execute_query`` turn of a fresh
episode under a probe budget (L's context, queries and result tokens; 10^9 VM steps so every query runs), with the
same caps (parse, internal estimate, preflight, shielded execution, evidence
block, rendering, context fitting and token accounting), and prints the per-query medians and the added time.
Then times a scripted five-action episode (estimate → rewrite → execute → compress → answer) at each budget
level.

    python benchmarks/bench_env.py [--rows 200000] [--reps 7] [--tokenizer default]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import apsw

from bapsql.budgets import Budget, load_ladder
from bapsql.db.handle import default_counter
from bapsql.env.actions import AnswerAction, EstimateQuery, ExecuteQuery, ManageEvidence, RewriteQuery, render_action
from bapsql.env.episode import BudgetedSQLEnv
from bapsql.env.handles import DatabaseHandles
from bapsql.tokens import load_token_counter
from bapsql.types import Task

QUERIES: dict[str, str] = {
    "point_aggregate": "SELECT count(*), avg(amount) FROM orders WHERE customer_id = 4242",
    "group_by": "SELECT status, count(*) FROM orders GROUP BY status",
    "filtered_scan": "SELECT count(*) FROM orders WHERE amount > 990 AND status = 'shipped'",
    "join_group": "SELECT c.region, count(*) FROM orders o JOIN customers c ON c.id = o.customer_id "
    "WHERE o.amount > 900 GROUP BY c.region",
    "top_k": "SELECT id, amount FROM orders ORDER BY amount DESC LIMIT 10",
    "broad_truncated": "SELECT * FROM orders WHERE customer_id < 50",
}


def build(path: Path, n_rows: int) -> None:
    conn = apsw.Connection(str(path))
    conn.execute(
        f"""
        CREATE TABLE customers(id INTEGER PRIMARY KEY, name TEXT, region TEXT);
        CREATE TABLE orders(id INTEGER PRIMARY KEY, customer_id INTEGER, amount REAL, status TEXT);
        BEGIN;
        WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r WHERE x < 10000)
        INSERT INTO customers SELECT x, 'customer ' || x,
            CASE x % 4 WHEN 0 THEN 'north' WHEN 1 THEN 'south' WHEN 2 THEN 'east' ELSE 'west' END FROM r;
        WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r WHERE x < {n_rows})
        INSERT INTO orders SELECT x, 1 + (x * 7919) % 10000, ((x * 2654435761) % 100000) / 100.0,
            CASE x % 4 WHEN 0 THEN 'pending' WHEN 1 THEN 'paid' WHEN 2 THEN 'shipped' ELSE 'returned' END FROM r;
        CREATE INDEX orders_customer ON orders(customer_id);
        COMMIT;
        """
    )
    conn.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--tokenizer", default="default")
    args = ap.parse_args()
    counter = default_counter() if args.tokenizer == "default" else load_token_counter(args.tokenizer)
    ladder = load_ladder()
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "orders.sqlite"
        build(db, args.rows)
        handles = DatabaseHandles(counter, cache_dir=Path(tmp) / "cache")
        env = BudgetedSQLEnv(token_counter=counter, handles=handles)
        task = Task("bench", "orders", str(db), "How many orders are there?", "SELECT count(*) FROM orders")
        probe = Budget("probe", context_tokens=11_000, queries=8, result_tokens=2_500, vm_steps=10**9, turns=14)
        xs = probe
        env.reset(task, xs)  # warm: catalog built and cached, connections open
        handle = handles.get(db)
        print(f"rows={args.rows:,} reps={args.reps} tokenizer={counter.name}")
        print(f"{'query':<18} {'shield ms':>10} {'env turn ms':>12} {'added ms':>9} {'status':>10}")
        added = []
        for name, sql in QUERIES.items():
            shield_t, env_t = [], []
            status = ""
            for rep in range(args.reps):
                for which in ((0, 1) if rep % 2 == 0 else (1, 0)):
                    if which == 0:
                        env.reset(task, xs)
                        env.step("")  # an invalid action of a completion's size, so the caps below match the turn's
                        caps = env.ledger.caps(context_reserve=env._exec_framing(4))
                        t0 = time.perf_counter()
                        handle.shield.execute(sql, caps)
                        shield_t.append(time.perf_counter() - t0)
                    else:
                        env.reset(task, xs)
                        text = render_action(ExecuteQuery(sql))
                        t0 = time.perf_counter()
                        r = env.step(text)
                        env_t.append(time.perf_counter() - t0)
                        status = r.info["status"]
            s, e = statistics.median(shield_t) * 1e3, statistics.median(env_t) * 1e3
            added.append(e - s)
            print(f"{name:<18} {s:>10.2f} {e:>12.2f} {e - s:>9.2f} {status:>10}")
        print(f"median added time per execute_query turn: {statistics.median(added):.2f} ms")
        script = [
            EstimateQuery("SELECT * FROM orders WHERE customer_id < 50"),
            RewriteQuery("SELECT count(*) FROM orders WHERE customer_id < 50", "aggregate"),
            ExecuteQuery("SELECT count(*) FROM orders WHERE customer_id < 50"),
            ManageEvidence("compress", "E1"),
            AnswerAction("scalar", (980,), ("E1",)),
        ]
        texts = [render_action(a) for a in script]
        for budget in ladder.budgets:
            times = []
            for _ in range(args.reps):
                t0 = time.perf_counter()
                env.reset(task, budget)
                for t in texts:
                    if env.done:
                        break
                    env.step(t)
                times.append(time.perf_counter() - t0)
            med = statistics.median(times)
            print(f"scripted 5-action episode at {budget.level}: {med * 1e3:.1f} ms median "
                  f"({1 / med:.0f} episodes/s), turns={env.ledger.turns}")
        handles.close()


if __name__ == "__main__":
    main()
