"""Training-time (task, budget) sampling: every task once per epoch, budgets across the ladder, exact resume."""

import json
from collections import Counter

import pytest

from bapsql.errors import ConfigError
from bapsql.train.algo.sampler import TaskBudgetSampler

TASKS = [f"t{i}" for i in range(10)]
LEVELS = ("XS", "S", "M", "L")


def test_epochs_visit_every_task_once_and_budgets_cover_the_ladder():
    s = TaskBudgetSampler(TASKS, LEVELS, seed=3)
    first = s.draw(10)
    assert sorted(p.task_id for p in first) == sorted(TASKS)
    levels = Counter(p.level for p in s.draw(400))
    assert set(levels) == set(LEVELS) and min(levels.values()) > 60
    assert s.epoch >= 40


def test_resume_draws_the_same_prompts():
    a = TaskBudgetSampler(TASKS, LEVELS, seed=1)
    a.draw(13)
    state = json.loads(json.dumps(a.state_dict()))
    b = TaskBudgetSampler(TASKS, LEVELS, seed=99)
    b.load_state_dict(state)
    assert a.draw(25) == b.draw(25)


def test_weights_and_errors():
    s = TaskBudgetSampler(TASKS, LEVELS, weights=[1, 0, 0, 0], seed=0)
    assert {p.level for p in s.draw(30)} == {"XS"}
    with pytest.raises(ConfigError):
        TaskBudgetSampler([], LEVELS)
    with pytest.raises(ConfigError):
        TaskBudgetSampler(TASKS, LEVELS, weights=[1, 1])
    with pytest.raises(ConfigError):
        TaskBudgetSampler(TASKS, ("XS",)).load_state_dict(TaskBudgetSampler(TASKS, LEVELS).state_dict())
