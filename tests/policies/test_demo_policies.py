"""Every policy runs on every budget of the embedded benchmark (small scale) without an invalid action or breach."""

from __future__ import annotations

import os

import pytest

from bapsql.budgets import LEVELS
from bapsql.env.conditions import CONDITIONS
from bapsql.policies.registry import policy_names

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def demo_tasks(tmp_path_factory):
    from bapsql.data.load import load_benchmark
    from bapsql.data.demo import build_demo

    mp = pytest.MonkeyPatch()
    mp.setenv("BAPSQL_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
    root = tmp_path_factory.mktemp("demo")
    build_demo(root, scale="small", seed=0, workers=min(2, os.cpu_count() or 1))
    tasks = load_benchmark(root, split="dev").tasks
    by_db: dict[str, list] = {}
    for t in tasks:
        by_db.setdefault(t.db_id, []).append(t)
    # a subset that covers every database of the split and every answer type
    subset = {t.task_id: t for ts in by_db.values() for t in ts[:4]}
    for kind in ("scalar", "list", "ordered_list"):
        extra = next((t for t in tasks if t.gold.kind == kind), None)
        if extra is not None:
            subset[extra.task_id] = extra
    yield list(subset.values())
    mp.undo()


NAMES = [*policy_names(), *(f"workflow.estimate_rewrite@{c}" for c in CONDITIONS if c != "shuffled_estimate"),
         *(f"scripted.drafter@{c}" for c in CONDITIONS if c != "shuffled_estimate"),
         "workflow.recover_after_rejection@no_abstention"]


@pytest.mark.parametrize("name", NAMES)
def test_policy_runs_every_budget_cleanly(play, demo_tasks, name):
    successes = 0
    for level in LEVELS:
        for task in demo_tasks:
            got = play(name, task, level)
            assert got.summary.invalid_actions == 0, (name, level, task.task_id, got.completions)
            assert not got.summary.breach and got.summary.feasible
            assert got.summary.terminated or got.summary.truncated
            successes += got.summary.success
    assert successes > 0
