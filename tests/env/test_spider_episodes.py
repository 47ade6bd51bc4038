"""Episodes over real Spider databases: executing the gold SQL and answering from the shown rows succeeds.

Skips cleanly when the Spider training data is absent (it lives outside the repository, in ../shared)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bapsql.budgets import get_budget
from bapsql.env.actions import AnswerAction, ExecuteQuery, render_action
from bapsql.env.scoring import answer_from_rows, is_ordered_sql
from bapsql.types import Task

SPIDER = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "spider_train"


def _tasks(n: int = 8) -> list[Task]:
    data = json.loads((SPIDER / "train_spider.json").read_text())
    out = []
    for i, item in enumerate(data[:: len(data) // n][:n]):
        db = SPIDER / "database" / item["db_id"] / f"{item['db_id']}.sqlite"
        if db.is_file():
            out.append(Task(f"spider-{i}", item["db_id"], str(db), item["question"], item["query"]))
    return out


@pytest.mark.skipif(not (SPIDER / "train_spider.json").is_file(), reason="Spider data not present in ../shared")
def test_gold_sql_then_answer_succeeds_on_spider(make_env):
    tasks = _tasks()
    if not tasks:
        pytest.skip("no Spider databases found")
    budget = get_budget("L")
    successes = complete = 0
    for task in tasks:
        env = make_env()
        env.reset(task, budget)
        r = env.step(render_action(ExecuteQuery(task.gold_sql)))
        if r.info["status"] != "ok":
            assert r.info["status"] in ("truncated", "rejected", "error")
            continue
        complete += 1
        block = env.evidence.get(r.info["evidence_ref"])
        pred = answer_from_rows(block.rows, ordered=is_ordered_sql(task.gold_sql))
        r = env.step(render_action(AnswerAction(pred.kind, pred.values, (block.ref,))))
        s = env.summary()
        assert r.terminated and s.feasible and not s.breach
        assert s.peak_context <= budget.context_tokens and s.result_tokens <= budget.result_tokens
        if s.success:
            successes += 1
            assert s.evidence_score == 0.75  # one complete visible block shows every value; no corroboration
    assert complete >= len(tasks) // 2
    assert successes == complete  # an untruncated gold result, answered as shown, is always correct
