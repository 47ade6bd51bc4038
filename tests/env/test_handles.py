"""The warm database-handle cache (bapsql/env/handles.py)."""

from __future__ import annotations

import pytest

from bapsql.env.handles import DatabaseHandles
from bapsql.errors import DatabaseError
from bapsql.tokens import RegexTokenCounter
from tests.env.people_db import build_people_db


def test_handles_are_cached_and_lru_closed(tmp_path):
    dbs = [build_people_db(tmp_path / f"p{i}.sqlite", n_people=10) for i in range(3)]
    with DatabaseHandles(RegexTokenCounter(), cache_dir=tmp_path / "cache", max_open=2) as hs:
        a = hs.get(dbs[0])
        assert hs.get(str(dbs[0])) is a and len(hs) == 1
        hs.get(dbs[1])
        hs.get(dbs[2])  # evicts dbs[0], the least recently used
        assert len(hs) == 2 and hs.get(dbs[0]) is not a
        assert hs.get(dbs[0]).sandbox.query("SELECT count(*) FROM city").rows == ((5,),)
    assert len(hs) == 0


def test_missing_database_raises_database_error(tmp_path):
    with pytest.raises(DatabaseError, match="not found"):
        DatabaseHandles(RegexTokenCounter(), cache_dir=tmp_path).get(tmp_path / "missing.sqlite")


def test_a_leased_handle_outlives_the_cap_until_released(tmp_path):
    dbs = [build_people_db(tmp_path / f"p{i}.sqlite", n_people=10) for i in range(3)]
    with DatabaseHandles(RegexTokenCounter(), cache_dir=tmp_path / "cache", max_open=1) as hs:
        a = hs.acquire(dbs[0])
        b = hs.get(dbs[1])  # over the cap, but dbs[0] is leased: the unleased one would be the victim next
        assert len(hs) == 2 and hs.get(dbs[0]) is a
        assert a.sandbox.query("SELECT count(*) FROM city").rows == ((5,),)
        hs.get(dbs[2])  # closes dbs[1] (unleased), keeps dbs[0]
        assert len(hs) == 2 and hs.get(dbs[0]) is a and hs.get(dbs[1]) is not b
        hs.release(dbs[0])  # no lease left: trimmed back to the cap
        assert len(hs) == 1
        with pytest.raises(ValueError, match="without an acquire"):
            hs.release(dbs[0])


def test_episodes_interleaved_over_more_databases_than_the_cache_holds_all_finish(tmp_path):
    """Model rollouts keep many episodes in flight on one worker: resetting episodes on other databases must not
    close the connection an unfinished episode reads (the Spider dev sweep over 28 databases did, with 16 open)."""
    from bapsql.budgets import get_budget
    from bapsql.env.actions import AnswerAction, ExecuteQuery, render_action
    from bapsql.env.episode import BudgetedSQLEnv
    from bapsql.types import Task

    dbs = [build_people_db(tmp_path / f"p{i}.sqlite", n_people=10) for i in range(4)]
    sql = "SELECT count(*) FROM city"
    with DatabaseHandles(RegexTokenCounter(), cache_dir=tmp_path / "cache", max_open=2) as hs:
        envs = [BudgetedSQLEnv(token_counter=RegexTokenCounter(), handles=hs) for _ in dbs]
        for i, (env, db) in enumerate(zip(envs, dbs)):
            env.reset(Task(f"t{i}", f"p{i}", str(db), "How many cities are there?", sql), get_budget("S"))
        assert len(hs) == 4  # every database has an unfinished episode
        for env in envs:
            assert env.step(render_action(ExecuteQuery(sql))).info["status"] == "ok"
            result = env.step(render_action(AnswerAction("scalar", (5,), ("E1",))))
            assert result.terminated and env.summary().success
        assert len(hs) == 2  # the episodes ended: back to the cap
