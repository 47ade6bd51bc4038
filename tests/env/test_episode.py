"""The budgeted episode through the real db layer (bapsql/env/episode.py)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bapsql.budgets import Budget, get_budget
from bapsql.env.actions import (
    Abstain, AnswerAction, EstimateQuery, ExecuteQuery, InspectSchema, ManageEvidence, RewriteQuery, render_action,
)
from bapsql.env.conditions import condition
from bapsql.errors import EnvStateError
from bapsql.tokens import RegexTokenCounter
from bapsql.logs.schema import EPISODES_SCHEMA, FAILURE_KINDS, TURNS_SCHEMA
from bapsql.types import Answer

XS, S, M, L = (get_budget(x) for x in ("XS", "S", "M", "L"))
PARIS = "SELECT count(*) FROM person p JOIN city c ON p.city_id = c.id WHERE c.name = 'Paris'"
BROAD = "SELECT id, name, age, city_id FROM person"


def act(env, action):
    return env.step(render_action(action))


def test_reset_shows_question_schema_and_dashboard(make_env, task):
    env = make_env()
    obs, info = env.reset(task, XS)
    assert "How many people live in Paris?" in obs
    assert "city (5 rows): id, name, country" in obs and "person (600 rows)" in obs
    assert "[left] context" in obs and "queries 1/1" in obs and "turns 5/5" in obs
    assert [m["role"] for m in env.messages] == ["system", "user"]
    assert "execute_query(sql)" in env.messages[0]["content"]
    assert env.ledger.context_tokens == env._tx.prompt() <= XS.context_tokens
    assert info["max_completion_tokens"] == XS.context_tokens - env.ledger.context_tokens - 2
    # the dashboard's context figure is exact: the headroom after the observation itself
    shown = int(obs.split("[left] context ")[1].split("/")[0])
    assert shown == info["ledger"]["remaining"]["context_tokens"]


def test_hint_is_shown_and_info_has_the_contract_keys(make_env, task):
    env = make_env()
    obs, info = env.reset(dataclasses.replace(task, evidence="Paris is the city named 'Paris'."), S)
    assert "Hint: Paris is the city named 'Paris'." in obs
    r = act(env, InspectSchema(("person", "nope")))
    assert "fk city_id -> city(id)" in r.observation and "Unknown table(s): nope" in r.observation
    for key in ("action", "valid", "ledger", "estimate", "shield", "context_rewritten", "max_completion_tokens"):
        assert key in r.info
    assert set(r.info["ledger"]) >= {"spent", "remaining"}


def test_env_must_be_reset_first(make_env):
    env = make_env()
    with pytest.raises(EnvStateError):
        env.step("x")
    with pytest.raises(EnvStateError):
        env.summary()


def test_execute_then_answer_is_a_budgeted_success(make_env, task):
    env = make_env()
    env.reset(task, XS)
    r = act(env, ExecuteQuery(PARIS))
    assert r.info["status"] == "ok" and r.info["evidence_ref"] == "E1" and "E1 (ok): 1 rows" in r.observation
    shield = r.info["shield"]
    spent = r.info["ledger"]["spent"]
    assert spent["queries"] == 1 and spent["turns"] == 1
    # the scan and the shield's preflight probe are both database work
    assert spent["vm_steps"] == shield["cost"]["vm_steps"] + r.info["probe_vm_steps"] > 0
    assert r.info["probe_vm_steps"] > 0
    assert spent["result_tokens"] == shield["cost"]["result_tokens"] > 0
    r = act(env, AnswerAction("scalar", (120,), ("E1",)))
    assert r.terminated and not r.truncated and r.reward == 1.0
    s = env.summary()
    assert s.correct and s.feasible and s.success and s.failure == "" and s.evidence_score == 0.75  # uncorroborated
    assert s.queries == 1 and s.turns == 2 and not s.breach
    with pytest.raises(EnvStateError):
        act(env, Abstain("again"))


def test_broad_query_is_truncated_within_the_result_budget(make_env, task):
    env = make_env()
    env.reset(task, XS)
    r = act(env, ExecuteQuery(BROAD))
    assert r.info["status"] == "truncated"
    assert r.info["ledger"]["spent"]["result_tokens"] <= XS.result_tokens
    block = env.evidence.get("E1")
    assert block.truncated and 0 < len(block.rows) < 600
    assert "[truncated by the result_tokens cap" in r.observation
    assert env.ledger.feasible and env.ledger.peak_context <= XS.context_tokens
    rec = env.turn_records[-1]
    assert rec.actual_rows == 600 and rec.actual_vm_steps == r.info["shield"]["cost"]["vm_steps"]


def test_no_query_left_is_rejected_without_charging(make_env, task):
    env = make_env()
    env.reset(task, XS)
    act(env, ExecuteQuery(PARIS))
    vm = env.ledger.vm_steps
    r = act(env, ExecuteQuery(PARIS))
    assert r.info["status"] == "rejected" and "no queries left" in r.observation
    assert env.ledger.queries == 1 and env.ledger.vm_steps == vm and env.ledger.turns == 2
    assert env.ledger.rejections == 1


def test_estimate_costs_vm_steps_not_query(make_env, task):
    env = make_env()
    env.reset(task, S)
    r = act(env, EstimateQuery(PARIS))
    est = r.info["estimate"]
    assert est is not None and est["error"] is None
    assert env.ledger.queries == 0 and env.ledger.vm_steps == est["probe_vm_steps"]
    assert "rows p50" in r.observation and "p95" in r.observation
    assert env.turn_records[-1].est_rows_p50 == est["rows"]["p50"]


def test_broad_estimate_warns_and_counts_warning(make_env, task):
    env = make_env()
    env.reset(task, XS)
    r = act(env, EstimateQuery(BROAD))
    assert r.info["warning"] and "WARNING: p95 exceeds what remains" in r.observation
    assert env.ledger.warnings == 1
    r = act(env, RewriteQuery("SELECT count(*) FROM person", "aggregate instead of listing"))
    assert not r.info["warning"] and env.ledger.rewrites == 1 and env.ledger.warnings == 1
    assert env.ledger.queries == 0


def test_invalid_action_costs_a_turn_and_explains(make_env, task):
    env = make_env()
    env.reset(task, XS)
    r = env.step("I think the answer is 120")
    assert not r.info["valid"] and r.info["action"] == "invalid"
    assert "no tool call found" in r.observation and "<tool_call>" in r.observation
    assert env.ledger.turns == 1 and env.ledger.invalid_actions == 1 and not r.terminated


def test_disallowed_tool_is_an_invalid_action(make_env, task):
    env = make_env(condition=condition("no_planning"))
    env.reset(task, XS)
    assert "estimate_query" not in env.messages[0]["content"]
    r = act(env, EstimateQuery(PARIS))
    assert not r.info["valid"] and "not offered under the condition 'no_planning'" in r.observation
    assert env.ledger.vm_steps == 0


def test_turn_ceiling_truncates(make_env, task):
    env = make_env()
    env.reset(task, XS)
    for i in range(XS.turns):
        r = act(env, InspectSchema(("city",)))
        assert r.truncated == (i == XS.turns - 1)
    assert "No turns left" in r.observation and r.reward == 0.0
    s = env.summary()
    assert s.truncated and not s.terminated and s.failure == "out_of_turns" and s.turns == XS.turns
    with pytest.raises(EnvStateError):
        env.step("x")


def test_archive_restores_headroom_and_restore_charges_again(make_env, task):
    env = make_env()
    env.reset(task, M)
    act(env, ExecuteQuery("SELECT name, age FROM person WHERE city_id = 1 LIMIT 8"))
    charged = env.ledger.result_tokens
    count = RegexTokenCounter().count
    e1_tokens = count(env.messages[3]["content"])
    ctx = env.ledger.context_tokens
    r = act(env, ManageEvidence("archive", "E1"))
    assert r.info["context_rewritten"] and env.evidence.get("E1").state == "archived"
    assert "[E1 archived: 8 rows x 2 columns" in env.messages[3]["content"]
    freed = e1_tokens - count(env.messages[3]["content"])
    added = sum(count(m["content"]) + (9 if m["role"] == "tool" else 5) for m in env.messages[4:])
    assert freed > charged // 2 and env.ledger.context_tokens == ctx + added - freed  # the level went down by the rows
    r = act(env, ManageEvidence("restore", "E1"))
    assert r.info["context_rewritten"] and env.evidence.get("E1").state == "visible"
    assert env.ledger.result_tokens == 2 * charged and env.ledger.queries == 1
    assert "person number" in env.messages[3]["content"]


def test_compress_shows_profile_and_discard_blocks_restore(make_env, task):
    env = make_env()
    env.reset(task, M)
    act(env, ExecuteQuery("SELECT name, age FROM person WHERE city_id = 2 LIMIT 6"))
    r = act(env, ManageEvidence("compress", "E1"))
    assert "[E1 compressed profile] 6 rows" in env.messages[3]["content"]
    assert env.ledger.controller_tokens > 0 and r.info["context_rewritten"]
    act(env, ManageEvidence("discard", "E1"))
    r = act(env, ManageEvidence("restore", "E1"))
    assert "refused" in r.observation and "discarded" in r.observation and not r.info["context_rewritten"]
    r = act(env, AnswerAction("list", ("x",), ("E1",)))
    assert env.summary().evidence_score == 0.0  # the discarded citation is invalid and supports nothing


def test_write_is_rejected_and_costs_no_query(make_env, task):
    env = make_env()
    env.reset(task, XS)
    r = act(env, ExecuteQuery("DELETE FROM person"))
    assert r.info["status"] == "rejected" and r.info["shield"]["rejection"] == "write"
    assert env.ledger.queries == 0 and env.ledger.rejections == 1


def test_sql_error_before_running_costs_no_query(make_env, task):
    env = make_env()
    env.reset(task, XS)
    r = act(env, ExecuteQuery("SELECT nope FROM person"))
    assert r.info["status"] == "error" and "SQL error" in r.observation
    assert env.ledger.queries == 0


def test_preflight_rejects_clearly_infeasible_query(make_env, task):
    env = make_env()
    env.reset(task, XS)
    r = act(env, ExecuteQuery("SELECT count(*) FROM person a, person b, person c"))
    assert r.info["status"] == "rejected" and r.info["shield"]["rejection"] == "preflight_vm_steps"
    # no query and no scan; only the preflight's probe is charged
    assert env.ledger.queries == 0 and env.ledger.vm_steps == r.info["probe_vm_steps"]
    act(env, Abstain("too expensive"))
    assert env.summary().failure == "unjustified_abstention"


def test_completion_over_headroom_truncates_without_breach(make_env, task):
    env = make_env()
    env.reset(task, XS)
    r = env.step("word " * 5000)
    assert r.truncated and "exceeds the context headroom" in r.observation
    assert env.ledger.feasible and env.ledger.peak_context <= XS.context_tokens


def test_tight_context_cuts_schema_and_rows_with_notes(make_env, task):
    env = make_env()
    obs, _ = env.reset(task, Budget("tiny", context_tokens=540, queries=2, result_tokens=2000, vm_steps=10**6, turns=4))
    assert not env.done and "[2 more tables cut to fit the context; use inspect_schema]" in obs
    small = Budget("small", context_tokens=700, queries=2, result_tokens=2000, vm_steps=10**6, turns=4)
    env.reset(task, small)
    r = act(env, ExecuteQuery(BROAD))  # the result-token cap comes from the context headroom, not the budget
    assert not r.truncated and r.info["shield"]["truncated_by"] == "result_tokens"
    assert "rows shown]" in r.observation and 0 < len(env.evidence.get("E1").rows) < 10
    assert env.ledger.result_tokens < 100 and env.ledger.peak_context <= small.context_tokens
    r = act(env, ExecuteQuery(BROAD))  # no room for any row: rejected before running, no query charged
    assert r.info["status"] == "rejected" and env.ledger.queries == 1 and env.ledger.rejections == 1
    assert "no result tokens can be admitted" in env.turn_records[-1].message
    assert env.ledger.feasible


def test_reset_truncates_when_the_question_cannot_fit(make_env, task):
    env = make_env()
    obs, info = env.reset(task, Budget("nano", context_tokens=300, queries=1, result_tokens=10, vm_steps=100, turns=2))
    assert env.done and info["truncated"] and "do not fit the context" in obs
    assert env.summary().failure == "out_of_turns" and env.ledger.feasible
    with pytest.raises(EnvStateError):
        env.step("x")


def test_wrong_answer_failure_kinds(make_env, task):
    env = make_env()
    env.reset(task, XS)
    act(env, ExecuteQuery(PARIS))
    act(env, AnswerAction("scalar", (7,), ("E1",)))
    s = env.summary()
    assert not s.correct and s.failure == "wrong_with_sufficient_evidence" and s.reward == 0.0
    env.reset(task, XS)
    act(env, AnswerAction("list", (1, 2), ()))
    assert env.summary().failure == "malformed_answer"


def test_gold_from_typed_answer_wins_over_sql(make_env, task):
    env = make_env()
    env.reset(dataclasses.replace(task, gold=Answer("scalar", (121,))), XS)
    act(env, AnswerAction("scalar", (121,), ()))
    s = env.summary()
    assert s.correct and s.success and s.evidence_score == 0.0 and '"values": [121]' in s.gold


def test_records_and_summary_fit_the_log_schema(make_env, task):
    env = make_env()
    env.reset(task, S)
    prompt0 = env.ledger.prompt_tokens
    assert prompt0 == env._tx.live()  # system + initial user message, overhead included, counted once
    act(env, EstimateQuery(PARIS))
    act(env, ExecuteQuery(PARIS))
    act(env, AnswerAction("scalar", (120,), ("E1",)))
    recs = env.turn_records
    assert [r.action for r in recs] == ["estimate_query", "execute_query", "answer"]
    assert prompt0 + sum(r.prompt_tokens for r in recs) == env.ledger.prompt_tokens
    assert all(a.ctx_after == b.ctx_before for a, b in zip(recs, recs[1:]))
    assert recs[1].queries_before == 0 and recs[1].queries_after == 1
    assert set(recs[0].to_row()) <= set(TURNS_SCHEMA.names)
    s = env.summary()
    assert set(s.to_row()) <= set(EPISODES_SCHEMA.names) and s.failure in FAILURE_KINDS
    assert s.total_tokens == s.prompt_tokens + s.completion_tokens + s.result_tokens + s.controller_tokens


ACTIONS = [
    InspectSchema(None), InspectSchema(("person",)), EstimateQuery(BROAD), EstimateQuery(PARIS),
    RewriteQuery("SELECT count(*) FROM person", "aggregate"), ExecuteQuery(BROAD), ExecuteQuery(PARIS),
    ExecuteQuery("SELECT * FROM person p JOIN city c ON p.city_id = c.id"), ManageEvidence("archive", "E1"),
    ManageEvidence("compress", "E2"), ManageEvidence("restore", "E1"), ManageEvidence("discard", "E2"),
    "not a tool call",
]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from([XS, S, M, L]), st.lists(st.sampled_from(ACTIONS), min_size=1, max_size=16))
def test_budget_is_never_exceeded(make_env, task, budget, actions):
    env = make_env()
    env.reset(task, budget)
    for a in actions:
        if env.done:
            break
        r = env.step(a if isinstance(a, str) else render_action(a))
        assert r.info["ledger"]["spent"]["context_tokens"] <= budget.context_tokens
        if not env.done:  # the ledger's level is exactly the re-rendered transcript, template overhead included
            count = RegexTokenCounter().count
            live = sum(count(m["content"]) + (9 if m["role"] == "tool" else 5) for m in env.messages)
            assert env.ledger.context_tokens == live + 3
    assert env.ledger.feasible, env.ledger.breaches
    s = env.summary()
    assert not s.breach and s.peak_context <= budget.context_tokens
    for ch in ("queries", "result_tokens", "vm_steps", "turns"):
        assert getattr(s, ch) <= getattr(budget, ch)
    assert all(r.ctx_before <= budget.context_tokens and r.ctx_after <= budget.context_tokens
               for r in env.turn_records)


def test_runs_with_the_packaged_tokenizer(handles, task):
    from bapsql.db.handle import default_counter
    from bapsql.env.episode import BudgetedSQLEnv

    counter = default_counter()
    env = BudgetedSQLEnv(token_counter=counter, handles=handles)
    env.reset(task, XS)
    act(env, ExecuteQuery(PARIS))
    assert env.ledger.context_tokens == env._tx.prompt()
    r = act(env, AnswerAction("scalar", ("120",), ("E1",)))
    assert r.reward == 1.0 and env.summary().peak_context <= XS.context_tokens


def _dashboard_figures(observation: str) -> dict[str, int]:
    line = observation.rsplit("[left] ", 1)[1].splitlines()[0]
    names = {"context": "context_tokens", "queries": "queries", "result tokens": "result_tokens",
             "VM steps": "vm_steps", "turns": "turns"}
    out = {}
    for part in line.split(" | "):
        name, figure = part.rsplit(" ", 1)
        out[names[name]] = int(figure.split("/")[0])
    return out


@pytest.mark.parametrize("cond", ["full", "dashboard", "adaptive_posthoc"])
@pytest.mark.parametrize("budget", [XS, S, M])
def test_every_observation_s_dashboard_is_the_ledger_after_the_turn(make_env, task, cond, budget):
    """The line the policy reads shows what remains after this very turn, execution charges included (it used to
    show an execution's query, VM steps and result tokens one turn late)."""
    env = make_env(condition=condition(cond))
    obs, info = env.reset(task, budget)
    assert _dashboard_figures(obs) == info["ledger"]["remaining"]
    actions = [EstimateQuery(PARIS), ExecuteQuery(BROAD), ExecuteQuery(PARIS), InspectSchema(("city",)),
               ExecuteQuery("SELECT name FROM city")]
    for a in actions:
        r = act(env, a)
        if r.terminated or r.truncated:
            break
        if "[left] " in r.observation:
            assert _dashboard_figures(r.observation) == r.info["ledger"]["remaining"], (a, r.observation)
    assert env.ledger.queries >= 1
