"""Synthetic logs: schema-exact, deterministic, and carrying the planted effects."""

from __future__ import annotations

import pytest

from bapsql.analysis.synthetic import SyntheticSpec, synthetic_run
from bapsql.logs.schema import EPISODES_SCHEMA, TURNS_SCHEMA

SPEC = SyntheticSpec(
    success={"a": {"XS": 0.2, "L": 0.6}, "b": {"XS": 0.5}},
    tokens={"a": {"XS": 1000.0, "L": 2000.0}, "b": {"XS": 500.0}},
    n_tasks=2000, n_databases=7, seeds=(0, 1), db_sd=0.0,
)


def test_tables_follow_the_schema_and_are_deterministic():
    ep, turns = synthetic_run(SPEC)
    assert ep.schema.equals(EPISODES_SCHEMA) and turns.schema.equals(TURNS_SCHEMA)
    assert ep.num_rows == 3 * 2000 * 2
    again, _ = synthetic_run(SPEC)
    assert ep.equals(again)
    df = ep.to_pandas()
    assert df["db_id"].nunique() == 7
    assert (df["total_tokens"] == df["prompt_tokens"] + df["completion_tokens"] + df["result_tokens"]).mean() > 0.99
    assert (df.loc[df["success"], "failure"] == "").all() and (df.loc[~df["success"], "failure"] != "").all()


def test_planted_rates_are_recovered():
    ep, turns = synthetic_run(SPEC)
    df = ep.to_pandas()
    rate = df.groupby(["method", "budget"])["success"].mean()
    assert rate[("a", "XS")] == pytest.approx(0.2, abs=0.03)
    assert rate[("a", "L")] == pytest.approx(0.6, abs=0.03)
    assert rate[("b", "XS")] == pytest.approx(0.5, abs=0.03)
    tok = df.groupby(["method", "budget"])["total_tokens"].mean()
    assert tok[("a", "XS")] / tok[("b", "XS")] == pytest.approx(2.0, rel=0.05)
    t = turns.to_pandas()
    assert (t["actual_rows"] <= t["est_rows_p95"]).mean() == pytest.approx(0.95, abs=0.01)
    assert (t["actual_rows"] <= t["est_rows_p50"]).mean() == pytest.approx(0.5, abs=0.02)


def test_writing_part_by_part_writes_the_same_files(tmp_path):
    import pyarrow.parquet as pq

    from bapsql.analysis.synthetic import write_run, write_synthetic_run

    small = SyntheticSpec(success=SPEC.success, tokens=SPEC.tokens, n_tasks=50, n_databases=3, seeds=(0, 1))
    assert write_synthetic_run(tmp_path / "parts", small) == tuple(t.num_rows for t in synthetic_run(small))
    write_run(tmp_path / "whole", *synthetic_run(small))
    files = sorted(p.relative_to(tmp_path / "whole") for p in (tmp_path / "whole").rglob("*.parquet"))
    assert files == sorted(p.relative_to(tmp_path / "parts") for p in (tmp_path / "parts").rglob("*.parquet"))
    for f in files:
        assert pq.read_table(tmp_path / "parts" / f).equals(pq.read_table(tmp_path / "whole" / f))
