"""The nine programmatic workflows: they succeed, adapt to budget, estimates and interface, and answer only from
shown rows."""

from __future__ import annotations

import json

import pytest

from bapsql.budgets import Budget
from bapsql.env.actions import parse_action
from bapsql.policies.base import shown_value
from bapsql.env.conditions import Condition
from bapsql.policies.registry import WORKFLOW_NAMES, make_policy

LEVELS = ("XS", "S", "M", "L")


@pytest.mark.parametrize("workflow", WORKFLOW_NAMES)
def test_every_workflow_solves_every_task_at_L_without_invalid_actions(play, mini_tasks, workflow):
    for task in mini_tasks.values():
        got = play(workflow, task, "L")
        assert got.summary.invalid_actions == 0 and not got.summary.breach
        if workflow != "workflow.recover_after_rejection":
            assert got.summary.success, (workflow, task.task_id, got.summary.failure)


def test_a_draft_that_ate_the_result_tokens_cannot_be_recovered(play, mini_tasks):
    """recover_after_rejection runs the broad draft unestimated: when it is admitted up to the result-token budget,
    the aggregate's rows are cut to nothing and the workflow abstains instead of answering from no rows."""
    got = play("workflow.recover_after_rejection", mini_tasks["library-10"], "L")
    assert got.actions == ["execute_query", "rewrite_query", "execute_query", "abstain"]
    assert got.env.turn_records[2].status == "truncated" and got.env.evidence.get("E2").rows == ()


def test_estimate_rewrite_rewrites_a_warned_draft_to_the_aggregate(play, mini_tasks):
    task = mini_tasks["shop-00"]  # naive lists ~1,800 shipped orders; the count fits
    got = play("workflow.estimate_rewrite", task, "XS")
    assert got.actions == ["estimate_query", "rewrite_query", "execute_query", "answer"]
    assert got.infos[1]["warning"]  # the draft's estimate warned
    rewrite = parse_action(got.completions[1])
    assert rewrite.sql == task.gold_sql and "exceeds the budget" in rewrite.reason
    assert got.summary.success and got.summary.rewrites == 1 and got.summary.warnings >= 1


def test_justified_abstention_quotes_the_numbers_when_the_query_cannot_fit(play, mini_tasks):
    tiny = Budget("tiny", context_tokens=2400, queries=1, result_tokens=80, vm_steps=2_000, turns=5)
    got = play("workflow.justified_abstention", mini_tasks["shop-04"], tiny)  # MAX over 3,000 orders
    assert got.actions == ["estimate_query", "abstain"]
    reason = parse_action(got.completions[-1]).reason
    assert "VM steps" in reason and "left" in reason
    assert got.summary.queries == 0


def test_answers_are_the_shown_cells(play, mini_tasks):
    for tid in ("shop-01", "shop-02", "shop-03"):
        got = play("workflow.direct_aggregation", mini_tasks[tid], "M")
        answer = json.loads(got.summary.answer)
        block = got.env.evidence.get("E1")
        shown = [[shown_value(v) for v in r] for r in block.rows]
        expect = [r[0] for r in shown] if len(block.columns) == 1 else shown
        assert answer["values"] == (expect[:1] if answer["kind"] == "scalar" else expect)
        assert answer["kind"] == mini_tasks[tid].gold.kind


def test_budget_adaptive_plans(play, mini_tasks):
    task = mini_tasks["shop-00"]
    assert play("workflow.drill_down", task, "XS").actions == ["inspect_schema", "estimate_query", "execute_query",
                                                                "answer"]
    assert play("workflow.drill_down", task, "M").actions == ["execute_query", "execute_query", "answer"]
    assert play("workflow.evidence_compression", task, "XS").actions == ["estimate_query", "execute_query", "answer"]
    m = play("workflow.evidence_compression", task, "M")
    assert m.actions == ["execute_query", "manage_evidence", "execute_query", "answer"]
    assert m.env.evidence.get("E1").state in ("compressed", "archived")


def test_verify_answer_cites_two_blocks_when_the_budget_allows(play, mini_tasks):
    got = play("workflow.verify_answer", mini_tasks["shop-00"], "L")
    assert got.actions == ["execute_query", "execute_query", "answer"]
    assert parse_action(got.completions[-1]).citations == ("E1", "E2")
    # re-running the gold SQL as a derived table returns the same rows: not independent corroboration
    assert got.summary.evidence_score == pytest.approx(0.75)
    xs = play("workflow.verify_answer", mini_tasks["shop-00"], "XS").actions  # one query: no second block
    assert xs == ["estimate_query", "execute_query", "answer"]


