"""The Table 2 baselines: Raw (budget-blind), Dashboard (budget visible), Adaptive post-hoc control."""

from __future__ import annotations

import pytest

from bapsql.env.actions import parse_action
from bapsql.errors import ConfigError
from bapsql.policies.base import ResultSeen
from bapsql.policies.baselines import AdaptivePostHoc, DashboardAgent, RawAgent
from bapsql.policies.registry import make_policy

BASELINES = ("baseline.raw", "baseline.dashboard", "baseline.adaptive_posthoc")


def _first_sql(got) -> str:
    return parse_action(got.completions[0]).sql


def _naive_seed(play, task, level="XS") -> int:
    """A seed whose shared draft rule picks the naive query first."""
    return next(s for s in range(20) if _first_sql(play("baseline.raw", task, level, seed=s)) == task.naive_sql)


def test_no_baseline_has_the_estimator_or_rewrite():
    for name in BASELINES:
        tools = make_policy(name).interface.allowed_actions
        assert "estimate_query" not in tools and "rewrite_query" not in tools
    assert not RawAgent.interface.show_dashboard
    assert DashboardAgent.interface.show_dashboard and AdaptivePostHoc.interface.show_dashboard


def test_raw_agent_is_budget_blind(play, mini_tasks):
    task = mini_tasks["shop-00"]
    raw = make_policy("baseline.raw")
    got = play(raw, task, "S", seed=_naive_seed(play, task, "S"))
    assert got.env.options.show_dashboard is False
    assert all("[left]" not in m["content"] for msgs in got.messages for m in msgs)
    assert all(info["ledger"] is not None for info in got.infos)  # the env still reports the ledger ...
    assert raw.ctx.remaining is None  # ... but a budget-blind policy is never given it


def test_baselines_share_the_draft_rule(play, mini_tasks):
    task = mini_tasks["shop-00"]
    firsts = {name: [_first_sql(play(name, task, "M", seed=s)) for s in range(8)] for name in BASELINES}
    assert firsts["baseline.raw"] == firsts["baseline.dashboard"] == firsts["baseline.adaptive_posthoc"]
    assert set(firsts["baseline.raw"]) == {task.naive_sql, task.gold_sql}  # both drafts occur across seeds


def test_dashboard_abstains_where_raw_answers_from_the_wrong_rows(play, mini_tasks):
    task = mini_tasks["shop-00"]
    seed = _naive_seed(play, task)
    raw, dash = play("baseline.raw", task, "XS", seed=seed), play("baseline.dashboard", task, "XS", seed=seed)
    assert raw.actions == ["execute_query", "execute_query", "answer"]  # blind second query is rejected
    assert raw.env.turn_records[1].status == "rejected" and not raw.summary.success
    assert dash.actions == ["execute_query", "abstain"]
    assert "queries" in parse_action(dash.completions[-1]).reason


def test_posthoc_rule_picks_the_control_by_what_cut_the_result():
    p = AdaptivePostHoc()
    seen = lambda status, by: ResultSeen("E1", "q", status, ("a",), ((1,),), "", by)  # noqa: E731
    assert p.control_for(seen("truncated", "result_tokens")) == "profile"
    assert p.control_for(seen("truncated", "context")) == "profile"
    assert p.control_for(seen("truncated", "rows")) == "limit"
    assert p.control_for(seen("truncated", "vm_steps")) == "truncate"
    assert p.control_for(seen("ok", None)) is None
    assert AdaptivePostHoc(mode="limit").control_for(seen("truncated", "result_tokens")) == "limit"
    with pytest.raises(ConfigError, match="post-hoc mode"):
        AdaptivePostHoc(mode="magic")


def test_posthoc_compresses_an_oversized_draft_then_aggregates(play, mini_tasks):
    task = mini_tasks["shop-00"]
    seed = _naive_seed(play, task, "M")
    got = play("baseline.adaptive_posthoc", task, "M", seed=seed)
    assert got.actions[:3] == ["execute_query", "manage_evidence", "execute_query"]
    assert parse_action(got.completions[1]).op in ("compress", "archive")
    limited = play("baseline.adaptive_posthoc_limit", task, "L", seed=seed)
    assert parse_action(limited.completions[-2]).sql.endswith("LIMIT 20")
