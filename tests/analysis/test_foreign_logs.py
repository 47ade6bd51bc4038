"""Logs of any system: core columns only, few databases, conditions, a named reference, Official EX."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from bapsql.analysis.analyze import analyze_runs, summarize
from bapsql.analysis.load import CORE_COLUMNS, load_runs, split_method
from bapsql.analysis.synthetic import write_run
from bapsql.cli.analyze import analyze
from bapsql.errors import RunLogError
from tests.analysis.helpers import LADDER, episodes_table

pytestmark = pytest.mark.slow  # end-to-end analyses with figures (seconds each)


def _core_rows(methods=("ours", "theirs"), n_db=6, tasks_per_db=4, seeds=(0, 1)) -> list[dict]:
    rows = []
    for m in methods:
        for b in LADDER:
            for s in seeds:
                for i in range(n_db * tasks_per_db):
                    ok = (i + s + len(m) + LADDER.index(b)) % 3 != 0
                    rows.append({"method": m, "budget": b, "seed": s, "task_id": f"q{i:03d}", "db_id": f"db{i % n_db}",
                                 "correct": ok, "feasible": True, "success": ok, "total_tokens": 900 + 7 * i,
                                 "queries": 1 + i % 2, "result_tokens": 30 + i, "vm_steps": 1000 * (1 + i % 5),
                                 "turns": 3})
    return rows


def _write_plain(run, rows, name="part.parquet") -> None:
    """What another system might write: one flat Parquet file, plain pyarrow types, no partitions."""
    (run / "episodes").mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), run / "episodes" / name)


def test_core_columns_only_analyse_end_to_end(tmp_path):
    rows = _core_rows()
    assert set(rows[0]) == set(CORE_COLUMNS)
    _write_plain(tmp_path / "theirs", rows)
    summary = analyze_runs([tmp_path / "theirs"], tmp_path / "out", reference="theirs", replicates=200)
    doc = json.loads((tmp_path / "out" / "summary.json").read_text())
    md = (tmp_path / "out" / "report.md").read_text()
    assert set(doc["methods"]) == {"ours", "theirs"} and doc["reference"] == "theirs" and doc["databases"] == 6
    expected = {lv: 100 * sum(r["success"] for r in rows if r["method"] == "ours" and r["budget"] == lv)
                / sum(r["method"] == "ours" and r["budget"] == lv for r in rows) for lv in LADDER}
    assert doc["methods"]["ours"]["success"] == pytest.approx(expected)
    assert doc["methods"]["ours"]["frontier_score"] is not None
    absent = next(n for n in summary.notes if n.startswith("episode column(s) absent"))
    for col in ("peak_context", "official_ex", "warnings", "failure", "abstained", "run (the run folder's name)"):
        assert col in absent
    assert "condition" not in absent  # an optional label, not a missing measurement
    assert "episode column(s) absent from 1 of 1 file(s)" in md
    assert "Official EX: absent" in md
    assert "| Method | XS (%) |" in md  # no conditions known: one Method column
    assert doc["warning_flow"] == [] and doc["failures"] == []  # diagnostics that need absent columns are left out
    assert doc["primary_gates"] and doc["transitions"]
    ep = load_runs([tmp_path / "theirs"]).episodes
    assert set(ep["run"]) == {"theirs"} and set(ep["sample"]) == {0} and not ep["breach"].any()
    assert (tmp_path / "out" / "report.html").stat().st_size > 0


def test_a_missing_core_column_is_an_error_naming_it(tmp_path):
    rows = [{k: v for k, v in r.items() if k != "vm_steps"} for r in _core_rows(n_db=1, tasks_per_db=1)]
    _write_plain(tmp_path / "r", rows)
    with pytest.raises(RunLogError, match="required column 'vm_steps'"):
        load_runs([tmp_path / "r"])


def test_few_databases_are_flagged_in_notes_and_comparisons(tmp_path):
    _write_plain(tmp_path / "three", _core_rows(n_db=3, tasks_per_db=6))
    summary = analyze_runs([tmp_path / "three"], tmp_path / "out", reference="ours", replicates=200)
    assert summary.databases == 3 and summary.few_databases
    assert any("only 3 database(s)" in n and "not meaningful" in n for n in summary.notes)
    md = (tmp_path / "out" / "report.md").read_text()
    assert md.count("**Only 3 database(s)**") == 2  # under the gate section and the pairwise table
    _write_plain(tmp_path / "six", _core_rows(n_db=6))
    six = summarize(load_runs([tmp_path / "six"]), reference="ours", replicates=50)
    assert not six.few_databases and not any("not meaningful" in n for n in six.notes)


def test_the_named_reference_is_honoured_on_the_command_line(tmp_path):
    _write_plain(tmp_path / "r", _core_rows(methods=("alpha", "beta", "gamma")))
    runner = CliRunner()
    res = runner.invoke(analyze, [str(tmp_path / "r"), "--out", str(tmp_path / "o1"), "--reference", "gamma",
                                  "--replicates", "100"])
    assert res.exit_code == 0, res.output
    doc = json.loads((tmp_path / "o1" / "summary.json").read_text())
    assert doc["reference"] == "gamma"
    assert {(g["method"], g["reference"]) for g in doc["primary_gates"]} == {("alpha", "gamma"), ("beta", "gamma")}
    res = runner.invoke(analyze, [str(tmp_path / "r"), "--out", str(tmp_path / "o2"), "--replicates", "100"])
    doc = json.loads((tmp_path / "o2" / "summary.json").read_text())
    assert res.exit_code == 0 and doc["reference"] is None and doc["primary_gates"] == []  # never "alpha"
    res = runner.invoke(analyze, [str(tmp_path / "r"), "--out", str(tmp_path / "o3"), "--reference", "delta"])
    assert res.exit_code != 0 and "reference method 'delta'" in res.output


def test_conditions_from_the_column_or_the_method_label(tmp_path):
    rows = []
    for r in _core_rows(methods=("drafter",)):
        for cond in ("raw", "dashboard"):
            rows.append({**r, "condition": cond, "success": r["success"] and (cond == "dashboard" or r["seed"] == 0)})
    _write_plain(tmp_path / "col", rows)
    labelled = [{**r, "method": "workflow.x@full"} for r in _core_rows(methods=("w",))]
    _write_plain(tmp_path / "label", labelled)
    summary = analyze_runs([tmp_path / "col", tmp_path / "label"], tmp_path / "out",
                           reference="drafter@dashboard", replicates=100)
    assert summary.methods == ("drafter@dashboard", "drafter@raw", "workflow.x@full")
    assert summary.conditions == {"drafter@dashboard": "dashboard", "drafter@raw": "raw", "workflow.x@full": "full"}
    assert summary.cell("drafter@raw", "XS").success < summary.cell("drafter@dashboard", "XS").success
    md = (tmp_path / "out" / "report.md").read_text()
    assert "| Policy | Condition | XS (%) |" in md
    assert any(line.startswith("| drafter | raw |") for line in md.splitlines())
    doc = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert doc["methods"]["workflow.x@full"]["policy"] == "workflow.x"
    assert doc["methods"]["drafter@raw"]["condition"] == "raw"
    assert split_method("a@b@c") == ("a", "b@c") and split_method("plain") == ("plain", None)


def test_official_ex_row_uses_the_logged_column(tmp_path):
    rows = [dict(method=m, budget=b, task_id=f"t{i}", db_id=f"d{i % 5}", success=i % 2 == 0,
                 official_ex=(i % 4 != 0) if m == "a" else None)
            for m in ("a", "b") for b in LADDER for i in range(20)]
    write_run(tmp_path / "r", episodes_table(rows))
    summary = analyze_runs([tmp_path / "r"], tmp_path / "out", replicates=50)
    assert summary.cell("a", "XS").official_ex == pytest.approx(75.0) and summary.cell("b", "XS").official_ex is None
    md = (tmp_path / "out" / "report.md").read_text()
    assert "| Method | XS EX (%) | S EX (%) | M EX (%) | L EX (%) |" in md
    assert "| a | 75.0 | 75.0 | 75.0 | 75.0 |" in md and "| b | — | — | — | — |" in md
    assert "Official EX: absent" not in md


def test_condition_labels_are_consistent_and_reach_the_turns(tmp_path):
    import pandas as pd

    from bapsql.analysis.load import apply_conditions

    frame = pd.DataFrame({"method": ["a", "b@x", "c", "d@y"], "condition": [None, None, "", "z"]})
    out, notes = apply_conditions(frame)
    assert list(out["method"]) == ["a", "b@x", "c", "d@y"]
    assert [c if isinstance(c, str) else None for c in out["condition"]] == [None, "x", None, "y"]
    assert len(notes) == 1 and "1 episode(s)" in notes[0]
    empty, _ = apply_conditions(frame.iloc[:0])
    assert empty.empty
    rows = [{**r, "condition": "raw"} for r in _core_rows(methods=("p",), n_db=5)]
    _write_plain(tmp_path / "r", rows)
    (tmp_path / "r" / "turns").mkdir()
    turn = {"method": "p", "condition": "raw", "budget": "XS", "seed": 0, "task_id": "q000", "db_id": "db0",
            "episode_id": "e", "turn": 1, "action": "execute_query", "warning": False, "est_rows_p95": 10.0,
            "actual_rows": 3}
    pq.write_table(pa.Table.from_pylist([turn]), tmp_path / "r" / "turns" / "part.parquet")
    logs = load_runs([tmp_path / "r"])
    assert set(logs.episodes["method"]) == {"p@raw"} and list(logs.turns["method"]) == ["p@raw"]
