"""Calibration on training databases only, coverage on held-out ones, and the SQL variants used as samples."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from bapsql.data.load import load_benchmark
from bapsql.data.calibrate import calibrate_benchmark, calibration_sqls, sql_variants
from bapsql.db.calibration import load_calibration
from bapsql.errors import DataError
from bapsql.types import Task


def test_sql_variants():
    v = sql_variants("SELECT name FROM t WHERE x > 1 ORDER BY y LIMIT 3")
    assert "SELECT name FROM t WHERE x > 1 ORDER BY y" in v
    assert "SELECT name FROM t ORDER BY y LIMIT 3" in v
    assert "SELECT * FROM t WHERE x > 1 ORDER BY y LIMIT 3" in v
    assert sql_variants("SELECT COUNT(*) FROM t") == []  # aggregate, no WHERE, no LIMIT: nothing to vary
    assert sql_variants("not sql at all (") == []
    assert "SELECT * FROM t" not in sql_variants("SELECT * FROM t")


@pytest.mark.slow  # several seconds: the slow tier
def test_calibration_fits_on_train_and_reports_held_out(demo_small, tmp_path):
    full = load_benchmark(demo_small)
    train, held = full.splits["train"][:2], full.splits["dev"][:1]  # three databases keep the test fast
    bench = replace(full, tasks=tuple(t for t in full.tasks if t.db_id in train + held),
                    splits={"train": train, "validation": (), "dev": held})
    out = tmp_path / "cal.json"
    rep = calibrate_benchmark(bench, out=out, max_sqls_per_db=12, cache_dir=tmp_path / "cache")
    assert set(rep.train_databases) == set(bench.splits["train"])
    assert set(rep.heldout_databases) == set(bench.splits["validation"]) | set(bench.splits["dev"])
    assert 0 < rep.train_samples <= 12 * len(rep.train_databases)
    assert 0 < rep.heldout_samples <= 12 * len(rep.heldout_databases)
    for q in ("rows", "result_tokens", "vm_steps"):
        assert rep.coverage_heldout[q]["n"] == rep.heldout_samples
        assert 0.0 <= rep.coverage_heldout[q]["p95"] <= 1.0
        assert rep.coverage_train[q]["p95"] >= 0.9  # in-sample coverage near the fitted target
    assert load_calibration(out) == rep.calibration
    assert json.loads(json.dumps(rep.to_json()))["out"] == str(out)


def test_calibration_needs_train_and_held_out(demo_small):
    bench = load_benchmark(demo_small)
    only_train = replace(bench, splits={"train": bench.databases, "validation": (), "dev": ()})
    with pytest.raises(DataError, match="held-out"):
        calibrate_benchmark(only_train)


def test_calibration_sqls_dedupe():
    bench_tasks = []
    for i in range(3):
        bench_tasks.append(Task(task_id=str(i), db_id="d", db_path="x", question="q", gold_sql="SELECT a FROM t",
                                naive_sql="SELECT * FROM t WHERE b = 1"))
    sqls = calibration_sqls(bench_tasks)
    assert sqls == ["SELECT a FROM t", "SELECT * FROM t", "SELECT * FROM t WHERE b = 1"]
