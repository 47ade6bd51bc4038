"""The cost-matched placebo (bapsql/env/placebo.py): shown payloads are a permutation of the true ones."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from bapsql.budgets import get_budget
from bapsql.env.conditions import condition
from bapsql.env.placebo import PlaceboPool
from bapsql.policies.registry import make_policy
from bapsql.rollout.runner import play_episode, record_placebo
from bapsql.types import Task

XS, S = get_budget("XS"), get_budget("S")


def _payload(i: int):
    return ((float(i), float(i + 1)), (float(10 * i), float(10 * i + 5)), (float(100 * i), float(100 * i + 50)))


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["XS", "S"]), st.integers(0, 5), st.integers(0, 3)), unique=True,
                max_size=30), st.integers(0, 2**31))
def test_shown_payloads_are_a_permutation_of_the_recorded_ones(keys, seed):
    recorded = [(lv, (f"t{t}", 0, k), _payload(i)) for i, (lv, t, k) in enumerate(keys)]
    pool = PlaceboPool(recorded, seed=seed)
    for level in ("XS", "S"):
        mine = [(key, p) for lv, key, p in recorded if lv == level]
        shown = [pool.shown(level, key) for key, _ in mine]
        assert Counter(shown) == Counter(p for _, p in mine)  # the multiset is kept
    assert pool.unmatched == 0
    # the assignment does not depend on the order requests arrive in
    again = PlaceboPool(list(reversed(recorded)), seed=seed)
    assert all(again.assignment(lv) == pool.assignment(lv) for lv in ("XS", "S"))


def test_an_unrecorded_request_draws_from_the_same_levels_pool():
    pool = PlaceboPool([("XS", ("t", 0, 0), _payload(1)), ("XS", ("u", 0, 0), _payload(2))], seed=3)
    extra = pool.shown("XS", ("t", 0, 7))
    assert extra in (_payload(1), _payload(2)) and pool.unmatched == 1
    assert pool.shown("S", ("t", 0, 0)) is None  # a level that recorded nothing shows the truth


def test_the_env_shows_the_permuted_payload_and_the_shield_keeps_the_truth(make_env, people_db, tmp_path):
    tasks = [Task(task_id=f"t{i}", db_id="people", db_path=str(people_db), question=f"q{i}", gold_sql=sql,
                  naive_sql=naive)
             for i, (sql, naive) in enumerate([
                 ("SELECT count(*) FROM person WHERE age > 40", "SELECT * FROM person WHERE age > 40"),
                 ("SELECT max(age) FROM person", "SELECT age FROM person"),
                 ("SELECT count(*) FROM city", "SELECT * FROM city"),
                 ("SELECT min(age) FROM person WHERE city_id = 2", "SELECT age FROM person WHERE city_id = 2")])]
    policy = make_policy("workflow.estimate_rewrite")
    env = make_env(condition=condition("shuffled_estimate"))
    env.placebo = record_placebo(env, policy, tasks, [XS, S], [0])
    true_payloads, shown_payloads = Counter(), Counter()
    for level in (XS, S):
        for t in tasks:
            play_episode(env, policy, t, level, 0)
            for rec in env.turn_records:
                if rec.action in ("estimate_query", "rewrite_query") and rec.est_rows_p50 is not None:
                    shown_payloads[(level.level, rec.est_rows_p50, rec.est_result_tokens_p95)] += 1
    for level, key, p in env.placebo.recorded:
        true_payloads[(level, p[0][0], p[1][1])] += 1
    assert env.placebo.shown_count > 0
    if env.placebo.unmatched == 0:
        assert shown_payloads == true_payloads
    # the shield never sees the placebo: preflight and charges use the true estimate
    env.reset(tasks[0], XS, seed=0)
    from bapsql.env.actions import EstimateQuery, ExecuteQuery, render_action

    r = env.step(render_action(EstimateQuery(tasks[0].naive_sql)))
    true_est = env.turn_records[-1]
    assert r.info["estimate"] is not None
    ex = env.step(render_action(ExecuteQuery(tasks[0].gold_sql)))
    assert ex.info["status"] == "ok" and true_est.action == "estimate_query"


def test_a_permuted_condition_without_a_pool_is_a_clear_error(make_env, task):
    import pytest

    from bapsql.env.actions import EstimateQuery, render_action
    from bapsql.errors import ConfigError

    env = make_env(condition=condition("shuffled_estimate"))
    env.reset(task, XS)
    with pytest.raises(ConfigError, match="PlaceboPool"):
        env.step(render_action(EstimateQuery("SELECT * FROM person")))
