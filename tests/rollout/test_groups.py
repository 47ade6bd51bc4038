"""Group sampling: deterministic episode ids and seeds, G trajectories per (task, budget), database-ordered."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bapsql.errors import ConfigError
from bapsql.logs.writer import episode_id
from bapsql.rollout.groups import GroupSampler, Prompt, group_id, sample_seed, shard_of
from bapsql.types import Task


def _task(i: int, db: str) -> Task:
    return Task(task_id=f"{db}-{i}", db_id=db, db_path=f"/x/{db}.sqlite", question=f"q{i}", gold_sql="SELECT 1")


TASKS = [_task(i, db) for i, db in enumerate(["b", "a", "b", "c", "a"])]


def test_a_group_has_g_trajectories_with_their_own_seeds_and_one_group_id():
    specs = GroupSampler("run1").group("model.tiny", Prompt(TASKS[0], "XS", 7), policy_version=3)
    assert len(specs) == 8
    assert [s.sample for s in specs] == list(range(8))
    assert len({s.sample_seed for s in specs}) == 8
    assert len({s.episode_id for s in specs}) == 8
    assert {s.group_id for s in specs} == {group_id(TASKS[0].task_id, "XS", 7, 3)}
    assert all(s.policy_version == 3 and s.seed == 7 and s.level == "XS" for s in specs)


def test_ids_are_the_writer_ids_and_sample_zero_replays_the_group_seed():
    """With one sample per group, ids and policy seeds equal the in-process runner's: the two paths interoperate."""
    (spec,) = GroupSampler("r", samples_per_group=1).group("scripted.drafter@raw", Prompt(TASKS[1], "S", 2))
    assert spec.episode_id == episode_id("r", "scripted.drafter@raw", "S", 2, TASKS[1].task_id)
    assert spec.sample_seed == 2


def test_sweep_covers_the_product_once_database_by_database():
    specs = GroupSampler("r", samples_per_group=2).sweep(["m1", "m2"], TASKS, ["XS", "L"], [0, 1])
    assert len(specs) == 2 * len(TASKS) * 2 * 2 * 2
    assert len({s.episode_id for s in specs}) == len(specs)
    dbs = [s.db_id for s in specs]
    assert dbs == sorted(dbs)  # consecutive episodes share warm handles
    with pytest.raises(ConfigError):
        GroupSampler("r").sweep(["m1", "m1"], TASKS, ["XS"], [0])


def test_same_arguments_give_the_same_specs():
    a = GroupSampler("r", samples_per_group=3).sweep(["m"], TASKS, ["M"], [5])
    b = GroupSampler("r", samples_per_group=3).sweep(["m"], list(reversed(TASKS)), ["M"], [5])
    assert a == b


@given(st.integers(0, 2**31 - 1), st.text(min_size=1, max_size=12), st.sampled_from(["XS", "S", "M", "L"]))
def test_sample_seeds_are_31_bit_and_distinct_within_a_group(seed, task_id, level):
    seeds = [sample_seed(seed, task_id, level, k) for k in range(8)]
    assert all(0 <= s < 2**31 for s in seeds)
    assert len(set(seeds)) == 8
    assert seeds == [sample_seed(seed, task_id, level, k) for k in range(8)]


@given(st.text(min_size=1, max_size=20), st.integers(1, 16))
def test_shards_are_stable_and_in_range(db, n):
    assert 0 <= shard_of(db, n) < n
    assert shard_of(db, n) == shard_of(db, n)


def test_bad_arguments_are_config_errors():
    with pytest.raises(ConfigError):
        GroupSampler("r", samples_per_group=0)
    with pytest.raises(ConfigError):
        GroupSampler("")
    with pytest.raises(ConfigError):
        shard_of("a", 0)
