"""Paired comparisons (database-cluster bootstrap and companions) and the ordered primary gate."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from bapsql.analysis import statistics as st
from bapsql.analysis.comparisons import Effect, PairedComparison, SignTest, paired_comparisons, primary_gate
from bapsql.analysis.synthetic import SyntheticSpec, synthetic_run
from tests.analysis.helpers import episodes_table


def _synthetic(n_tasks=60, n_databases=5, seeds=(0, 1), delta=0.05, rng_seed=1, db_sd=0.04, levels=("XS",)):
    spec = SyntheticSpec(
        success={"ref": {lv: 0.40 for lv in levels}, "new": {lv: 0.40 + delta for lv in levels}},
        tokens={"ref": {lv: 1000.0 for lv in levels}, "new": {lv: 950.0 for lv in levels}},
        n_tasks=n_tasks, n_databases=n_databases, seeds=seeds, db_sd=db_sd, turns_per_episode=0, rng_seed=rng_seed,
    )
    return synthetic_run(spec)[0].to_pandas()


def test_comparison_matches_slow_row_level_reference():
    ep = _synthetic()
    r, seed = 400, 9
    (c,) = paired_comparisons(ep, [("new", "ref")], budgets=["XS"], replicates=r, seed=seed)
    a = ep[ep["method"] == "new"].set_index(["task_id", "seed"])
    b = ep[ep["method"] == "ref"].set_index(["task_id", "seed"])
    paired = a[["db_id", "success", "total_tokens"]].join(b[["success", "total_tokens"]].add_suffix("_r")).reset_index()
    paired["d"] = paired["success"].astype(float) - paired["success_r"].astype(float)
    dbs = sorted(paired["db_id"].unique())
    assert c.pairs == len(paired) and c.databases == len(dbs) and c.seeds == (0, 1)

    def stats(rows: pd.DataFrame) -> tuple[float, float]:
        return 100.0 * rows["d"].mean(), 100.0 * (rows["total_tokens"].sum() / rows["total_tokens_r"].sum() - 1.0)

    q_hat, t_hat = stats(paired)
    assert c.quality.estimate == pytest.approx(q_hat) and c.tokens.estimate == pytest.approx(t_hat)
    # Bootstrap: explicit per-replicate resampling of rows with the same draws.
    draws = st.bootstrap_draws(len(dbs), r, seed)
    by_db = {d: paired[paired["db_id"] == d] for d in dbs}
    reps = np.array([stats(pd.concat([by_db[dbs[k]] for k in draws[i]])) for i in range(r)])
    assert (c.quality.ci_low, c.quality.ci_high) == pytest.approx(st.percentile_interval(reps[:, 0]))
    assert c.quality.lower_95 == pytest.approx(np.percentile(reps[:, 0], 5.0))
    assert (c.tokens.ci_low, c.tokens.ci_high) == pytest.approx(st.percentile_interval(reps[:, 1]))
    # Per database, macro, database-t, leave-one-out, per seed, sign tests.
    per_db = np.array([stats(by_db[d]) for d in dbs])
    assert list(c.quality.per_database.values()) == pytest.approx(list(per_db[:, 0]))
    assert c.quality.macro == pytest.approx(per_db[:, 0].mean())
    _, lo, hi = st.t_interval(per_db[:, 0])
    assert (c.quality.t_low, c.quality.t_high) == pytest.approx((lo, hi))
    lodo = np.array([stats(paired[paired["db_id"] != d]) for d in dbs])
    assert (c.quality.lodo_min, c.quality.lodo_max) == pytest.approx((lodo[:, 0].min(), lodo[:, 0].max()))
    assert (c.tokens.lodo_min, c.tokens.lodo_max) == pytest.approx((lodo[:, 1].min(), lodo[:, 1].max()))
    for s in (0, 1):
        q_s, t_s = stats(paired[paired["seed"] == s])
        assert c.quality.per_seed[s] == pytest.approx(q_s) and c.tokens.per_seed[s] == pytest.approx(t_s)
    pos, neg = int((per_db[:, 0] > 0).sum()), int((per_db[:, 0] < 0).sum())
    assert (c.quality.sign.favorable, c.quality.sign.unfavorable) == (pos, neg)
    assert c.quality.sign.p_value == pytest.approx(st.sign_test(pos, pos + neg))
    red = int((per_db[:, 1] < 0).sum())
    assert c.tokens.sign.favorable == red
    assert c.mean_tokens_method - c.mean_tokens_reference == pytest.approx(
        paired["total_tokens"].mean() - paired["total_tokens_r"].mean()
    )


def test_pairing_drops_unmatched_rows_and_averages_samples():
    rows = [
        # t0: both methods; "new" has two samples (success 1 and 0 → 0.5)
        dict(method="new", budget="XS", task_id="t0", db_id="d0", success=True, sample=0, total_tokens=100),
        dict(method="new", budget="XS", task_id="t0", db_id="d0", success=False, sample=1, total_tokens=300),
        dict(method="ref", budget="XS", task_id="t0", db_id="d0", success=False, total_tokens=100),
        # t1: only "new" (dropped); t2: both, other database
        dict(method="new", budget="XS", task_id="t1", db_id="d0", success=True, total_tokens=100),
        dict(method="new", budget="XS", task_id="t2", db_id="d1", success=True, total_tokens=100),
        dict(method="ref", budget="XS", task_id="t2", db_id="d1", success=True, total_tokens=200),
    ]
    ep = episodes_table(rows).to_pandas()
    (c,) = paired_comparisons(ep, [("new", "ref")], budgets=["XS", "S"], replicates=50, seed=0)
    assert c.pairs == 2 and c.databases == 2
    assert c.quality.estimate == pytest.approx(100 * (0.5 + 0.0) / 2)
    assert c.tokens.estimate == pytest.approx(100 * ((200 + 100) / (100 + 200) - 1))
    assert c.quality.per_database == pytest.approx({"d0": 50.0, "d1": 0.0})
    assert (c.quality.sign.favorable, c.quality.sign.ties) == (1, 1)


def test_one_database_gives_nan_spreads_not_errors():
    rows = [dict(method=m, budget="XS", task_id=f"t{i}", success=(i + (m == "new")) % 2 == 0, total_tokens=100)
            for m in ("new", "ref") for i in range(4)]
    (c,) = paired_comparisons(episodes_table(rows).to_pandas(), [("new", "ref")], budgets=["XS"], replicates=20)
    assert c.databases == 1
    assert c.quality.ci_low == c.quality.ci_high == c.quality.estimate  # one cluster: no sampling variation
    assert math.isnan(c.quality.t_low) and math.isnan(c.quality.lodo_min)


def _comparison(budget: str, lower_95: float, token_hi: float) -> PairedComparison:
    def effect(est, lo, hi, low):
        return Effect(est, lo, hi, low, lo, hi, est, est, est, {}, {}, SignTest(0, 0, 0, 1.0))

    return PairedComparison(
        method="rl", reference="sft", budget=budget, pairs=10, databases=11, seeds=(0,),
        quality=effect(3.0, lower_95 - 1, 6.0, lower_95), tokens=effect(token_hi - 2, token_hi - 4, token_hi, 0.0),
        mean_tokens_method=1.0, mean_tokens_reference=1.0,
    )


def test_primary_gate_passes_only_when_all_four_hold_in_order():
    comps = [_comparison("XS", 2.0, -3.2), _comparison("S", 2.1, -3.7), _comparison("M", 1.5, -1.8)]
    gate = primary_gate(comps, "rl", "sft")
    assert gate.passed
    assert [(s.criterion, s.budget, s.status) for s in gate.steps] == [
        ("non-inferiority", "XS", "pass"), ("non-inferiority", "S", "pass"),
        ("token reduction", "XS", "pass"), ("token reduction", "S", "pass"),
    ]
    assert gate.steps[0].statistic == 2.0 and gate.steps[0].threshold == -5.0


def test_primary_gate_stops_at_the_first_failure():
    # NI fails at S (lower bound below -5): token steps are not reached even though they would pass.
    gate = primary_gate([_comparison("XS", -4.9, -3.0), _comparison("S", -5.1, -3.0)], "rl", "sft")
    assert not gate.passed
    assert [s.status for s in gate.steps] == ["pass", "fail", "not reached", "not reached"]
    # Tokens at XS cross zero: fails, S not reached.
    gate = primary_gate([_comparison("XS", 1.0, 0.4), _comparison("S", 1.0, -3.0)], "rl", "sft")
    assert [s.status for s in gate.steps] == ["pass", "pass", "fail", "not reached"]
    # A missing budget is never a pass.
    gate = primary_gate([_comparison("XS", 1.0, -1.0)], "rl", "sft")
    assert not gate.passed and [s.status for s in gate.steps] == ["pass", "missing", "not reached", "missing"]


@pytest.mark.slow
def test_bootstrap_interval_covers_the_planted_effect_at_its_nominal_rate():
    """200 simulated evaluations with a planted +3 pp effect and database-level heterogeneity: the 95% cluster
    bootstrap interval must cover the truth at about 95% (binomial tolerance, 3 sd ≈ ±4.6 points)."""
    sims, delta = 200, 0.03
    covered = 0
    for i in range(sims):
        ep = _synthetic(n_tasks=400, n_databases=30, seeds=(0, 1, 2), delta=delta, rng_seed=1000 + i, db_sd=0.05)
        (c,) = paired_comparisons(ep, [("new", "ref")], budgets=["XS"], replicates=2000, seed=i)
        covered += c.quality.ci_low <= 100 * delta <= c.quality.ci_high
    rate = covered / sims
    tolerance = 3 * math.sqrt(0.95 * 0.05 / sims)
    assert abs(rate - 0.95) <= tolerance, f"coverage {rate:.3f} outside 0.95 ± {tolerance:.3f}"
