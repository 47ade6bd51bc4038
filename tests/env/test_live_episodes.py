"""Episodes over live databases (bapsql/env/live.py and the hooks in episode.py) and the ledger of statements stopped
mid-run: real writer processes, real queries."""

from __future__ import annotations

import dataclasses

import pytest

from bapsql.budgets import get_budget
from bapsql.env.actions import ExecuteQuery, render_action
from bapsql.env.episode import BudgetedSQLEnv
from bapsql.env.handles import DatabaseHandles
from bapsql.env.records import EnvOptions
from bapsql.tokens import RegexTokenCounter
from bapsql.types import Task
from tests.db.writers import hold_lock, inserter, make_db, stop

L = get_budget("L")


def _env(tmp_path, **options) -> BudgetedSQLEnv:
    handles = DatabaseHandles(RegexTokenCounter(), cache_dir=tmp_path / "cache")
    return BudgetedSQLEnv(token_counter=RegexTokenCounter(), handles=handles, options=EnvOptions(**options))


def _task(db) -> Task:
    return Task(task_id="live", db_id="live", db_path=str(db), question="How many items?",
                gold_sql="SELECT count(*) FROM item")


def _exec(env, sql):
    return env.step(render_action(ExecuteQuery(sql)))


def test_a_long_lock_is_a_busy_rejection_with_its_wait_recorded(tmp_path):
    db = make_db(tmp_path / "r.sqlite", wal=False)
    env = _env(tmp_path, busy_timeout_s=0.3)
    env.reset(_task(db), L)  # the handle (and catalog) open before the writer arrives
    proc = hold_lock(db, 60)
    try:
        r = _exec(env, "SELECT count(*) FROM item")
    finally:
        stop(proc)
    assert r.info["status"] == "rejected" and "busy" in r.observation and "SQL error" not in r.observation
    led = env.ledger
    assert led.queries == 0 and led.rejections == 1 and led.vm_steps == 0
    rec = env.turn_records[-1]
    assert rec.status == "rejected" and rec.db_wait_s > 0 and "db_wait_s" in rec.to_row()
    r2 = _exec(env, "SELECT count(*) FROM item")  # the writer is gone: the next action reads
    assert r2.info["status"] == "ok" and env.evidence.get("E1").rows == ((2_000,),)  # killed: never committed


def test_the_request_deadline_cuts_the_wait(tmp_path):
    db = make_db(tmp_path / "r.sqlite", wal=False)
    env = _env(tmp_path, busy_timeout_s=30, request_wall_s=0.0)
    env.reset(_task(db), L)
    proc = hold_lock(db, 60)
    try:
        r = _exec(env, "SELECT count(*) FROM item")
    finally:
        stop(proc)
    assert r.info["status"] == "rejected" and "busy" in r.observation  # no 30 s wait: the request had no time left


# rollback mode: several seconds of lock waits (each commit holds the file's lock through its fsyncs) -> slow tier
@pytest.mark.parametrize("wal", [True, pytest.param(False, marks=pytest.mark.slow)])
def test_episodes_run_while_rows_are_inserted_and_agree_with_themselves(tmp_path, wal):
    db = make_db(tmp_path / "s.sqlite", wal=wal)
    env = _env(tmp_path, busy_timeout_s=10)
    proc = inserter(db, 100)
    try:
        for _ in range(8):
            env.reset(_task(db), L)
            a = _exec(env, "SELECT count(*) FROM item")
            b = _exec(env, "SELECT max(id) - min(id) + 1 FROM item")
            assert a.info["status"] == "ok" and b.info["status"] == "ok"  # no episode fails for a short write
            assert env.evidence.get("E1").rows == env.evidence.get("E2").rows  # one snapshot
            env.step('<tool_call>{"name": "abstain", "arguments": {"reason": "test"}}</tool_call>')
            assert env.done and not env._snapshot.held
    finally:
        stop(proc)


def test_a_statement_stopped_by_the_vm_cap_charges_its_steps(make_env, task):
    env = make_env()
    env.reset(task, dataclasses.replace(L, vm_steps=50_000))
    sql = ("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 10000000) "
           "SELECT count(*) FROM c")
    r = _exec(env, sql)
    shield = r.info["shield"]  # the estimator does not see a recursive CTE's cost coming: the preflight lets it run
    assert shield["status"] == "truncated" and shield["truncated_by"] == "vm_steps"
    assert 0 < shield["cost"]["vm_steps"] <= 50_000
    probe = r.info["probe_vm_steps"]  # the shield's preflight probe is charged too
    assert env.ledger.vm_steps == shield["cost"]["vm_steps"] + probe + env.turn_records[-1].vm_steps_before
    assert (env.turn_records[-1].vm_steps_after - env.turn_records[-1].vm_steps_before
            == shield["cost"]["vm_steps"] + probe)


def test_a_statement_failing_mid_run_charges_its_steps(make_env, task):
    env = make_env()
    env.reset(task, L)
    # abs() of the smallest integer overflows, on the row with id 500: after ~500 rows were stepped through
    sql = "SELECT abs(CASE WHEN id = 500 THEN -9223372036854775807 - 1 ELSE id END) FROM person"
    r = _exec(env, sql)
    shield = r.info["shield"]
    assert shield["status"] == "error" and "overflow" in shield["message"]
    spent = shield["cost"]["vm_steps"]
    assert spent > 500  # the rows before the failing one were stepped through
    rec = env.turn_records[-1]
    assert rec.vm_steps_after - rec.vm_steps_before == spent + r.info["probe_vm_steps"] and env.ledger.queries == 1
