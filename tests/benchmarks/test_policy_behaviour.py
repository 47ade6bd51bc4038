"""benchmarks/policy_behaviour.py: the per-(method, budget) behaviour table read back from a real sweep's Parquet."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import policy_behaviour  # noqa: E402


def test_the_rows_count_estimates_warnings_rewrites_and_rejections_from_the_logs(runs):
    from bapsql.logs.reader import read_episodes, read_turns

    listed = policy_behaviour.behaviour_rows(runs)
    assert [r["budget"] for r in listed if r["method"] == "workflow.estimate_rewrite@full"] == ["XS", "L"]
    rows = {(r["method"], r["budget"]): r for r in listed}
    eps = read_episodes(runs)
    turns = read_turns(runs)
    for (method, budget), r in rows.items():
        g = eps[(eps["method"] == method) & (eps["budget"] == budget)]
        assert r["episodes"] == len(g) > 0
        firsts = []
        for eid in g["episode_id"]:  # the slow reference: walk each episode's turns in order
            t = turns[(turns["episode_id"] == eid) & turns["action"].isin(("estimate_query", "execute_query"))]
            firsts.append(not t.empty and t.sort_values("turn")["action"].iloc[0] == "estimate_query")
        assert r["estimate_first"] == pytest.approx(100.0 * sum(firsts) / len(g))
        assert r["warned"] == pytest.approx(100.0 * (g["warnings"] > 0).mean())
        assert r["rejected"] == pytest.approx(100.0 * (g["rejections"] > 0).mean())
    # the workflow estimates its draft first, and at XS the minibench's broad drafts warn and are rewritten; raw
    # hides every estimate, so the drafter is never warned
    assert rows[("workflow.estimate_rewrite@full", "XS")]["estimate_first"] == 100.0
    assert rows[("workflow.estimate_rewrite@full", "XS")]["warned"] > 0
    assert rows[("workflow.estimate_rewrite@full", "XS")]["rewrote"] == 100.0
    assert rows[("scripted.drafter@raw", "XS")]["warned"] == 0.0
    # a warned draft that is rewritten is never run as estimated: warned queries, none executed
    er = rows[("workflow.estimate_rewrite@full", "XS")]["warned_runs"]
    assert er.flagged > 0 and er.executed == 0
    table = policy_behaviour.render(list(rows.values()))
    assert table.count("\n") == len(rows) + 1 and "estimate first %" in table


def test_after_errors_names_the_turn_that_follows_each_refused_query():
    from tests.analysis.helpers import turns_table

    def turn(eid, n, action, sql=None, status=None, budget="XS"):
        return dict(run="r", method="m", budget=budget, episode_id=eid, turn=n, action=action, sql=sql,
                    status=status, warning=False)

    rows = [
        # e1: a refused estimate, then the same query run (refused again), then the schema inspected
        turn("e1", 1, "estimate_query", "bad", "error"), turn("e1", 2, "execute_query", "bad", "error"),
        turn("e1", 3, "inspect_schema"), turn("e1", 4, "execute_query", "good", "ok"), turn("e1", 5, "answer"),
        # e2: a refused run, then an invalid action; then a refused run that ends the episode
        turn("e2", 1, "execute_query", "bad", "error"), turn("e2", 2, "invalid"),
        turn("e2", 3, "execute_query", "worse", "error"),
        # e3 at S: a refused estimate, then another query; a truncated run is not an error
        turn("e3", 1, "estimate_query", "bad", "error", "S"), turn("e3", 2, "estimate_query", "b2", "ok", "S"),
        turn("e3", 3, "execute_query", "b2", "truncated", "S"), turn("e3", 4, "abstain", budget="S"),
        # e4 at S: a refused estimate estimated again (the same query), refused again, and the episode ends
        turn("e4", 1, "estimate_query", "bad", "error", "S"), turn("e4", 2, "estimate_query", "bad", "error", "S"),
    ]
    xs, s = policy_behaviour.after_errors(turns_table(rows).to_pandas())
    assert (xs["budget"], xs["errors"], xs["same query again"], xs["inspect_schema"], xs["invalid"], xs["ended"]) == (
        "XS", 4, 1, 1, 1, 1)
    assert (s["budget"], s["errors"], s["another query"], s["same query again"], s["ended"]) == ("S", 3, 1, 1, 1)
    assert sum(s[k] for k in policy_behaviour.AFTER_ERROR) == s["errors"]
    table = policy_behaviour.render_after_errors([xs, s])
    assert table.count("\n") == 3 and "then same query again" in table
