"""The post-hoc controller (bapsql/env/posthoc.py): whole-result profiles, decisions and their accounting."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from bapsql.budgets import get_budget
from bapsql.env.actions import ExecuteQuery, render_action
from bapsql.env.conditions import condition, with_switches
from bapsql.env.evidence import Profile
from bapsql.env.posthoc import DISTINCT_CAP, ResultProfiler, decide, fit_profile

XS, S, M = (get_budget(x) for x in ("XS", "S", "M"))
BROAD = "SELECT * FROM person"
PARIS = "SELECT count(*) FROM person p JOIN city c ON p.city_id = c.id WHERE c.name = 'Paris'"


def act(env, action):
    return env.step(render_action(action))


def _words(text: str) -> int:
    return len(text.split())


def test_the_profiler_sees_every_row_exactly():
    prof = ResultProfiler()
    rows = [(i, f"n{i % 3}", None if i % 5 == 0 else i * 0.5) for i in range(1, 101)]
    for r in rows:
        prof(("id", "tag", "x"), r)
    p = prof.profile(("id", "tag", "x"), complete=True)
    assert p.rows == p.rows_total == 100 and p.whole_result and not p.truncated
    idc, tag, x = p.columns
    assert (idc.min, idc.max, idc.mean, idc.distinct, idc.nulls) == (1, 100, 50.5, 100, 0)
    assert tag.distinct == 3 and tag.top[0] == ("n1", 34) and tag.mean is None
    assert x.nulls == 20 and x.min == 0.5 and x.max == 49.5
    assert abs(x.mean - sum(r[2] for r in rows if r[2] is not None) / 80) < 1e-9


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.none(), st.integers(-50, 50)), min_size=0, max_size=60))
def test_profile_matches_a_slow_reference(values):
    prof = ResultProfiler()
    for v in values:
        prof(("v",), (v,))
    c = prof.profile(("v",), complete=True).columns[0]
    non_null = [v for v in values if v is not None]
    assert c.nulls == len(values) - len(non_null) and c.distinct == len(set(non_null))
    if non_null:
        assert (c.min, c.max) == (min(non_null), max(non_null))
        assert abs(c.mean - sum(non_null) / len(non_null)) < 1e-9
        top_count = max(non_null.count(v) for v in set(non_null))
        assert c.top[0][1] == top_count
    else:
        assert c.min is None and c.mean is None and c.top == ()


def test_the_profilers_memory_is_bounded():
    prof = ResultProfiler()
    for i in range(DISTINCT_CAP + 500):
        prof(("v",), (i,))
    c = prof.profile(("v",), complete=True).columns[0]
    assert c.distinct == DISTINCT_CAP and c.distinct_at_least and c.max == DISTINCT_CAP + 499
    assert "+ distinct" in Profile(1, False, 1, (c,), whole_result=True).render()


def test_fit_profile_keeps_leading_columns_within_the_allowance():
    prof = ResultProfiler()
    for i in range(50):
        prof(("a", "b", "c"), (i, i * 2, f"t{i}"))
    full = prof.profile(("a", "b", "c"), complete=True)
    one_line = _words(full.render().splitlines()[0])
    fitted = fit_profile(full, one_line + _words(full.render().splitlines()[1]) + 6, _words)
    assert fitted is not None and 1 <= len(fitted.columns) < 3 and "more columns not profiled" in fitted.render()
    assert fit_profile(full, 10_000, _words).columns == full.columns
    assert fit_profile(full, 1, _words) is None


def test_decisions():
    prof = ResultProfiler()
    for i in range(30):
        prof(("a",), (i,))
    p = prof.profile(("a",), complete=True)
    kw = dict(admitted=5, rows_fit=5, limit=3, profile=p, allowance=1000, count=_words)
    assert decide("adaptive", status="ok", truncated_by=None, **{**kw, "admitted": 30, "rows_fit": 30}).control == "pass"
    assert decide("adaptive", status="truncated", truncated_by="result_tokens", **kw).control == "profile"
    assert decide("adaptive", status="truncated", truncated_by="vm_steps", **kw).control == "truncate"
    assert decide("adaptive", status="truncated", truncated_by="rows", **{**kw, "allowance": 1}).control == "truncate"
    lim = decide("limit", status="truncated", truncated_by="rows", **kw)
    assert lim.control == "limit" and lim.rows == 3
    assert decide("truncate", status="truncated", truncated_by="rows", **kw).control == "truncate"
    assert decide("none", status="truncated", truncated_by="rows", **kw).control == "pass"


def test_adaptive_posthoc_admits_the_profiles_tokens_not_the_rows(make_env, task):
    dash = make_env(condition=condition("dashboard"))
    dash.reset(task, XS)
    rd = act(dash, ExecuteQuery(BROAD))
    post = make_env(condition=condition("adaptive_posthoc"))
    post.reset(task, XS)
    rp = act(post, ExecuteQuery(BROAD))
    # the same scan is charged in both (post-hoc control cannot refund database work)
    assert rp.info["shield"]["cost"]["vm_steps"] == rd.info["shield"]["cost"]["vm_steps"]
    assert post.ledger.vm_steps == dash.ledger.vm_steps and post.ledger.queries == dash.ledger.queries == 1
    assert rp.info["posthoc"] == "profile" and rd.info["posthoc"] is None
    block = post.evidence.get("E1")
    assert block.state == "compressed" and block.profile.whole_result and block.profile.rows_total == 600
    from bapsql.env.render import block_body

    shown = post.counter.count(block_body(block))
    assert post.ledger.result_tokens == shown  # admitted = the profile that was rendered
    assert shown <= XS.result_tokens and post.ledger.feasible
    assert "profile of 600 rows" in rp.observation and "profile" not in rd.observation
    note_tokens = post.counter.count("[post-hoc control: the result (600 rows) was replaced by its profile]")
    assert post.ledger.controller_tokens == note_tokens > 0


def test_profiled_values_support_the_answer(make_env, task):
    from bapsql.env.actions import AnswerAction

    env = make_env(condition=condition("adaptive_posthoc"))
    env.reset(task, XS)
    act(env, ExecuteQuery(BROAD))
    r = act(env, AnswerAction("scalar", (600,), ("E1",)))
    assert r.terminated
    s = env.summary()
    assert s.evidence_score > 0  # the row count is visible in the profile


def test_a_result_that_fits_is_passed_unchanged(make_env, task):
    env = make_env(condition=condition("adaptive_posthoc"))
    env.reset(task, M)
    r = act(env, ExecuteQuery(PARIS))
    assert r.info["posthoc"] == "pass" and "E1 (ok): 1 rows" in r.observation
    assert env.ledger.controller_tokens == 0


def test_the_fixed_limit_shows_at_most_the_limit(make_env, task):
    cond = with_switches(condition("adaptive_posthoc"), name="posthoc_limit", posthoc="limit")
    env = make_env(condition=cond, posthoc_limit=3)
    env.reset(task, M)
    r = act(env, ExecuteQuery(BROAD))
    assert r.info["posthoc"] == "limit" and len(env.evidence.get("E1").rows) == 3
    assert dataclasses.replace(env.options, posthoc_limit=3).posthoc_limit == 3


class _Named:
    """A controller that names one control and reports fixed token costs."""

    def __init__(self, control):
        self.control, self.shapes = control, []

    def choose(self, shape):
        from bapsql.env.posthoc import ControllerChoice

        self.shapes.append(shape)
        return ControllerChoice(self.control, prompt_tokens=40, completion_tokens=2)


def test_a_controller_decides_the_adaptive_control_and_is_charged(handles, task):
    from bapsql.env.episode import BudgetedSQLEnv
    from bapsql.env.records import EnvOptions
    from bapsql.tokens import RegexTokenCounter

    for control, shown in (("profile", "compressed"), ("truncate", "visible")):
        ctl = _Named(control)
        env = BudgetedSQLEnv(token_counter=RegexTokenCounter(), handles=handles,
                             options=EnvOptions().under("adaptive_posthoc"), controller=ctl)
        env.reset(task, XS)
        r = act(env, ExecuteQuery(BROAD))
        assert r.info["posthoc"] == control and env.evidence.get("E1").state == shown
        (shape,) = ctl.shapes
        assert shape.rows_total == 600 and shape.columns == ("id", "name", "age", "city_id")
        assert shape.allowance <= XS.result_tokens and shape.profile_tokens > 0
        assert env.ledger.controller_tokens >= 42  # the controller's prompt and completion
        assert env.ledger.feasible
    # a result that fits is never sent to the controller
    ctl = _Named("profile")
    env = BudgetedSQLEnv(token_counter=RegexTokenCounter(), handles=handles,
                         options=EnvOptions().under("adaptive_posthoc"), controller=ctl)
    env.reset(task, M)
    act(env, ExecuteQuery(PARIS))
    assert ctl.shapes == [] and env.ledger.controller_tokens == 0
