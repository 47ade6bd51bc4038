"""One-shot gold SQL through the real environment on Spider training tasks, per budget level.

For a deterministic sample of /work/shared/data/spider_train (every k-th task), each episode executes the task's gold
SQL once, then answers with the shown rows typed by `answer_from_rows` citing the block (abstains when nothing was
shown). It measures how often the budget alone (truncation by result tokens / rows, VM-step caps, preflight
rejections) stops an agent that writes perfect SQL — the ceiling of a one-shot policy — and checks the audit:
zero breaches. Prints per level: episodes, budgeted successes, shield statuses, failure kinds, breaches.

    python benchmarks/spider_oneshot.py [--n 200] [--tokenizer default]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections import Counter
from pathlib import Path

from bapsql.budgets import load_ladder
from bapsql.db.handle import default_counter
from bapsql.env.actions import Abstain, AnswerAction, ExecuteQuery, render_action
from bapsql.env.episode import BudgetedSQLEnv
from bapsql.env.handles import DatabaseHandles
from bapsql.env.scoring import answer_from_rows, is_ordered_sql
from bapsql.tokens import load_token_counter
from bapsql.types import Task

SPIDER = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "spider_train"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=200, help="tasks sampled (every k-th of train_spider.json)")
    ap.add_argument("--tokenizer", default="default")
    args = ap.parse_args()
    if not (SPIDER / "train_spider.json").is_file():
        raise SystemExit(f"Spider data not found at {SPIDER}")
    data = json.loads((SPIDER / "train_spider.json").read_text())
    items = data[:: max(1, len(data) // args.n)][: args.n]
    tasks = []
    for i, it in enumerate(items):
        db = SPIDER / "database" / it["db_id"] / f"{it['db_id']}.sqlite"
        if db.is_file():
            tasks.append(Task(f"spider-{i}", it["db_id"], str(db), it["question"], it["query"]))
    counter = default_counter() if args.tokenizer == "default" else load_token_counter(args.tokenizer)
    with tempfile.TemporaryDirectory() as tmp:
        handles = DatabaseHandles(counter, cache_dir=Path(tmp))
        env = BudgetedSQLEnv(token_counter=counter, handles=handles)
        t0 = time.perf_counter()
        print(f"tasks={len(tasks)} tokenizer={counter.name}")
        for budget in load_ladder().budgets:
            statuses, failures = Counter(), Counter()
            success = breaches = 0
            for task in tasks:
                env.reset(task, budget)
                r = env.step(render_action(ExecuteQuery(task.gold_sql)))
                statuses[r.info["status"]] += 1
                if not env.done:
                    ref = r.info["evidence_ref"]
                    if ref:
                        block = env.evidence.get(ref)
                        a = answer_from_rows(block.rows, ordered=is_ordered_sql(task.gold_sql))
                        env.step(render_action(AnswerAction(a.kind, a.values, (ref,))))
                    else:
                        env.step(render_action(Abstain("nothing was shown")))
                s = env.summary()
                success += s.success
                breaches += s.breach
                failures[s.failure or "success"] += 1
            print(f"{budget.level}: success {success}/{len(tasks)} ({100 * success / len(tasks):.1f}%) "
                  f"statuses {dict(statuses)} failures {dict(failures)} breaches {breaches}")
        print(f"wall {time.perf_counter() - t0:.1f} s for {4 * len(tasks)} episodes")
        handles.close()


if __name__ == "__main__":
    main()
