"""Each Table 4 intervention changes exactly what it claims, and nothing else."""

from __future__ import annotations

import dataclasses

import pytest

from bapsql.budgets import Budget
from bapsql.env.actions import EstimateQuery, ExecuteQuery, RewriteQuery, parse_action, render_action
from bapsql.env.episode import BudgetedSQLEnv
from bapsql.env.records import EnvOptions
from bapsql.errors import ConfigError
from bapsql.policies.base import Interface
from bapsql.policies.interventions import INTERVENTIONS
from bapsql.policies.registry import canonical_name, make_policy, policy_names
from bapsql.env.rewriter import deterministic_rewrite

CLAIMS = {  # intervention -> {Interface field: value it must take}; every other field must stay as it was
    "no_interface": lambda i: {"allowed_actions": tuple(t for t in i.allowed_actions
                                                        if t not in ("estimate_query", "rewrite_query"))},
    "no_planning": lambda i: {"allowed_actions": tuple(t for t in i.allowed_actions
                                                       if t not in ("estimate_query", "rewrite_query"))},
    "shuffled_estimate": lambda i: {"estimate_view": "shuffled"},
    "no_rewrite": lambda i: {"allowed_actions": tuple(t for t in i.allowed_actions if t != "rewrite_query")},
    "no_abstention": lambda i: {"allowed_actions": tuple(t for t in i.allowed_actions if t != "abstain")},
    "deterministic_rewrite": lambda i: {},
}


@pytest.mark.parametrize("iv", sorted(INTERVENTIONS))
@pytest.mark.parametrize("base", ["workflow.estimate_rewrite", "baseline.raw", "baseline.adaptive_posthoc"])
def test_interface_changes_only_the_claimed_knob(iv, base):
    inner, wrapped = make_policy(base), make_policy(f"{base}+{iv}")
    before, after = dataclasses.asdict(inner.interface), dataclasses.asdict(wrapped.interface)
    claimed = CLAIMS[iv](inner.interface)
    assert after == {**before, **claimed}
    assert wrapped.name == f"{base}+{iv}" and wrapped.needs_oracle == inner.needs_oracle
    assert CLAIMS.keys() == INTERVENTIONS.keys()


FIXED = [  # a fixed action sequence for the placebo test (shop database)
    EstimateQuery("SELECT * FROM orders WHERE status = 'shipped'"),
    RewriteQuery("SELECT COUNT(*) FROM orders WHERE status = 'shipped'", "aggregate"),
    EstimateQuery("SELECT c.name, o.amount FROM orders o JOIN customers c ON o.customer_id = c.id"),
    ExecuteQuery("SELECT COUNT(*) FROM orders WHERE status = 'shipped'"),
    EstimateQuery("SELECT city FROM customers"),
    ExecuteQuery("SELECT * FROM orders WHERE status = 'returned'"),
]


def _replay(handles, counter, task, budget, view: str, seed: int):
    env = BudgetedSQLEnv(token_counter=counter, handles=handles, options=EnvOptions(estimate_view=view))
    obs = [env.reset(task, budget, seed=seed)[0]]
    infos = []
    for action in FIXED:
        r = env.step(render_action(action))
        obs.append(r.observation)
        infos.append(r.info)
    return env, obs, infos


def test_placebo_changes_only_the_visible_estimates(handles, counter, mini_tasks, ladder):
    task, budget = mini_tasks["shop-00"], ladder["L"]
    true_env, true_obs, true_infos = _replay(handles, counter, task, budget, "true", 0)
    fake_env, fake_obs, fake_infos = _replay(handles, counter, task, budget, "shuffled", 0)
    est_turns = [i for i, a in enumerate(FIXED) if not isinstance(a, ExecuteQuery)]
    # visible p50/p95 differ on estimate / rewrite turns ...
    assert any(true_infos[i]["estimate"]["rows"] != fake_infos[i]["estimate"]["rows"] for i in est_turns)
    # ... while the shield's decisions, its rows and every cumulative charge are identical
    for t, f in zip(true_env.turn_records, fake_env.turn_records):
        assert (t.action, t.status, t.sql) == (f.action, f.status, f.sql)
        assert (t.queries_after, t.result_tokens_after, t.vm_steps_after) == (f.queries_after, f.result_tokens_after,
                                                                              f.vm_steps_after)
        assert (t.actual_rows, t.actual_vm_steps, t.actual_result_tokens) == (f.actual_rows, f.actual_vm_steps,
                                                                              f.actual_result_tokens)
        if t.action == "execute_query":  # the shield's own (never shown) estimate is the true one in both runs
            assert (t.est_rows_p50, t.est_vm_steps_p95) == (f.est_rows_p50, f.est_vm_steps_p95)
    for i, a in enumerate(FIXED):
        if isinstance(a, ExecuteQuery):
            assert true_infos[i]["shield"] == fake_infos[i]["shield"]
    # estimate turns are logged as the policy saw them (TurnRecord: the policy-visible estimate)
    for i in est_turns:
        assert fake_env.turn_records[i].est_rows_p95 == fake_infos[i]["estimate"]["rows"]["p95"]
    # the visible payload keeps the estimate's columns and probe cost; only the quantiles move
    for i in est_turns:
        t, f = true_infos[i]["estimate"], fake_infos[i]["estimate"]
        assert (t["columns"], t["probe_vm_steps"], t["error"]) == (f["columns"], f["probe_vm_steps"], f["error"])


