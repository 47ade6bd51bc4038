"""Pure statistics over numpy arrays: the database-cluster bootstrap and its companions.

Everything here is a pure function of arrays (no pandas, no I/O), so it can be checked against slow reference loops.
Shapes use ``K`` clusters (databases), ``R`` bootstrap replicates and ``C`` channels (columns of per-cluster sums).

The cluster bootstrap is vectorized: a replicate draws ``K`` databases with replacement and keeps every task-seed row
of each drawn database, so any pooled statistic that is a ratio of sums becomes, per replicate, a ratio of weighted
sums ``counts @ per_cluster_sums`` where ``counts[r, k]`` is how often database ``k`` was drawn in replicate ``r``.
This is exactly the row-resampling estimator, at the cost of one ``(R, K) @ (K, C)`` product.
"""

from __future__ import annotations

import math

import numpy as np


def bootstrap_draws(n_clusters: int, replicates: int, seed: int) -> np.ndarray:
    """Cluster indices drawn with replacement: int64 array ``(R, K)``, row ``r`` is replicate ``r``'s K draws.

    The draws depend only on ``(n_clusters, replicates, seed)`` (a fresh ``numpy.random.default_rng(seed)``), so two
    analyses with the same seed and cluster count see the same replicates (common random numbers across methods).
    """
    if n_clusters < 1:
        raise ValueError(f"need at least one cluster, got {n_clusters}")
    if replicates < 1:
        raise ValueError(f"need at least one replicate, got {replicates}")
    rng = np.random.default_rng(seed)
    return rng.integers(0, n_clusters, size=(replicates, n_clusters), dtype=np.int64)


def draw_counts(draws: np.ndarray, n_clusters: int) -> np.ndarray:
    """Multinomial counts from draws: ``(R, K)`` indices → ``(R, K)`` int64 counts (each row sums to K)."""
    r = draws.shape[0]
    flat = (draws + n_clusters * np.arange(r, dtype=np.int64)[:, None]).ravel()
    return np.bincount(flat, minlength=r * n_clusters).reshape(r, n_clusters)


def bootstrap_counts(n_clusters: int, replicates: int, seed: int) -> np.ndarray:
    """How often each cluster is drawn in each replicate: int64 ``(R, K)``; ``draw_counts(bootstrap_draws(...))``."""
    return draw_counts(bootstrap_draws(n_clusters, replicates, seed), n_clusters)


def resampled_sums(counts: np.ndarray, per_cluster: np.ndarray) -> np.ndarray:
    """Per-replicate totals: ``counts (R, K) @ per_cluster (K, C) → (R, C)`` (or ``(K,) → (R,)``)."""
    return counts.astype(np.float64) @ np.asarray(per_cluster, dtype=np.float64)


