"""A gain split by aggregate kind (bapsql/analysis/aggregates.py, bapsql/data/aggregates.py, the benchmarks script)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bapsql.analysis.aggregates import gain_by_aggregate, gain_table, task_kinds
from bapsql.data.aggregates import aggregate_kind

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("sql,answer,kind", [
    ("SELECT COUNT(*) FROM t WHERE a = 1", "scalar", "count"),
    ("SELECT COUNT(DISTINCT x) FROM t", "scalar", "count"),
    ("SELECT MAX(x) FROM t", "scalar", "min/max"),
    ("SELECT MIN(t.x) FROM t JOIN u ON t.id = u.id", "scalar", "min/max"),
    ("SELECT ROUND(AVG(x), 2) FROM t", "scalar", "avg"),
    ("SELECT d FROM t GROUP BY d ORDER BY COUNT(*) DESC LIMIT 1", "scalar", "mode"),
    ("SELECT name FROM t WHERE x > 3", "list", "list"),
    ("SELECT name FROM t ORDER BY x", "ordered_list", "list"),
    ("SELECT SUM(x) FROM t", "scalar", "other"),
    ("SELECT name FROM t WHERE id = 3", "scalar", "other"),
    ("not sql at all", None, "other"),
])
def test_aggregate_kind_of_a_gold_query(sql, answer, kind):
    assert aggregate_kind(sql, answer) == kind


def _episodes(rows):
    return pd.DataFrame([dict(method=m, budget=b, task_id=t, success=s) for m, b, t, s in rows])


KINDS = {"c1": "count", "c2": "count", "a1": "avg", "m1": "min/max", "l1": "list"}


def test_gain_by_aggregate_on_a_small_log():
    rows = [("post", "XS", t, s) for t, s in (("c1", 1), ("c2", 1), ("a1", 1), ("m1", 0), ("l1", 0))]
    rows += [("dash", "XS", t, s) for t, s in (("c1", 0), ("c2", 0), ("a1", 0), ("m1", 0), ("l1", 0))]
    rows += [("post", "S", "c1", 1), ("dash", "S", "c1", 1)]
    got = {r.kind: r for r in gain_by_aggregate(_episodes(rows), KINDS, "post", "dash", budgets=["XS"])}
    assert list(got) == ["count", "min/max", "avg", "list", "all"]
    assert got["count"].success == 100.0 and got["count"].reference_success == 0.0 and got["count"].episodes == 2
    assert got["count"].contribution_pp == pytest.approx(40.0) and got["avg"].contribution_pp == pytest.approx(20.0)
    assert got["min/max"].contribution_pp == 0.0 and got["all"].gain_pp == pytest.approx(60.0)
    pooled = gain_by_aggregate(_episodes(rows), KINDS, "post", "dash")
    assert pooled[-1].episodes == 6 and pooled[-1].gain_pp == pytest.approx(100 * (4 / 6 - 1 / 6))
    md = gain_table(pooled, "post", "dash")
    assert md.splitlines()[0].startswith("| aggregate | episodes | post (%) | dash (%)") and "| all | 6 |" in md


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["post", "dash"]), st.sampled_from(sorted(KINDS) + ["zz"]),
                          st.booleans()), min_size=2, max_size=40))
def test_contributions_sum_to_the_gain(rows):
    ep = _episodes([(m, "XS", t, s) for m, t, s in rows])
    out = gain_by_aggregate(ep, KINDS, "post", "dash")
    total = out[-1]
    if total.episodes and total.reference_episodes:
        assert sum(r.contribution_pp for r in out[:-1]) == pytest.approx(total.gain_pp, abs=1e-9)


def test_the_script_splits_a_run_of_the_mini_benchmark(tmp_path, capsys):
    from bapsql.analysis.synthetic import write_run
    from bapsql.data.load import load_benchmark
    from tests.analysis.helpers import episodes_table
    from tests.policies.minibench import build_minibench

    root = build_minibench(tmp_path / "mini")
    tasks = [t for t in load_benchmark(root).tasks if t.db_id == "library"]
    kinds = task_kinds(tasks)
    assert {kinds["library-06"], kinds["library-07"], kinds["library-08"]} == {"count", "avg", "list"}
    rows = [dict(method=m, budget="XS", task_id=t.task_id, db_id=t.db_id,
                 success=(m == "p@adaptive_posthoc") == (kinds[t.task_id] == "count")) for m in
            ("p@adaptive_posthoc", "p@dashboard") for t in tasks]
    write_run(tmp_path / "run", episodes_table(rows))
    spec = importlib.util.spec_from_file_location("aggregate_gain", REPO / "benchmarks" / "aggregate_gain.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    script.main([str(tmp_path / "run"), "--benchmark", str(root), "--split", "dev", "--method", "p@adaptive_posthoc",
                 "--reference", "p@dashboard", "--budgets", "XS"])
    out = capsys.readouterr().out
    assert "### XS" in out and "| count |" in out and "| all | 6 |" in out
