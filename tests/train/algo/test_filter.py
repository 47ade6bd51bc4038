"""The online difficulty filter keeps exactly the groups with 2-6 successes of 8, refills, and never crashes."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bapsql.errors import ConfigError
from bapsql.train.algo.filter import DifficultyFilter, FilterConfig, fill_update, histogram_metrics


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 8), min_size=1, max_size=60))
def test_keeps_exactly_two_to_six(successes):
    filt = DifficultyFilter(FilterConfig())
    judged = [filt.judge((f"t{i}", "XS"), s, i) for i, s in enumerate(successes)]
    assert [j.kept for j in judged] == [2 <= s <= 6 for s in successes]
    assert filt.total_histogram == [successes.count(k) for k in range(9)]
    assert filt.kept == sum(2 <= s <= 6 for s in successes)


def make_pool(successes):
    """A deterministic stream of fake groups (key, successes) standing in for rollouts."""
    it = iter(enumerate(successes))

    def draw(k):
        out = []
        for _ in range(k):
            try:
                i, s = next(it)
            except StopIteration:
                break
            out.append((f"task{i}", "S", s))
        return out

    return draw


def outcome(g):
    return (g[0], g[1]), g[2], 8


def test_refills_until_sixteen_kept():
    pattern = [0, 3, 8, 5, 1, 2, 6, 7]  # half of the groups pass
    draw = make_pool(pattern * 20)
    filt = DifficultyFilter(FilterConfig())
    res = fill_update(filt, draw, outcome)
    assert len(res.kept) == 16 and not res.starved
    assert all(2 <= g[2] <= 6 for g in res.kept)
    assert res.rounds >= 1 and res.drawn >= 32
    assert sum(res.histogram) == res.drawn
    # the second update draws fewer extra groups: the running keep rate is now known
    res2 = fill_update(filt, draw, outcome)
    assert len(res2.kept) == 16 and res2.rounds <= 2


def test_starving_pool_logs_instead_of_crashing():
    filt = DifficultyFilter(FilterConfig(max_rounds=3, max_groups_per_round=16))
    res = fill_update(filt, make_pool([0, 8, 0, 3] * 100), outcome)  # 1 in 4 passes, rounds capped
    assert res.starved and len(res.kept) == 12 and res.rounds == 3 and res.drawn == 48
    empty = fill_update(DifficultyFilter(FilterConfig()), make_pool([8] * 5), outcome)  # pool runs dry
    assert empty.starved and empty.kept == [] and empty.drawn == 5
    assert histogram_metrics(empty.histogram)["filter/successes_8"] == 5.0


def test_state_round_trips_through_json():
    filt = DifficultyFilter(FilterConfig())
    fill_update(filt, make_pool([1, 2, 3, 8] * 30), outcome)
    state = json.loads(json.dumps(filt.state_dict()))
    other = DifficultyFilter(FilterConfig())
    other.load_state_dict(state)
    assert other.state_dict() == filt.state_dict()
    assert other.round_size(10) == filt.round_size(10)
    with pytest.raises(ConfigError):
        DifficultyFilter(FilterConfig(group_size=4, max_success=4)).load_state_dict(state)


def test_disabled_filter_keeps_everything_and_bad_config():
    filt = DifficultyFilter(FilterConfig(enabled=False))
    assert filt.passes(0) and filt.passes(8)
    with pytest.raises(ConfigError):
        FilterConfig(min_success=7, max_success=6)
