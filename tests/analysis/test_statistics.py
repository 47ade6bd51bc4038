"""Pure statistics: each vectorized function against a slow reference loop, plus hypothesis properties."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hst

from bapsql.analysis import statistics as st


def _rows(seed: int = 3, k: int = 5, per_db: tuple[int, ...] = (3, 1, 4, 2, 6)):
    """Small paired data: per-row db index, success difference and two token columns."""
    rng = np.random.default_rng(seed)
    db = np.concatenate([np.full(n, i) for i, n in enumerate(per_db[:k])])
    diff = rng.integers(-1, 2, db.size).astype(float)
    ta = rng.integers(50, 150, db.size).astype(float)
    tb = rng.integers(50, 150, db.size).astype(float)
    return db, diff, ta, tb


def test_bootstrap_matches_explicit_row_resampling_loop():
    db, diff, ta, tb = _rows()
    k, r, seed = 5, 300, 11
    draws = st.bootstrap_draws(k, r, seed)
    # Slow reference: per replicate, concatenate every row of every drawn database and recompute the statistics.
    slow_q, slow_t = [], []
    for rep in range(r):
        idx = np.concatenate([np.flatnonzero(db == d) for d in draws[rep]])
        slow_q.append(100.0 * diff[idx].mean())
        slow_t.append(100.0 * (ta[idx].sum() / tb[idx].sum() - 1.0))
    per_cluster = np.stack(
        [np.bincount(db, minlength=k), np.bincount(db, diff, k), np.bincount(db, ta, k), np.bincount(db, tb, k)],
        axis=1,
    )
    sums = st.resampled_sums(st.bootstrap_counts(k, r, seed), per_cluster)
    np.testing.assert_allclose(100.0 * sums[:, 1] / sums[:, 0], slow_q, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(100.0 * (sums[:, 2] / sums[:, 3] - 1.0), slow_t, rtol=1e-12, atol=1e-12)
    assert st.percentile_interval(np.asarray(slow_q)) == pytest.approx(
        st.percentile_interval(100.0 * sums[:, 1] / sums[:, 0])
    )


def test_same_seed_same_draws_and_different_seed_differs():
    a = st.bootstrap_draws(11, 50, 7)
    assert np.array_equal(a, st.bootstrap_draws(11, 50, 7))
    assert not np.array_equal(a, st.bootstrap_draws(11, 50, 8))


def test_draw_counts_matches_loop():
    draws = st.bootstrap_draws(6, 40, 2)
    counts = st.draw_counts(draws, 6)
    for r in range(40):
        assert list(counts[r]) == [int((draws[r] == k).sum()) for k in range(6)]


@given(k=hst.integers(1, 15), r=hst.integers(1, 40), seed=hst.integers(0, 2**32 - 1))
@settings(max_examples=40, deadline=None)
def test_counts_rows_sum_to_cluster_count(k, r, seed):
    counts = st.bootstrap_counts(k, r, seed)
    assert counts.shape == (r, k)
    assert (counts.sum(axis=1) == k).all()
    assert (counts >= 0).all()


@given(
    num=hst.lists(hst.floats(0, 100), min_size=2, max_size=8),
    seed=hst.integers(0, 1000),
)
@settings(max_examples=40, deadline=None)
def test_resampled_ratio_stays_within_cluster_ratios(num, seed):
    k = len(num)
    den = np.arange(1, k + 1, dtype=float)
    rng = np.random.default_rng(seed)
    num = np.asarray(num) * rng.random(k)
    per = num / den
    sums = st.resampled_sums(st.bootstrap_counts(k, 30, seed), np.stack([num, den], axis=1))
    reps = sums[:, 0] / sums[:, 1]
    assert (reps >= per.min() - 1e-9).all() and (reps <= per.max() + 1e-9).all()


def test_ratio_is_nan_for_zero_denominator_without_warning():
    with np.errstate(all="raise"):
        out = st.ratio(np.array([1.0, 2.0]), np.array([0.0, 4.0]))
    assert math.isnan(out[0]) and out[1] == 0.5


def test_percentile_interval_and_lower_bound_match_numpy():
    reps = np.random.default_rng(0).normal(size=1000)
    lo, hi = st.percentile_interval(reps)
    assert (lo, hi) == pytest.approx(tuple(np.percentile(reps, [2.5, 97.5])))
    assert st.lower_bound(reps) == pytest.approx(np.percentile(reps, 5.0))
    assert lo < st.lower_bound(reps) < hi
    assert all(math.isnan(x) for x in st.percentile_interval(np.array([np.nan])))


def test_leave_one_out_matches_loop():
    num = np.array([3.0, 1.0, 4.0, 1.0, 5.0])
    den = np.array([9.0, 2.0, 6.0, 5.0, 3.0])
    loo = st.leave_one_out_ratios(num, den)
    for k in range(5):
        keep = np.arange(5) != k
        assert loo[k] == pytest.approx(num[keep].sum() / den[keep].sum())


def test_sign_test_reproduces_paper_p_values():
    assert st.sign_test(10, 11) == pytest.approx(12 / 2048)
    assert round(st.sign_test(10, 11), 3) == 0.006
    assert round(st.sign_test(9, 11), 3) == 0.033
    assert st.sign_test(0, 5) == 1.0
    assert st.sign_test(0, 0) == 1.0
    with pytest.raises(ValueError):
        st.sign_test(4, 3)


@given(n=hst.integers(1, 40), data=hst.data())
@settings(max_examples=50, deadline=None)
def test_sign_test_is_a_decreasing_binomial_tail(n, data):
    k = data.draw(hst.integers(0, n))
    p = st.sign_test(k, n)
    assert 0.0 < p <= 1.0
    if k < n:
        assert st.sign_test(k + 1, n) < p
    # explicit loop over outcomes
    assert p == pytest.approx(sum(math.comb(n, j) for j in range(k, n + 1)) / 2**n)


def test_sign_counts_ignores_nan():
    assert st.sign_counts(np.array([1.0, -2.0, 0.0, np.nan, 3.0])) == (2, 1, 1)


@pytest.mark.parametrize(
    ("p", "df", "expected"),
    [(0.975, 1, 12.706204736), (0.975, 2, 4.302652730), (0.975, 10, 2.228138852), (0.975, 30, 2.042272456),
     (0.95, 10, 1.812461123), (0.995, 5, 4.032142984)],
)
def test_t_quantile_matches_tables(p, df, expected):
    assert st.t_quantile(p, df) == pytest.approx(expected, rel=1e-8)
    assert st.t_quantile(1 - p, df) == pytest.approx(-expected, rel=1e-8)


def test_t_quantile_matches_scipy_when_available():
    special = pytest.importorskip("scipy.special")
    for df in (1, 2, 3, 7, 10, 25, 60):
        for p in (0.55, 0.9, 0.975, 0.999):
            assert st.t_quantile(p, df) == pytest.approx(special.stdtrit(df, p), rel=1e-9)


@given(df=hst.integers(1, 60), t=hst.floats(0, 50))
@settings(max_examples=60, deadline=None)
def test_t_cdf_is_monotone_and_inverts(df, t):
    a = st.t_abs_cdf(t, df)
    assert 0.0 <= a <= 1.0
    assert st.t_abs_cdf(t + 0.5, df) >= a - 1e-12
    if 1e-6 < a < 1 - 1e-9:
        assert st.t_quantile(0.5 + a / 2, df) == pytest.approx(t, rel=1e-6, abs=1e-6)


def test_t_interval_matches_formula():
    v = np.array([2.0, 3.5, 4.0, 1.0, 5.5, 3.0])
    mean, lo, hi = st.t_interval(v)
    half = st.t_quantile(0.975, 5) * v.std(ddof=1) / math.sqrt(6)
    assert (mean, lo, hi) == pytest.approx((v.mean(), v.mean() - half, v.mean() + half))
    m1, lo1, hi1 = st.t_interval(np.array([2.0]))
    assert m1 == 2.0 and math.isnan(lo1) and math.isnan(hi1)


def test_trapezoid_mean_matches_definition_and_numpy():
    v = np.array([34.8, 37.6, 39.2, 39.0])
    assert st.trapezoid_mean(v) == pytest.approx((v[0] / 2 + v[1] + v[2] + v[3] / 2) / 3)
    assert st.trapezoid_mean(v) == pytest.approx(np.trapezoid(v) / 3)
    assert st.trapezoid_mean(np.array([5.0])) == 5.0


@given(hst.lists(hst.floats(-1e6, 1e6), min_size=2, max_size=10), hst.floats(-1e3, 1e3))
def test_trapezoid_mean_properties(values, shift):
    v = np.asarray(values)
    m = st.trapezoid_mean(v)
    assert v.min() - 1e-6 <= m <= v.max() + 1e-6
    assert st.trapezoid_mean(v + shift) == pytest.approx(m + shift, abs=1e-6)
