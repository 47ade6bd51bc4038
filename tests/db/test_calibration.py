"""Calibration factors: the pure fit (vs a slow reference, with hypothesis), strict loading, sample collection."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bapsql.db.calibration import (DEFAULT_PATH, SHAPES, Calibration, Factors, QuantityCalibration, RawEstimate,
                                   Sample, coverage, fit_calibration, fit_factor, load_calibration)
from bapsql.db.calibration_samples import collect_samples
from bapsql.db.handle import open_database
from bapsql.db.rows import result_tokens
from bapsql.errors import ConfigError
from bapsql.tokens import RegexTokenCounter
from tests.db.shop_db import build_shop

positive = st.floats(0.0, 1e6, allow_nan=False, allow_infinity=False)


def reference_f95(raw, actual, target, floor, min_factor):
    """Slow reference: try every candidate factor in increasing order, keep the first reaching the target."""
    base = [max(r, floor) for r in raw]
    candidates = sorted({a / b for a, b in zip(actual, base)} | {min_factor})
    for f in candidates:
        if f < min_factor:
            continue
        covered = sum(1 for a, b in zip(actual, base) if a <= f * b * (1 + 1e-12))
        if covered / len(raw) >= target:
            return f
    return max(candidates)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(positive, positive), min_size=1, max_size=60), st.floats(0.5, 0.999))
def test_fit_factor_matches_reference_and_reaches_target(pairs, target):
    raw, actual = (np.array(x) for x in zip(*pairs))
    f = fit_factor(raw, actual, target_coverage=target, floor=1.0, min_factor=1.0)
    assert f.p95 == pytest.approx(max(reference_f95(raw, actual, target, 1.0, 1.0), f.p50), rel=1e-9)
    cov = np.mean(actual <= f.p95 * np.maximum(raw, 1.0) * (1 + 1e-12))
    assert cov >= target - 1e-12
    assert 0.5 <= f.p50 <= 2.0 and f.p95 >= 1.0


def test_fit_factor_edges():
    assert fit_factor(np.array([]), np.array([])) == Factors()
    with pytest.raises(ValueError):
        fit_factor(np.ones(3), np.ones(2))
    f = fit_factor(np.array([10.0, 10.0]), np.array([1.0, 2.0]), min_factor=1.5)
    assert f.p95 == 1.5  # never below the floor factor
    per_sample = fit_factor(np.array([0.0, 0.0]), np.array([4.0, 8.0]), floor=np.array([4.0, 8.0]))
    assert per_sample.p95 == 1.0  # per-sample floors (one row's tokens) cover the actuals


def raw(rows=10.0, ub=math.inf, exact=False, header=5.0, tpr=3.0, vm=100.0, shape="filter") -> RawEstimate:
    return RawEstimate(rows, ub, exact, header, tpr, vm, shape)


def test_quantiles_order_caps_and_exact():
    cal = Calibration(rows=QuantityCalibration(Factors(1.0, 5.0), {"join": Factors(1.2, 9.0)}),
                      result_tokens=QuantityCalibration(Factors(1.0, 2.0)),
                      vm_steps=QuantityCalibration(Factors(0.9, 3.0)))
    q = cal.quantiles(raw())
    assert q["rows"] == (10.0, 50.0)
    assert q["result_tokens"] == (5 + 30, 5 + 2.0 * 50 * 3)  # header + g · rows_p95 · tokens per row
    assert q["vm_steps"] == (90.0, 300.0)
    assert cal.quantiles(raw(shape="join"))["rows"] == (12.0, 90.0)
    assert cal.quantiles(raw(shape="join", ub=20.0))["rows"] == (12.0, 20.0)
    assert cal.quantiles(raw(rows=3.0, ub=3.0, exact=True))["rows"] == (3.0, 3.0)
    assert cal.quantiles(raw(rows=0.0))["rows"] == (0.0, 5.0)  # p95 base never below one row
    zero = cal.quantiles(raw(rows=0.0, ub=0.0, exact=True))
    assert zero["rows"] == (0.0, 0.0) and zero["result_tokens"] == (0.0, 0.0)  # no row: no header either
    for qs in (q, zero):
        assert all(p50 <= p95 for p50, p95 in qs.values())


def sample(shape, r, actual_rows, tokens_actual, vm, vm_actual, exact=False):
    return Sample(RawEstimate(r, math.inf if not exact else r, exact, 4.0, 2.0, vm, shape), actual_rows,
                  tokens_actual, vm_actual)


def test_fit_calibration_by_shape_and_coverage():
    rng = np.random.default_rng(0)
    samples = []
    for i in range(400):
        shape = SHAPES[i % 2]  # exact / grouped
        r = float(rng.integers(1, 100))
        spread = 1.0 if shape == "exact" else float(rng.lognormal(0, 0.7))
        act = r if shape == "exact" else round(r * spread)
        tokens = 4.0 + act * 2.0 * float(rng.uniform(0.8, 1.25)) if act else 0.0
        samples.append(sample(shape, r, act, tokens, 50.0 * r, 50.0 * r * spread, exact=shape == "exact"))
    cal = fit_calibration(samples, target_coverage=0.95, min_shape_samples=100)
    assert set(cal.rows.by_shape) == {"exact", "grouped"}
    assert cal.vm_steps.by_shape["exact"].p95 == 1.0 < cal.vm_steps.by_shape["grouped"].p95
    assert cal.result_tokens.by_shape["exact"].p95 <= 1.25 + 1e-9  # only the width error is left to cover
    cov = coverage(samples, cal)
    for q in ("rows", "result_tokens", "vm_steps"):
        assert cov[q]["p95"] >= 0.95 and cov[q]["n"] == 400
    assert cov["rows"]["median_p95_over_actual"] >= 1.0
    with pytest.raises(ValueError):
        fit_calibration(samples, target_coverage=1.0)


def _spread_samples(n=400, seed=1):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        r = float(rng.integers(1, 100))
        act = round(r * float(rng.lognormal(0, 0.7)))
        tokens = 4.0 + act * 2.0 * float(rng.uniform(0.8, 1.25)) if act else 0.0
        out.append(sample("filter", r, act, tokens, 50.0 * r, 50.0 * r * float(rng.lognormal(0, 0.5))))
    return out


def test_a_target_per_quantity_fits_each_quantity_to_its_own_share():
    """rows at 0.99 and VM steps at 0.9 are the single-target fits' rows and VM factors; the token factor, fitted on
    the rows p95 of 0.99, is the 0.9-share order statistic of the same pairs (at most the 0.99 fit's); each held-in
    coverage reaches its target; the targets are recorded."""
    samples = _spread_samples()
    targets = {"rows": 0.99, "result_tokens": 0.9, "vm_steps": 0.9}
    cal = fit_calibration(samples, target_coverage=targets)
    high, low = fit_calibration(samples, target_coverage=0.99), fit_calibration(samples, target_coverage=0.9)
    assert cal.rows == high.rows and cal.vm_steps == low.vm_steps
    assert cal.result_tokens.default.p95 <= high.result_tokens.default.p95
    cov = coverage(samples, cal)
    assert all(cov[q]["p95"] >= t for q, t in targets.items())
    assert cal.target_coverage == targets and high.target_coverage == 0.99
    # the slow reference for the token factor: the smallest g covering 90 % of (rows_p95 * t, actual - header)
    r95 = [cal.rows_quantiles(s.raw)[1] for s in samples]
    ratios = sorted(max(s.result_tokens - s.raw.header_tokens, 0.0) / max(p * s.raw.row_tokens, s.raw.row_tokens)
                    for s, p in zip(samples, r95))
    assert cal.result_tokens.default.p95 == pytest.approx(max(ratios[math.ceil(0.9 * len(ratios)) - 1], 1.0))


@pytest.mark.parametrize("bad, match", [({"rows": 0.99}, "missing"), ({"rows": 0.99, "result_tokens": 0.9,
                                        "vm_steps": 0.9, "tokens": 0.9}, "tokens"),
                                       ({"rows": 0.99, "result_tokens": 1.0, "vm_steps": 0.9}, "result_tokens")])
def test_a_bad_target_mapping_names_the_key(bad, match):
    with pytest.raises(ValueError, match=match):
        fit_calibration(_spread_samples(50), target_coverage=bad)


def test_a_calibration_with_targets_per_quantity_round_trips(tmp_path):
    cal = fit_calibration(_spread_samples(), target_coverage={"rows": 0.99, "result_tokens": 0.95, "vm_steps": 0.9})
    cal.save(tmp_path / "cal.json")
    assert load_calibration(tmp_path / "cal.json") == cal


def test_packaged_default_loads_and_documents_itself():
    cal = load_calibration()
    assert cal.source and cal.comment
    for q in ("rows", "result_tokens", "vm_steps"):
        f = getattr(cal, q).default
        assert 0 < f.p50 <= f.p95
    assert json.loads(DEFAULT_PATH.read_text())["source"] == cal.source


def test_strict_loading(tmp_path):
    good = Calibration(rows=QuantityCalibration(Factors(1.0, 3.0)), source="t")
    path = tmp_path / "cal.json"
    good.save(path)
    assert load_calibration(path) == good
    obj = json.loads(path.read_text())
    obj["rows"]["defualt"] = obj["rows"].pop("default")
    path.write_text(json.dumps(obj))
    with pytest.raises(ConfigError, match="defualt"):
        load_calibration(path)
    path.write_text(json.dumps({"rows": {"by_shape": {"weird": {"p50": 1, "p95": 2}}}}))
    with pytest.raises(ConfigError, match="weird"):
        load_calibration(path)
    path.write_text(json.dumps({"vm_steps": {"default": {"p50": 1, "p95": -2}}}))
    with pytest.raises(ConfigError, match="p95"):
        load_calibration(path)
    path.write_text("{oops")
    with pytest.raises(ConfigError, match="JSON"):
        load_calibration(path)
    with pytest.raises(ConfigError, match="not found"):
        load_calibration(tmp_path / "missing.json")


def test_collect_samples_pairs_raw_estimates_with_actuals(tmp_path):
    db = build_shop(tmp_path / "shop.sqlite", n_orders=5_000)
    counter = RegexTokenCounter()
    sqls = ["SELECT * FROM orders WHERE status = 'lost'", "SELECT count(*) FROM customers",
            "SELECT c.country, count(*) FROM customers c JOIN orders o ON o.customer_id = c.id GROUP BY 1",
            "SELECT nope FROM orders", "DELETE FROM orders"]
    with open_database(db, token_counter=counter, cache_dir=tmp_path / "cache") as h:
        samples = collect_samples(h, sqls)
        assert [s.sql for s in samples] == sqls[:3]  # failures and refusals are skipped
        for s in samples:
            res = h.sandbox.query(s.sql)
            assert s.rows == res.rows_total
            assert s.vm_steps == res.vm_steps
            assert s.result_tokens == result_tokens(res.columns, res.rows, counter)
            assert s.raw.rows >= 0 and s.raw.vm_steps > 0 and s.raw.row_tokens > 0 and s.raw.header_tokens > 0
        assert samples[1].raw.rows_exact and samples[1].raw.rows == samples[1].rows == 1.0
        assert math.isfinite(samples[0].raw.rows_ub)


def test_runs_stopped_by_the_vm_step_cap_are_misses_when_p95_was_below_the_cap(tmp_path):
    """Issue 30, item 7: a query the collection cap stopped cost more than the cap. It is kept as a sample: for VM
    steps a miss when the p95 was below the cap, unknown (left out) when above; its rows and result tokens are
    unknown; fitting never uses it."""
    import dataclasses

    from bapsql.db.calibration import Calibration, QuantityCalibration, coverage, fit_calibration

    db = build_shop(tmp_path / "shop.sqlite", n_orders=5_000)
    sqls = ["SELECT count(*) FROM customers", "SELECT count(*) FROM orders a, orders b"]
    with open_database(db, token_counter=RegexTokenCounter(), cache_dir=tmp_path / "cache") as h:
        samples = collect_samples(h, sqls, vm_step_cap=2_000_000)
    assert [s.sql for s in samples] == sqls and [s.stopped for s in samples] == [False, True]
    stopped = samples[1]
    assert stopped.vm_steps == 2_000_000 and math.isnan(stopped.rows) and math.isnan(stopped.result_tokens)
    ident = Calibration.identity()
    low = dataclasses.replace(ident, vm_steps=QuantityCalibration(Factors(1e-9, 1e-9)))  # p95 far below the cap
    high = dataclasses.replace(ident, vm_steps=QuantityCalibration(Factors(1e6, 1e6)))  # p95 far above the cap
    cov_low, cov_high = coverage(samples, low), coverage(samples, high)
    assert cov_low["vm_steps"]["n"] == 2 and cov_low["vm_steps"]["stopped"] == 1
    assert cov_low["vm_steps"]["p95"] <= 0.5  # the stopped run is a miss
    assert cov_high["vm_steps"]["n"] == 1 and cov_high["vm_steps"]["p95"] == 1.0  # unknown: left out
    assert cov_low["rows"]["n"] == 1 and cov_low["result_tokens"]["n"] == 1  # its rows and tokens are unknown
    assert fit_calibration(samples, min_shape_samples=1) == fit_calibration(samples[:1], min_shape_samples=1)