def test_placebo_draws_are_seeded(handles, counter, mini_tasks, ladder):
    task, budget = mini_tasks["shop-00"], ladder["L"]
    a = _replay(handles, counter, task, budget, "shuffled", 3)[1]
    b = _replay(handles, counter, task, budget, "shuffled", 3)[1]
    assert a == b
    others = [_replay(handles, counter, task, budget, "shuffled", s)[1] for s in (4, 5, 6)]
    assert any(o != a for o in others)


def test_deterministic_rewrite_replaces_only_the_rewrites(play, mini_tasks):
    task = mini_tasks["shop-00"]  # count: COUNT(*) over the naive listing is right
    plain = play("workflow.estimate_rewrite", task, "XS")
    rule = play("workflow.estimate_rewrite+deterministic_rewrite", task, "XS")
    assert plain.completions[0] == rule.completions[0]  # the estimate of the draft is untouched
    expected = deterministic_rewrite(task.naive_sql).sql
    assert parse_action(rule.completions[1]).sql == expected
    assert parse_action(rule.completions[2]) == ExecuteQuery(expected)
    assert rule.summary.success
    avg = play("workflow.estimate_rewrite+deterministic_rewrite", mini_tasks["shop-01"], "XS")
    assert parse_action(avg.completions[1]).sql.startswith("SELECT COUNT(*)") and not avg.summary.success


def test_no_abstention_answers_instead_of_abstaining(play, mini_tasks):
    tiny = Budget("tiny", context_tokens=2400, queries=1, result_tokens=80, vm_steps=2_000, turns=5)
    task = mini_tasks["shop-04"]
    assert play("workflow.justified_abstention", task, tiny).actions[-1] == "abstain"
    got = play("workflow.justified_abstention+no_abstention", task, tiny)
    assert "abstain" not in got.actions and got.actions[-1] == "answer"
    assert got.summary.invalid_actions == 0


def test_no_rewrite_and_no_interface_remove_exactly_those_actions(play, mini_tasks):
    task = mini_tasks["shop-00"]
    no_rw = play("workflow.estimate_rewrite+no_rewrite", task, "S")
    assert "estimate_query" in no_rw.actions and "rewrite_query" not in no_rw.actions
    no_if = play("workflow.estimate_rewrite+no_interface", task, "S")
    assert not {"estimate_query", "rewrite_query"} & set(no_if.actions)
    for got in (no_rw, no_if):
        assert got.summary.invalid_actions == 0


def test_names_parse_in_both_spellings():
    assert canonical_name("workflow:estimate_rewrite") == "workflow.estimate_rewrite"
    assert canonical_name("intervention:no_interface(workflow:estimate_rewrite)") == \
        "workflow.estimate_rewrite+no_interface"
    p = make_policy("intervention:shuffled_estimate(baseline:raw)", ("no_abstention",))
    assert p.name == "baseline.raw+shuffled_estimate+no_abstention"
    assert len(policy_names()) == len(set(policy_names())) >= 12
    with pytest.raises(ConfigError, match="unknown policy"):
        make_policy("workflow.nope")
    with pytest.raises(ConfigError, match="unknown intervention"):
        make_policy("workflow.estimate_rewrite+nope")


def test_an_interface_knob_the_env_lacks_is_refused():
    @dataclasses.dataclass(frozen=True)
    class OldOptions:
        show_dashboard: bool = True
        allowed_actions: tuple = ()

    with pytest.raises(ConfigError, match="estimate_view"):
        Interface(estimate_view="shuffled").env_options(OldOptions())
    assert Interface().env_options(OldOptions()).show_dashboard is True


def test_bad_interfaces_and_missing_oracle_are_config_errors(mini_tasks, ladder):
    from bapsql.policies.base import PolicyOptions

    with pytest.raises(ConfigError, match="unknown tool"):
        Interface(allowed_actions=("fly",))
    with pytest.raises(ConfigError, match="estimate_view"):
        Interface(estimate_view="reversed")
    with pytest.raises(ConfigError, match="oracle"):
        make_policy("workflow.direct_aggregation").reset(mini_tasks["shop-00"], ladder["XS"], 0, PolicyOptions())
