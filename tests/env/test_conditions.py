"""Conditions as environment settings (bapsql/env/conditions.py): one test per switch, on a real SQLite file."""

from __future__ import annotations

import re

import pytest

from bapsql.budgets import get_budget
from bapsql.env.actions import (
    TOOL_NAMES, Abstain, EstimateQuery, ExecuteQuery, InspectSchema, RewriteQuery, render_action,
)
from bapsql.env.conditions import (
    CONDITIONS, DEFAULT_CONDITION, Condition, condition, method_name, split_method, with_switches,
)
from bapsql.errors import ConfigError

XS, S, M, L = (get_budget(x) for x in ("XS", "S", "M", "L"))
PARIS = "SELECT count(*) FROM person p JOIN city c ON p.city_id = c.id WHERE c.name = 'Paris'"
BROAD = "SELECT * FROM person"
HUGE = "SELECT count(*) FROM person a, person b, person c"
ALL_ACTIONS = {
    "inspect_schema": InspectSchema(None), "estimate_query": EstimateQuery(PARIS),
    "rewrite_query": RewriteQuery(PARIS, "aggregate"), "execute_query": ExecuteQuery(PARIS),
    "abstain": Abstain("no"),
}


def act(env, action):
    return env.step(render_action(action))


def test_presets_exist_under_the_paper_names_and_are_valid():
    assert list(CONDITIONS) == ["raw", "dashboard", "adaptive_posthoc", "full", "no_planning", "no_interface",
                                "shuffled_estimate", "no_rewrite", "deterministic_rewrite", "no_abstention"]
    assert DEFAULT_CONDITION == "full" and condition("full").actions == TOOL_NAMES
    assert not condition("raw").show_dashboard and condition("dashboard").show_dashboard
    assert condition("adaptive_posthoc").posthoc == "adaptive"
    for name in ("raw", "dashboard", "adaptive_posthoc", "no_planning", "no_interface"):
        c = condition(name)
        assert not {"estimate_query", "rewrite_query"} & set(c.actions)
        assert c.estimates == "none" and c.preflight == "words"
    assert condition("shuffled_estimate").estimates == "permuted"
    assert "rewrite_query" not in condition("no_rewrite").actions and condition("no_rewrite").estimates == "true"
    assert condition("deterministic_rewrite").rewrite == "rule"
    assert "abstain" not in condition("no_abstention").actions


def test_bad_conditions_and_method_labels_are_refused():
    with pytest.raises(ConfigError, match="unknown condition 'nope'"):
        condition("nope")
    with pytest.raises(ConfigError, match="estimates"):
        Condition(name="x", estimates="none")  # estimate_query offered but nothing to show
    with pytest.raises(ConfigError, match="condition.posthoc"):
        Condition(name="x", posthoc="sometimes")
    with pytest.raises(ConfigError, match="'@'"):
        Condition(name="a@b")
    assert split_method("workflow.x@raw") == ("workflow.x", "raw")
    assert split_method("workflow.x") == ("workflow.x", "full")
    with pytest.raises(ConfigError, match="POLICY@CONDITION"):
        split_method("workflow.x@")
    assert method_name("scripted.drafter", "dashboard") == "scripted.drafter@dashboard"


@pytest.mark.parametrize("name", list(CONDITIONS))
def test_the_prompt_offers_exactly_the_conditions_tools(make_env, task, name):
    cond = condition(name)
    env = make_env(condition=cond)
    env.reset(task, M)
    system = env.messages[0]["content"]
    offered = {t for t in TOOL_NAMES if re.search(rf"^- {t}\(", system, re.MULTILINE)}
    assert offered == set(cond.actions)


