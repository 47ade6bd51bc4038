"""Database-level splits: disjoint, complete, reproducible from the seed, stable when databases are added."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bapsql.data.splits import SPLIT_NAMES, TEST_FRACTION, is_test_task, split_databases
from bapsql.errors import ConfigError

db_lists = st.lists(st.text("abcdefghij_", min_size=1, max_size=8), min_size=0, max_size=40, unique=True)


@given(db_lists, st.integers(0, 10_000))
@settings(max_examples=150)
def test_disjoint_complete_and_reproducible(dbs, seed):
    s = split_databases(dbs, seed=seed)
    assert set(s) == set(SPLIT_NAMES)
    assigned = [d for name in SPLIT_NAMES for d in s[name]]
    assert sorted(assigned) == sorted(dbs)  # every database exactly once
    assert split_databases(list(reversed(dbs)), seed=seed) == s  # input order does not matter
    if len(dbs) >= 3:
        assert all(s[name] for name in SPLIT_NAMES)


@given(db_lists, st.integers(0, 99))
def test_split_follows_the_seeded_hash_order(dbs, seed):
    """dev takes the first databases in SHA-256 order, validation the next, train the rest: so a database keeps its
    split when others are added unless it sits at a boundary."""
    s = split_databases(dbs, seed=seed)
    order = sorted(dbs, key=lambda d: hashlib.sha256(f"{seed}:{d}".encode()).hexdigest())
    n_dev, n_val = len(s["dev"]), len(s["validation"])
    assert set(order[:n_dev]) == set(s["dev"])
    assert set(order[n_dev:n_dev + n_val]) == set(s["validation"])
    assert set(order[n_dev + n_val:]) == set(s["train"])


def test_seed_changes_the_split_and_fixed_assignments_hold():
    dbs = [f"db{i}" for i in range(30)]
    assert split_databases(dbs, seed=0) != split_databases(dbs, seed=1)
    s = split_databases(dbs, seed=0, fractions=(0.85, 0.15, 0.0), fixed={"db0": "dev", "db1": "dev"})
    assert s["dev"] == ("db0", "db1")
    assert len(s["validation"]) == 4 and len(s["train"]) == 24
    counts = {k: len(v) for k, v in split_databases(dbs, seed=3).items()}
    assert counts == {"train": 18, "validation": 6, "dev": 6}


def test_bad_arguments_are_config_errors():
    with pytest.raises(ConfigError):
        split_databases(["a"], fractions=(1.0, -0.1, 0.1))
    with pytest.raises(ConfigError, match="unknown split"):
        split_databases(["a"], fixed={"a": "test"})


@given(st.lists(st.text("abcdef-0123456789", min_size=1, max_size=10), max_size=60, unique=True),
       st.integers(0, 1_000))
@settings(max_examples=100)
def test_test_membership_depends_only_on_task_and_seed(task_ids, seed):
    alone = {t: is_test_task(t, seed) for t in task_ids}
    assert alone == {t: is_test_task(t, seed) for t in reversed(task_ids)}
    assert all(not is_test_task(t, seed, 0.0) and is_test_task(t, seed, 1.0) for t in task_ids)


def test_test_fraction_is_about_right_and_seeded():
    ids = [f"db-{i:04d}" for i in range(4000)]
    share = sum(is_test_task(t, 0) for t in ids) / len(ids)
    assert abs(share - TEST_FRACTION) < 0.03
    assert [is_test_task(t, 0) for t in ids] != [is_test_task(t, 1) for t in ids]
    with pytest.raises(ConfigError, match="test fraction"):
        is_test_task("x", 0, 1.5)


def test_augmented_tasks_stay_on_the_split_databases_and_never_repeat_excluded_questions(demo_small):
    from bapsql.data.augment import augment_tasks, normalise
    from bapsql.data.tasks import load_tasks

    test = load_tasks(demo_small, "test")
    aug = augment_tasks(demo_small, "train", 1, exclude=test)
    assert aug and {t.db_id for t in aug} <= {t.db_id for t in load_tasks(demo_small, "train")}
    banned = {normalise(t.question) for t in test}
    assert not any(normalise(t.question) in banned for t in aug)
    assert len({t.task_id for t in aug}) == len(aug) == len({normalise(t.question) for t in aug})
    assert all(t.gold is None and "augmented" in t.tags for t in aug)
    assert [t.question for t in augment_tasks(demo_small, "train", 1, exclude=test)] == [t.question for t in aug]
    # excluding a question removes exactly that draft
    fewer = augment_tasks(demo_small, "train", 1, exclude=[*test, aug[0]])
    assert normalise(aug[0].question) not in {normalise(t.question) for t in fewer}