def test_restore_after_archive_restores_before_citing(play, mini_tasks):
    got = play("workflow.restore_after_archive", mini_tasks["shop-00"], "M")
    assert got.actions == ["execute_query", "manage_evidence", "inspect_schema", "manage_evidence", "answer"]
    ops = [parse_action(c).op for c in got.completions if "manage_evidence" in c]
    assert ops == ["archive", "restore"]
    assert got.env.evidence.get("E1").state == "visible" and got.summary.success
    # the restore charged the block's result tokens a second time
    assert got.summary.result_tokens == 2 * got.env.evidence.get("E1").result_tokens


def test_recover_after_rejection_rewrites_after_a_truncated_draft(play, mini_tasks):
    got = play("workflow.recover_after_rejection", mini_tasks["shop-00"], "S")
    assert got.actions[:3] == ["execute_query", "rewrite_query", "execute_query"]
    assert got.env.turn_records[0].status == "truncated"
    assert got.staged == {1}  # the unestimated draft sets up the situation; SFT imitates the recovery only
    # with a single query it cannot afford the draft and goes straight to the aggregate, estimated at XS
    xs = play("workflow.recover_after_rejection", mini_tasks["shop-00"], "XS").actions
    assert xs == ["estimate_query", "execute_query", "answer"]


@pytest.mark.parametrize("workflow", WORKFLOW_NAMES)
def test_workflows_only_call_offered_tools(play, mini_tasks, workflow):
    bare = Condition(name="bare", actions=("execute_query", "answer"), estimates="none", preflight="words")
    policy = make_policy(workflow)
    for level in LEVELS:
        got = play(policy, mini_tasks["shop-00"], level, condition=bare)
        assert set(got.actions) <= {"execute_query", "answer"} and got.summary.invalid_actions == 0


@pytest.mark.parametrize("workflow", ["workflow.direct_aggregation", "workflow.schema_first",
                                      "workflow.verify_answer", "workflow.restore_after_archive"])
def test_every_query_is_estimated_first_when_the_dashboard_shows_a_tight_budget(play, mini_tasks, workflow):
    """shop-03 lists cities (no aggregate, no LIMIT), shop-00 counts orders (one row): at XS and S (at most 2
    queries / 250 result tokens) either query is estimated before it runs, since the policy names the tool before it
    writes the SQL; at M and L it runs at once."""
    for tid in ("shop-03", "shop-00"):
        for level in LEVELS:
            got = play(workflow, mini_tasks[tid], level)
            first = next(a for a in got.actions if a in ("estimate_query", "execute_query"))
            assert first == ("estimate_query" if level in ("XS", "S") else "execute_query"), (tid, level, got.actions)
            assert got.summary.success and got.summary.invalid_actions == 0, (tid, level, got.summary.failure)


def test_a_hidden_dashboard_runs_without_an_estimate(play, mini_tasks):
    """The rule reads only what the prompt shows: without the dashboard the budget cannot be seen to be tight."""
    blind = Condition(name="blind", show_dashboard=False)
    got = play("workflow.direct_aggregation", mini_tasks["shop-03"], "XS", condition=blind)
    assert got.actions == ["execute_query", "answer"]


def test_the_estimate_first_rule_reads_the_ledger_not_the_query_text():
    from bapsql.policies.workflows import estimate_first

    class Ctx:  # the two things the rule reads, and the tool offer
        def __init__(self, remaining, offered=True):
            self.remaining, self.estimated = remaining, set()
            self.can = lambda tool: offered

    tight = {"queries": 2, "result_tokens": 900}
    roomy = {"queries": 4, "result_tokens": 800}
    lst = "SELECT name FROM t WHERE x = 1"
    assert estimate_first(Ctx(tight), lst) and not estimate_first(Ctx(roomy), lst)
    assert estimate_first(Ctx({"queries": 8, "result_tokens": 250}), lst)
    assert estimate_first(Ctx(tight), "SELECT COUNT(*) FROM t") and estimate_first(Ctx(tight), lst + " LIMIT 1")
    assert not estimate_first(Ctx(roomy), "SELECT COUNT(*) FROM t")
    assert not estimate_first(Ctx(None), lst) and not estimate_first(Ctx(tight, offered=False), lst)
    seen = Ctx(tight)
    seen.estimated.add(lst)
    assert not estimate_first(seen, lst)
