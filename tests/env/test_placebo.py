"""The cost-matched placebo (bapsql/env/placebo.py): shown payloads are a permutation of the true ones."""

from __future__ import annotations

from collections import Counter

import pytest
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
    import pytest

    from bapsql.errors import ConfigError

    pool = PlaceboPool([("XS", ("t", 0, 0), _payload(1)), ("XS", ("u", 0, 0), _payload(2))], seed=3)
    extra = pool.shown("XS", ("t", 0, 7))
    assert extra in (_payload(1), _payload(2)) and pool.extra == 1
    with pytest.raises(ConfigError, match="recorded no estimate"):  # never the truth: refused
        pool.shown("S", ("t", 0, 0))


@pytest.mark.parametrize("seed", range(5))
def test_unrecorded_requests_draw_without_replacement_while_the_pool_lasts(seed):
    """Issue 30, item 4: requests the recording pass never made take the level's payloads without replacement."""
    recorded = [("XS", (f"t{i}", 0, 0), _payload(i)) for i in range(5)]
    pool = PlaceboPool(recorded, seed=seed)
    drawn = [pool.shown("XS", (f"new{i}", 0, 0)) for i in range(5)]
    assert Counter(drawn) == Counter(p for _, _, p in recorded)  # each payload once: the pool is used up
    assert pool.shown("XS", ("new5", 0, 0)) in {p for _, _, p in recorded}  # then a fresh round
    assert pool.extra == 6 and pool.unmatched == 6 + 5  # 5 recorded requests were never made here


# ------------------------------------------------------------------------------ issue 30, item 4: on the env
class _IdentityPool(PlaceboPool):
    """A "placebo" that shows every request its own recorded payload: the check below must reject it."""

    def __post_init__(self) -> None:
        super().__post_init__()
        for level, key, payload in self.recorded:
            self._assigned[level][key] = payload


def _payload_of(est):
    return (est.rows.p50, est.rows.p95, est.result_tokens.p50, est.result_tokens.p95, est.vm_steps.p50,
            est.vm_steps.p95)


def _play_placebo(make_env, tasks, pool_cls, policy="workflow.justified_abstention"):
    """Record with the truth, then play under the placebo; returns (pool, [(true, shown)], execute estimates)."""
    policy = make_policy(policy)
    env = make_env(condition=condition("shuffled_estimate"))
    pool = record_placebo(env, policy, tasks, [XS, S], [0])
    env.placebo = pool_cls(pool.recorded, seed=1)
    pairs, executes = [], {}
    orig = env._visible_estimate

    def spy(est, *args):
        shown = orig(est, *args)
        pairs.append((_payload_of(est), _payload_of(shown)))
        return shown

    env._visible_estimate = spy
    for level in (XS, S):
        for t in tasks:
            play_episode(env, policy, t, level, 0)
            for rec in env.turn_records:
                if rec.action == "execute_query" and rec.est_vm_steps_p50 is not None:
                    executes[(level.level, t.task_id, rec.sql)] = (rec.est_rows_p95, rec.est_vm_steps_p50)
    return env.placebo, pairs, executes


def _check_placebo(pool, pairs):
    """The placebo's contract: with no unmatched request the shown multiset is the true one, and it is a real
    permutation (the payloads move between requests)."""
    assert pool.shown_count == len(pairs) > 0
    if pool.unmatched == 0:
        assert Counter(s for _, s in pairs) == Counter(t for t, _ in pairs)
    assert len({t for t, _ in pairs}) > 1 and any(t != s for t, s in pairs), "the shown payloads are the true ones"


def _tasks(people_db):
    return [Task(task_id=f"t{i}", db_id="people", db_path=str(people_db), question=f"q{i}", gold_sql=sql)
            for i, sql in enumerate(["SELECT count(*) FROM person WHERE age > 40", "SELECT max(age) FROM person",
                                     "SELECT count(*) FROM city", "SELECT name FROM person WHERE city_id = 2",
                                     "SELECT count(*) FROM person a, city b"])]


def test_the_shown_multiset_is_the_true_one_and_an_identity_placebo_fails(make_env, people_db):
    import pytest

    tasks = _tasks(people_db)
    pool, pairs, executes = _play_placebo(make_env, tasks, PlaceboPool)
    assert pool.unmatched == 0  # a policy whose requests do not depend on the numbers it is shown
    _check_placebo(pool, pairs)
    ident, ident_pairs, _ = _play_placebo(make_env, tasks, _IdentityPool)
    with pytest.raises(AssertionError, match="true ones"):
        _check_placebo(ident, ident_pairs)
    # the shield keeps the true estimate: the executions' estimates are those of the truthful condition
    truth = make_env(condition=condition("full"))
    policy = make_policy("workflow.justified_abstention")
    for level in (XS, S):
        for t in tasks:
            play_episode(truth, policy, t, level, 0)
            for rec in truth.turn_records:
                key = (level.level, t.task_id, rec.sql)
                if rec.action == "execute_query" and key in executes:
                    assert executes[key] == (rec.est_rows_p95, rec.est_vm_steps_p50)


def test_rejected_estimate_turns_count_alike_on_both_sides(make_env, task):
    """A rejected estimate turn (here: the database was busy) is a request on both sides of the placebo."""
    from bapsql.env.actions import EstimateQuery, render_action
    from bapsql.env.placebo import payloads_from_turns

    def play(env):
        env.reset(task, XS, seed=0)
        orig, calls = env._busy, []

        def busy_once(turn):
            calls.append(1)
            if len(calls) == 1:
                turn.status, turn.message = "rejected", "the database is busy"
                return True
            return orig(turn)

        env._busy = busy_once
        for sql in ("SELECT * FROM person", "SELECT * FROM person WHERE age > 30"):
            env.step(render_action(EstimateQuery(sql)))
        del env._busy
        return env

    rec = play(make_env(condition=condition("full")))
    recorded = payloads_from_turns("XS", task.task_id, 0, rec.turn_records)
    assert [key[2] for _, key, _ in recorded] == [1]  # the rejected turn was request 0
    env = make_env(condition=condition("shuffled_estimate"))
    env.placebo = PlaceboPool(recorded, seed=0)
    play(env)
    assert env.placebo.unmatched == 0 and env.placebo.extra == 0


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


def test_a_level_without_recorded_payloads_is_refused_never_shown_the_truth(make_env, task):
    from bapsql.env.actions import EstimateQuery, render_action
    from bapsql.errors import ConfigError

    env = make_env(condition=condition("shuffled_estimate"))
    env.placebo = PlaceboPool([("XS", (task.task_id, 0, 0), _payload(1))], seed=0)
    env.reset(task, S, seed=0)
    with pytest.raises(ConfigError, match="'S' recorded no estimate payloads"):
        env.step(render_action(EstimateQuery("SELECT * FROM person")))
