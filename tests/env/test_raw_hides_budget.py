"""Issue 30, item 5: with the dashboard hidden (``raw``), refusals say that the result or context room is gone in
words, never quoting ledger figures (remaining result tokens, context tokens)."""

from __future__ import annotations

import re

from bapsql.budgets import Budget, get_budget
from bapsql.env.actions import ExecuteQuery, ManageEvidence, render_action
from bapsql.env.conditions import condition

BROAD = "SELECT id, name, age, city_id FROM person"
SMALL = "SELECT name, age FROM person WHERE city_id = 1 LIMIT 8"


def _figures(text: str) -> set[str]:
    return set(re.findall(r"\d+", text))


def _policy_texts(r) -> str:
    return r.observation + "\n" + (r.info.get("message") or "") + "\n" + ((r.info.get("shield") or {}).get("message")
                                                                         or "")


def test_no_result_or_context_room_is_said_in_words_under_raw(make_env, task):
    probe = make_env(condition=condition("raw"))
    probe.reset(task, get_budget("M"))
    probe.step(render_action(ExecuteQuery(SMALL)))
    need = probe.ledger.result_tokens
    spent = Budget("spent", context_tokens=6000, queries=3, result_tokens=need, vm_steps=10**6, turns=8)
    for cond, words in (("raw", True), ("dashboard", False)):
        env = make_env(condition=condition(cond))
        env.reset(task, spent)
        env.step(render_action(ExecuteQuery(SMALL)))  # spends every result token
        r = env.step(render_action(ExecuteQuery(SMALL)))
        assert r.info["status"] == "rejected" and env.ledger.snapshot().remaining.result_tokens == 0
        if words:
            assert "no result room left" in r.observation and "result tokens left" not in _policy_texts(r)
        else:  # the dashboard shows the ledger anyway; the refusal may quote it
            assert "0 result tokens left" in r.observation
    small = Budget("small", context_tokens=700, queries=2, result_tokens=2000, vm_steps=10**6, turns=4)
    env = make_env(condition=condition("raw"))
    env.reset(task, small)
    env.step(render_action(ExecuteQuery(BROAD)))
    r = env.step(render_action(ExecuteQuery(BROAD)))  # the context has no room for a row: rejected before running
    assert r.info["status"] == "rejected" and r.info["message"] == "no context room left"
    left = env.ledger.snapshot().remaining.result_tokens
    assert left > 0 and str(left) not in _figures(_policy_texts(r))


def test_no_result_room_for_a_restore_is_said_in_words_under_raw(make_env, task):
    probe = make_env(condition=condition("raw"))
    probe.reset(task, get_budget("M"))
    probe.step(render_action(ExecuteQuery(SMALL)))
    need = probe.ledger.result_tokens
    budget = Budget("tight", context_tokens=6000, queries=2, result_tokens=need + 3, vm_steps=10**6, turns=8)
    env = make_env(condition=condition("raw"))
    env.reset(task, budget)
    env.step(render_action(ExecuteQuery(SMALL)))
    env.step(render_action(ManageEvidence("archive", "E1")))
    r = env.step(render_action(ManageEvidence("restore", "E1")))
    assert "refused" in r.observation and "no result room left" in r.observation
    text = _policy_texts(r)
    assert not {str(need), "3"} & _figures(text.replace("E1", ""))
    roomy = Budget("roomy", context_tokens=6000, queries=2, result_tokens=10 * need, vm_steps=10**6, turns=8)
    env.reset(task, roomy)
    env.step(render_action(ExecuteQuery(SMALL)))
    env.step(render_action(ManageEvidence("archive", "E1")))
    r = env.step(render_action(ManageEvidence("restore", "E1")))
    assert "restored" in r.observation and str(need) not in _figures(r.observation.replace("E1", ""))