def ratio(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    """Elementwise ``numerator / denominator`` with NaN (not a warning) where the denominator is zero."""
    num = np.asarray(numerator, dtype=np.float64)
    den = np.asarray(denominator, dtype=np.float64)
    out = np.full(np.broadcast(num, den).shape, np.nan)
    np.divide(num, den, out=out, where=den != 0)
    return out


def percentile_interval(replicates: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """Two-sided percentile interval of ``(R,)`` replicates, ignoring NaN; ``(nan, nan)`` when none are finite."""
    reps = np.asarray(replicates, dtype=np.float64)
    reps = reps[np.isfinite(reps)]
    if reps.size == 0:
        return (math.nan, math.nan)
    tail = (1.0 - level) / 2.0 * 100.0
    lo, hi = np.percentile(reps, [tail, 100.0 - tail])
    return (float(lo), float(hi))


def lower_bound(replicates: np.ndarray, alpha: float = 0.05) -> float:
    """One-sided ``1 - alpha`` lower confidence bound: the ``alpha`` quantile of ``(R,)`` replicates (NaN ignored)."""
    reps = np.asarray(replicates, dtype=np.float64)
    reps = reps[np.isfinite(reps)]
    if reps.size == 0:
        return math.nan
    return float(np.percentile(reps, alpha * 100.0))


def leave_one_out_ratios(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    """Pooled ratio with each cluster left out in turn: ``(K,)``, ``(K,)`` → ``(K,)`` (NaN where nothing is left)."""
    num = np.asarray(numerator, dtype=np.float64)
    den = np.asarray(denominator, dtype=np.float64)
    return ratio(num.sum() - num, den.sum() - den)


def sign_counts(values: np.ndarray) -> tuple[int, int, int]:
    """``(positive, negative, zero)`` counts of a ``(K,)`` array; NaN entries are not counted at all."""
    v = np.asarray(values, dtype=np.float64)
    v = v[np.isfinite(v)]
    return int((v > 0).sum()), int((v < 0).sum()), int((v == 0).sum())


def sign_test(successes: int, trials: int) -> float:
    """One-sided exact binomial sign test: ``P(X >= successes)`` for ``X ~ Binomial(trials, 1/2)``.

    Ties are dropped before calling (``trials`` counts non-tied clusters). ``sign_test(10, 11) ≈ 0.0059``,
    ``sign_test(9, 11) ≈ 0.0327``. With no trials the p-value is 1.
    """
    if trials < 0 or successes < 0 or successes > trials:
        raise ValueError(f"need 0 <= successes <= trials, got {successes}/{trials}")
    if trials == 0:
        return 1.0
    tail = sum(math.comb(trials, k) for k in range(successes, trials + 1))
    return tail / 2.0**trials


def t_abs_cdf(t: float, df: int) -> float:
    """``P(|T| <= t)`` for Student's t with integer ``df`` (exact finite series, Abramowitz & Stegun 26.7.3-4)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    t = abs(float(t))
    if math.isinf(t):
        return 1.0
    theta = math.atan(t / math.sqrt(df))
    s, c2 = math.sin(theta), math.cos(theta) ** 2
    if df % 2 == 1:
        total, term = 0.0, math.cos(theta)
        for j in range(1, (df - 1) // 2 + 1):  # exponents 1, 3, ..., df - 2
            total += term
            term *= (2.0 * j) / (2.0 * j + 1.0) * c2
        return min(1.0, 2.0 / math.pi * (theta + s * total)) if df > 1 else 2.0 * theta / math.pi
    total, term = 0.0, 1.0
    for j in range(1, df // 2 + 1):  # exponents 0, 2, ..., df - 2
        total += term
        term *= (2.0 * j - 1.0) / (2.0 * j) * c2
    return min(1.0, s * total)


def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile of Student's t with integer ``df`` (bisection on `t_abs_cdf`, accurate to ~1e-12)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"quantile level must be in (0, 1), got {p}")
    if p == 0.5:
        return 0.0
    target = abs(2.0 * p - 1.0)
    hi = 1.0
    while t_abs_cdf(hi, df) < target:
        hi *= 2.0
    lo = 0.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_abs_cdf(mid, df) < target:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-13 * max(1.0, hi):
            break
    q = 0.5 * (lo + hi)
    return q if p > 0.5 else -q


def t_interval(values: np.ndarray, level: float = 0.95) -> tuple[float, float, float]:
    """``(mean, lo, hi)``: two-sided t interval over ``(K,)`` per-cluster values (NaN ignored; K−1 df).

    With fewer than two finite values the bounds are NaN.
    """
    v = np.asarray(values, dtype=np.float64)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return (math.nan, math.nan, math.nan)
    mean = float(v.mean())
    if v.size < 2:
        return (mean, math.nan, math.nan)
    half = t_quantile(0.5 + level / 2.0, v.size - 1) * float(v.std(ddof=1)) / math.sqrt(v.size)
    return (mean, mean - half, mean + half)


def trapezoid_mean(values: np.ndarray) -> float:
    """Mean of the trapezoidal interpolant over equally spaced positions: ``(v0/2 + v1 + ... + v_{n-1}/2)/(n-1)``.

    ``(n,)`` → scalar; one value is its own mean. The Frontier Score is this over XS/S/M/L in percent.
    """
    v = np.asarray(values, dtype=np.float64)
    if v.ndim != 1 or v.size == 0:
        raise ValueError(f"need a non-empty 1-d array, got shape {v.shape}")
    if v.size == 1:
        return float(v[0])
    return float((v[0] / 2.0 + v[1:-1].sum() + v[-1] / 2.0) / (v.size - 1))