@pytest.mark.parametrize("name", list(CONDITIONS))
def test_a_tool_the_condition_does_not_offer_is_an_invalid_action(make_env, task, name):
    cond = condition(name)
    for tool, action in ALL_ACTIONS.items():
        if cond.offers(tool):
            continue
        env = make_env(condition=cond)
        env.reset(task, M)
        r = act(env, action)
        assert not r.info["valid"] and r.info["action"] == "invalid"
        assert f"not offered under the condition {name!r}" in r.observation
        assert env.ledger.invalid_actions == 1 and env.ledger.queries == 0 and env.ledger.vm_steps == 0
        assert not r.terminated


def test_the_dashboard_is_hidden_under_raw_and_shown_under_dashboard(make_env, task):
    raw, dash = make_env(condition=condition("raw")), make_env(condition=condition("dashboard"))
    obs_raw, _ = raw.reset(task, S)
    obs_dash, _ = dash.reset(task, S)
    assert "[left]" not in obs_raw and "[left]" in obs_dash
    assert "Budget:" not in raw.messages[0]["content"] and "Budget:" in dash.messages[0]["content"]
    r = act(raw, ExecuteQuery(PARIS))
    assert "[left]" not in r.observation
    assert "[left]" in act(dash, ExecuteQuery(PARIS)).observation


@pytest.mark.parametrize("name", ["raw", "no_planning", "no_interface", "dashboard", "adaptive_posthoc"])
def test_preflight_rejections_without_estimates_contain_no_numbers(make_env, task, name):
    env = make_env(condition=condition(name))
    env.reset(task, XS)
    r = act(env, ExecuteQuery(HUGE))
    assert r.info["status"] == "rejected" and r.info["shield"]["rejection"] == "preflight_vm_steps"
    body = r.observation.split("\n[left]")[0]  # the dashboard line (ledger, not estimates) is separate
    assert not re.search(r"\d", body), body
    assert "refused" in body or "rejected" in body


def test_preflight_rejections_quote_the_estimate_under_full(make_env, task):
    env = make_env(condition=condition("full"))
    env.reset(task, XS)
    r = act(env, ExecuteQuery(HUGE))
    assert r.info["status"] == "rejected" and re.search(r"\d[\d,]* VM steps", r.observation)


def test_the_rule_based_rewriter_replaces_the_policys_rewrite(make_env, task):
    env = make_env(condition=condition("deterministic_rewrite"))
    env.reset(task, XS)
    act(env, EstimateQuery(BROAD))
    mine = "SELECT name FROM person WHERE age > 30"
    r = act(env, RewriteQuery(mine, "narrower"))
    rule_sql = r.info["sql"]
    assert rule_sql != mine and "COUNT(*)" in rule_sql.upper() and "rule-based rewrite" in r.observation
    ex = act(env, ExecuteQuery(mine))  # executing its own rewrite runs the rule-based SQL
    assert ex.info["sql"] == rule_sql and ex.info["status"] == "ok"
    # under the policy's own rewriter the same rewrite stays the policy's
    own = make_env(condition=condition("full"))
    own.reset(task, XS)
    act(own, EstimateQuery(BROAD))
    assert act(own, RewriteQuery(mine, "narrower")).info["sql"] == mine


def test_a_custom_condition_composes_switches(make_env, task):
    cond = with_switches(condition("full"), name="full_posthoc", posthoc="profile")
    env = make_env(condition=cond)
    env.reset(task, XS)
    r = act(env, ExecuteQuery(BROAD))
    assert r.info["posthoc"] == "profile" and "[E1 compressed profile]" in r.observation


def test_check_conditions_names_the_config_key_of_the_first_unknown_condition():
    from bapsql.env.conditions import check_conditions
    from bapsql.errors import ConfigError

    check_conditions(("raw", "full"), "eval.conditions")  # every name known: no error
    with pytest.raises(ConfigError, match=r"^eval\.conditions\[1\]: unknown condition 'nope'"):
        check_conditions(("raw", "nope", "also_bad"), "eval.conditions")
    with pytest.raises(ConfigError, match=r"^condition: unknown condition 'nope'"):
        check_conditions("nope", "condition")
