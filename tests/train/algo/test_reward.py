"""Rewards equal the paper's formulas (DESIGN §5), checked against a scalar re-statement with hypothesis."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bapsql.errors import ConfigError
from bapsql.train.algo.reward import (RewardConfig, batch_rewards, group_rewards, min_success_queries,
                                      tool_factor)


def scalar_reward(correct, feasible, e, m, n, variant="full", w=0.4, c=1.0):
    """The formula written out for one trajectory, independently of the vectorized code."""
    if not (correct and feasible):
        return 0.0
    if variant == "correctness":
        return 1.0
    bonus = 1 + w * e
    if variant == "no_efficiency":
        return bonus
    if n > 0:
        f = 2 * m * n / (m + n)
        r_tool = math.sin(f * math.pi / (2 * n))
    else:
        r_tool = 1.0 if m == 0 else math.cos(m * math.pi / (2 * m + c))
    return bonus * r_tool


trajectory = st.tuples(st.booleans(), st.booleans(), st.floats(0, 1), st.integers(0, 12))


@settings(max_examples=300, deadline=None)
@given(st.lists(trajectory, min_size=1, max_size=8), st.sampled_from(["full", "no_efficiency", "correctness"]))
def test_group_rewards_equal_the_formula(group, variant):
    correct, feasible, e, m = (np.array(x) for x in zip(*group))
    got = group_rewards(correct, feasible, e, m, RewardConfig(variant=variant))
    succ = [c and f for c, f, _, _ in group]
    n = min((q for (_, _, _, q), s in zip(group, succ) if s), default=-1)
    want = [scalar_reward(c, f, ee, q, n, variant) for c, f, ee, q in group]
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    assert got.shape == (len(group),)
    # gate: wrong or infeasible trajectories get exactly zero; nothing exceeds 1.4
    assert all(g == 0.0 for g, s in zip(got, succ) if not s)
    assert np.all(got <= 1.4 + 1e-12) and np.all(got >= 0)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 30), st.integers(1, 30))
def test_sin_branch_properties(m, n):
    r = float(tool_factor(np.array([m]), n)[0])
    assert r == pytest.approx(math.sin((2 * m * n / (m + n)) * math.pi / (2 * n)))
    if m == n:
        assert r == pytest.approx(1.0)
    if m >= n:  # successful trajectories always have m >= n: more queries, less reward
        assert float(tool_factor(np.array([m + 1]), n)[0]) < r + 1e-12


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 50), st.floats(0.1, 5))
def test_cos_branch(m, c):
    r = float(tool_factor(np.array([m]), 0, c)[0])
    if m == 0:
        assert r == 1.0
    else:
        assert r == pytest.approx(math.cos(m * math.pi / (2 * m + c)))
        assert 0 < r < 1


def test_cos_branch_reached_when_a_success_used_no_query():
    # the best successful trajectory answered without executing: n = 0, an extra query is worth cos(pi/3) = 0.5
    r = group_rewards([True, True, False], [True, True, True], [0.0, 0.0, 1.0], [0, 1, 0])
    np.testing.assert_allclose(r, [1.0, 0.5, 0.0])


def test_known_values_and_all_fail_group():
    r = group_rewards([True, True, True], [True, True, False], [1.0, 0.5, 1.0], [2, 4, 1])
    # n = 2 (the infeasible 1-query trajectory does not count); m=4: f=8/3, sin(2pi/3)
    np.testing.assert_allclose(r, [1.4, 1.2 * math.sin(2 * math.pi / 3), 0.0])
    assert min_success_queries(np.array([False, False]), np.array([1, 2])) == -1
    np.testing.assert_array_equal(group_rewards([False] * 4, [True] * 4, [1.0] * 4, [1] * 4), np.zeros(4))


def test_batch_rewards_compute_n_within_each_group():
    group = np.array(["a", "a", "b", "b"])
    r = batch_rewards(group, [True] * 4, [True] * 4, [0.0] * 4, [1, 2, 3, 3])
    np.testing.assert_allclose(r, [1.0, math.sin((4 / 3) * math.pi / 2), 1.0, 1.0])


def test_bad_inputs_and_config():
    with pytest.raises(ValueError):
        group_rewards([True], [True], [1.5], [0])
    with pytest.raises(ValueError):
        group_rewards([True, False], [True], [1.0], [0])
    with pytest.raises(ConfigError):
        RewardConfig(variant="bogus")
