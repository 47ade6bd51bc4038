"""Paired method comparisons and the ordered primary gate (paper Table 3).

Rows pair by ``task_id × seed × budget`` (episodes of several samples are averaged first); only keys both methods
have count. For a pair (method, reference) at one budget the analysis precomputes per-(database, seed) sums of
pairs, success difference and total tokens of each side, so that every statistic is a function of those sums:

- quality difference (pp) = 100 · Σ(success_m − success_r) / Σ pairs;
- total-token change (%) = 100 · (Σ tokens_m / Σ tokens_r − 1);
- the database-cluster bootstrap (`bapsql.analysis.statistics`) resamples the databases that hold pairs, in sorted
  db-id order, with draws that depend only on (number of databases, replicates, seed);
- database-t intervals, database-macro means and one-sided sign tests use the per-database values; leave-one-
  database-out and per-seed ranges recompute the pooled value without one database / within one seed.

The primary gate tests, in order, non-inferiority at XS and S (one-sided 95% lower bound of the quality difference
above −margin), then token reduction at XS and S (two-sided 95% token-change interval entirely below zero). A step
is reached only when every earlier step passed; the gate passes only when all four pass.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np
import pandas as pd

from bapsql.analysis import statistics as st

GATE_BUDGETS: tuple[str, ...] = ("XS", "S")


@dataclass(frozen=True)
class SignTest:
    """Databases whose effect favours the method (``favorable``), the reference, or neither; one-sided exact p."""

    favorable: int
    unfavorable: int
    ties: int
    p_value: float


@dataclass(frozen=True)
class Effect:
    """One paired effect with every interval the analysis reports (NaN where undefined, e.g. one database)."""

    estimate: float
    ci_low: float  # two-sided 95% database-cluster bootstrap
    ci_high: float
    lower_95: float  # one-sided 95% bootstrap lower bound
    t_low: float  # database-t 95% interval over per-database values
    t_high: float
    macro: float  # mean over databases of per-database values
    lodo_min: float  # leave-one-database-out range of the pooled value
    lodo_max: float
    per_seed: Mapping[int, float]
    per_database: Mapping[str, float]
    sign: SignTest


@dataclass(frozen=True)
class PairedComparison:
    """``method`` minus ``reference`` at one budget. ``quality`` in pp, ``tokens`` as % change of total tokens."""

    method: str
    reference: str
    budget: str
    pairs: int
    databases: int
    seeds: tuple[int, ...]
    quality: Effect
    tokens: Effect
    mean_tokens_method: float
    mean_tokens_reference: float


@dataclass(frozen=True)
class GateStep:
    """One ordered criterion: ``status`` is ``pass``, ``fail``, ``not reached`` or ``missing`` (no comparison)."""

    budget: str
    criterion: str  # "non-inferiority" or "token reduction"
    statistic: float  # NI: one-sided lower bound (pp); tokens: upper end of the 95% interval (%)
    threshold: float
    status: str


@dataclass(frozen=True)
class PrimaryGate:
    method: str
    reference: str
    margin_pp: float
    steps: tuple[GateStep, ...]
    passed: bool


def _effect(
    num: np.ndarray,
    den: np.ndarray,
    reps: np.ndarray,
    transform: Callable[[np.ndarray], np.ndarray],
    favorable_sign: int,
    db_ids: Sequence[str],
    seeds: Sequence[int],
) -> Effect:
    """Assemble an `Effect` from per-(db, seed) numerator/denominator sums ``(K, S)`` and bootstrap replicates."""
    num_k, den_k = num.sum(axis=1), den.sum(axis=1)
    estimate = float(transform(st.ratio(num_k.sum(), den_k.sum())))
    per_db = transform(st.ratio(num_k, den_k))
    lo, hi = st.percentile_interval(reps)
    _, t_lo, t_hi = st.t_interval(per_db)
    lodo = transform(st.leave_one_out_ratios(num_k, den_k)) if len(num_k) > 1 else np.array([math.nan])
    per_seed = transform(st.ratio(num.sum(axis=0), den.sum(axis=0)))
    pos, neg, ties = st.sign_counts(per_db)
    fav, unfav = (pos, neg) if favorable_sign > 0 else (neg, pos)
    finite_lodo = lodo[np.isfinite(lodo)]
    return Effect(
        estimate=estimate,
        ci_low=lo,
        ci_high=hi,
        lower_95=st.lower_bound(reps),
        t_low=t_lo,
        t_high=t_hi,
        macro=float(np.nanmean(per_db)) if np.isfinite(per_db).any() else math.nan,
        lodo_min=float(finite_lodo.min()) if finite_lodo.size else math.nan,
        lodo_max=float(finite_lodo.max()) if finite_lodo.size else math.nan,
        per_seed={int(s): float(v) for s, v in zip(seeds, per_seed) if np.isfinite(v)},
        per_database={str(d): float(v) for d, v in zip(db_ids, per_db)},
        sign=SignTest(fav, unfav, ties, st.sign_test(fav, fav + unfav)),
    )


def _pct(x):
    return 100.0 * np.asarray(x)


def _pct_change(x):
    return 100.0 * (np.asarray(x) - 1.0)


def compare_sums(
    sums: np.ndarray, db_ids: Sequence[str], seeds: Sequence[int], counts: np.ndarray
) -> tuple[Effect, Effect]:
    """Quality and token effects from per-(db, seed) sums ``(4, K, S)`` = (pairs, Σ(success_m − success_r),
    Σ tokens_m, Σ tokens_r) and bootstrap ``counts (R, K)``. Every database must hold at least one pair."""
    n, dq, ta, tb = sums[0], sums[1], sums[2], sums[3]
    rep = st.resampled_sums(counts, np.stack([n.sum(1), dq.sum(1), ta.sum(1), tb.sum(1)], axis=1))
    quality = _effect(dq, n, 100.0 * st.ratio(rep[:, 1], rep[:, 0]), _pct, +1, db_ids, seeds)
    tokens = _effect(ta, tb, 100.0 * (st.ratio(rep[:, 2], rep[:, 3]) - 1.0), _pct_change, -1, db_ids, seeds)
    return quality, tokens


def _binned_sums(cells: np.ndarray, shape: tuple[int, int], columns: Sequence[np.ndarray]) -> np.ndarray:
    """Per-(db, seed) sums: flat cell codes ``(N,)`` and C weight columns ``(N,)`` → ``(C, K, S)``."""
    size = shape[0] * shape[1]
    return np.stack([np.bincount(cells, weights=w, minlength=size).reshape(shape) for w in columns])


def paired_comparisons(
    episodes: pd.DataFrame,
    pairs: Sequence[tuple[str, str]],
    *,
    budgets: Sequence[str],
    replicates: int = 10_000,
    seed: int = 0,
) -> tuple[PairedComparison, ...]:
    """Every ``(method, reference)`` pair at every budget where both have paired rows (others are skipped)."""
    keyed = (
        episodes.assign(_s=episodes["success"].astype(np.float64), _t=episodes["total_tokens"].astype(np.float64))
        .groupby(["budget", "db_id", "task_id", "seed", "method"], sort=False)[["_s", "_t"]]
        .mean()
    )
    counts_by_k: dict[int, np.ndarray] = {}
    out: list[PairedComparison] = []
    for budget in budgets:
        if budget not in keyed.index.get_level_values(0):
            continue
        wide = keyed.xs(budget, level=0).unstack("method")
        db_codes, db_names = pd.factorize(wide.index.get_level_values("db_id"), sort=True)
        seed_codes, seed_vals = pd.factorize(wide.index.get_level_values("seed"), sort=True)
        n_db, n_seed = len(db_names), len(seed_vals)
        cell = db_codes * n_seed + seed_codes
        methods = list(wide["_s"].columns)
        succ = wide["_s"].to_numpy(np.float64)
        tok = wide["_t"].to_numpy(np.float64)
        for method, reference in pairs:
            if method not in methods or reference not in methods:
                continue
            i, j = methods.index(method), methods.index(reference)
            mask = np.isfinite(succ[:, i]) & np.isfinite(succ[:, j])
            if not mask.any():
                continue
            columns = (np.ones(int(mask.sum())), succ[mask, i] - succ[mask, j], tok[mask, i], tok[mask, j])
            sums = _binned_sums(cell[mask], (n_db, n_seed), columns)
            keep_db = sums[0].sum(axis=1) > 0
            keep_seed = sums[0].sum(axis=0) > 0
            sums = sums[:, keep_db][:, :, keep_seed]
            k = int(keep_db.sum())
            if k not in counts_by_k:
                counts_by_k[k] = st.bootstrap_counts(k, replicates, seed)
            seeds_kept = [int(s) for s in np.asarray(seed_vals)[keep_seed]]
            quality, tokens = compare_sums(sums, list(np.asarray(db_names)[keep_db]), seeds_kept, counts_by_k[k])
            n_pairs = float(sums[0].sum())
            out.append(
                PairedComparison(
                    method=method,
                    reference=reference,
                    budget=budget,
                    pairs=int(n_pairs),
                    databases=k,
                    seeds=tuple(seeds_kept),
                    quality=quality,
                    tokens=tokens,
                    mean_tokens_method=float(sums[2].sum() / n_pairs),
                    mean_tokens_reference=float(sums[3].sum() / n_pairs),
                )
            )
    return tuple(out)


def primary_gate(
    comparisons: Sequence[PairedComparison],
    method: str,
    reference: str,
    *,
    margin_pp: float = 5.0,
    budgets: Sequence[str] = GATE_BUDGETS,
) -> PrimaryGate:
    """The ordered conjunctive gate of ``method`` against ``reference`` (see the module docstring)."""
    found = {c.budget: c for c in comparisons if c.method == method and c.reference == reference}
    steps: list[GateStep] = []
    ok = True
    plan = [(b, "non-inferiority") for b in budgets] + [(b, "token reduction") for b in budgets]
    for budget, criterion in plan:
        comp = found.get(budget)
        threshold = -margin_pp if criterion == "non-inferiority" else 0.0
        if comp is None:
            steps.append(GateStep(budget, criterion, math.nan, threshold, "missing"))
            ok = False
            continue
        if criterion == "non-inferiority":
            stat = comp.quality.lower_95
            holds = math.isfinite(stat) and stat > threshold
        else:
            stat = comp.tokens.ci_high
            holds = math.isfinite(stat) and stat < threshold
        status = ("pass" if holds else "fail") if ok else "not reached"
        ok = ok and holds
        steps.append(GateStep(budget, criterion, stat, threshold, status))
    return PrimaryGate(method, reference, margin_pp, tuple(steps), passed=ok)
