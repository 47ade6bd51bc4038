"""scripted.drafter (bapsql/policies/drafter.py): one script, every condition; profiles read by the question."""

from __future__ import annotations

import dataclasses

import pytest

from bapsql.env.posthoc import ResultProfiler
from bapsql.policies.drafter import _aggregate, answer_from_profile


def _profile(columns, rows) -> dict:
    prof = ResultProfiler()
    for r in rows:
        prof(columns, r)
    return dataclasses.asdict(prof.profile(columns, complete=True))


@pytest.mark.parametrize("sql,expected", [
    ("SELECT COUNT(*) FROM t WHERE a = 1", ("count", None, None)),
    ("SELECT MAX(x) FROM t", ("max", "x", None)),
    ("SELECT ROUND(AVG(t.x), 2) FROM t JOIN u ON t.id = u.id", ("avg", "x", 2)),
    ("SELECT d FROM t GROUP BY d ORDER BY COUNT(*) DESC LIMIT 1", ("mode", "d", None)),
    ("SELECT COUNT(DISTINCT x) FROM t", None),
    ("SELECT a, b FROM t", None),
    ("SELECT name FROM t WHERE x > 3", None),
])
def test_the_aggregate_a_question_asks_for(sql, expected):
    assert _aggregate(sql) == expected


def test_answers_read_from_a_whole_result_profile():
    rows = [(i, i % 4, "a" if i % 3 else "b") for i in range(1, 31)]
    p = _profile(("id", "x", "d"), rows)
    assert answer_from_profile(p, "SELECT COUNT(*) FROM t") == 30
    assert answer_from_profile(p, "SELECT MAX(x) FROM t") == 3
    assert answer_from_profile(p, "SELECT MIN(id) FROM t") == 1
    assert answer_from_profile(p, "SELECT ROUND(AVG(id), 2) FROM t") == 15.5
    assert answer_from_profile(p, "SELECT d FROM t GROUP BY d ORDER BY COUNT(*) DESC LIMIT 1") == "a"
    assert answer_from_profile(p, "SELECT MAX(nope) FROM t") is None
    assert answer_from_profile(p, "SELECT name FROM t") is None
    tie = _profile(("d",), [("a",), ("b",)])
    assert answer_from_profile(tie, "SELECT d FROM t GROUP BY d ORDER BY COUNT(*) DESC LIMIT 1") is None
    stopped = {**p, "rows_total": None}
    assert answer_from_profile(stopped, "SELECT COUNT(*) FROM t") is None


def _outcomes(play, tasks, condition, level, seeds=range(3)):
    return [play("scripted.drafter", t, level, seed, condition=condition) for t in tasks for seed in seeds]


@pytest.mark.slow  # ~4 s: every condition × tasks × seeds
def test_one_script_under_every_condition_differs_only_by_what_the_env_shows(play, mini_tasks):
    tasks = [mini_tasks[k] for k in sorted(mini_tasks)]
    dash = _outcomes(play, tasks, "dashboard", "XS")
    post = _outcomes(play, tasks, "adaptive_posthoc", "XS")
    full = _outcomes(play, tasks, "full", "XS")
    raw = _outcomes(play, tasks, "raw", "XS")
    # the same seeded coin: the same first query under dashboard and adaptive post-hoc
    for d, p in zip(dash, post):
        assert d.env.turn_records[0].sql == p.env.turn_records[0].sql
    # tools a condition does not offer are never called; no invalid actions, no breaches
    for got in dash + post + raw:
        assert not {"estimate_query", "rewrite_query"} & set(got.actions)
    for got in dash + post + full + raw:
        assert got.summary.invalid_actions == 0 and got.summary.feasible
    assert any("estimate_query" in got.actions for got in full)
    succ = {name: sum(g.summary.success for g in runs) for name, runs in
            (("raw", raw), ("dashboard", dash), ("adaptive_posthoc", post), ("full", full))}
    # what post-hoc control makes visible (the whole-result profile) rescues broad drafts at XS
    rescued = [p for d, p in zip(dash, post) if p.summary.success and not d.summary.success]
    assert rescued and all(r.infos and any(i.get("posthoc") == "profile" for i in r.infos[1:]) for r in rescued)
    assert succ["adaptive_posthoc"] > succ["dashboard"] and succ["full"] >= succ["adaptive_posthoc"]
