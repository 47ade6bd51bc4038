"""End to end through the library: synthetic run dirs → analyze_runs → files with the contract and right numbers."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from bapsql.analysis.analyze import analyze_runs, comparison_pairs, summarize
from bapsql.analysis.load import load_runs
from bapsql.analysis.report import fmt
from bapsql.analysis.synthetic import SyntheticSpec, synthetic_run, write_run
from bapsql.errors import RunLogError
from tests.analysis.helpers import LADDER, episodes_table

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def run_dirs(tmp_path_factory):
    """Two runs: the main one (sft, rl with a planted XS/S gain and token cut, weak that is much worse) and a
    second one holding a method with only XS and S."""
    root = tmp_path_factory.mktemp("runs")
    spec = SyntheticSpec(
        success={"bap-sql sft": dict(zip(LADDER, (0.30, 0.34, 0.36, 0.38))),
                 "rl": dict(zip(LADDER, (0.40, 0.44, 0.42, 0.40))),
                 "weak": dict(zip(LADDER, (0.10, 0.12, 0.14, 0.15)))},
        tokens={"bap-sql sft": dict(zip(LADDER, (1500.0, 1700.0, 1900.0, 2100.0))),
                "rl": dict(zip(LADDER, (1300.0, 1450.0, 1700.0, 2100.0))),
                "weak": dict(zip(LADDER, (1500.0, 1700.0, 1900.0, 2100.0)))},
        n_tasks=500, n_databases=11, seeds=(0, 1, 2), rng_seed=4,
    )
    episodes, turns = synthetic_run(spec)
    write_run(root / "main", episodes, turns)
    partial = episodes_table([dict(method="partial", budget=b, task_id=f"t{i:05d}", db_id=f"db{i % 11:02d}",
                                   success=i % 4 == 0, total_tokens=1000) for b in ("XS", "S") for i in range(40)])
    write_run(root / "extra", partial)
    frame = pd.concat([episodes.to_pandas(), partial.to_pandas()], ignore_index=True)
    return [root / "main", root / "extra"], frame


@pytest.fixture(scope="module")
def analysed(run_dirs, tmp_path_factory):
    out = tmp_path_factory.mktemp("out")
    messages: list[str] = []
    summary = analyze_runs(run_dirs[0], out, reference="bap-sql sft", replicates=2000, seed=1,
                           progress=messages.append)
    return summary, out, messages, run_dirs[1]


@pytest.mark.slow  # draws every figure
def test_outputs_exist_and_figures_are_pngs(analysed):
    _, out, messages, _ = analysed
    for name in ("report.md", "report.html", "summary.json", "frontier.png", "quality_tokens.png"):
        assert (out / name).is_file() and (out / name).stat().st_size > 0
    for name in ("frontier.png", "quality_tokens.png"):
        assert (out / name).read_bytes().startswith(PNG)
    assert any("bootstrap" in m for m in messages) and any("loading" in m for m in messages)


def test_summary_json_contract_and_numbers(analysed):
    summary, out, _, frame = analysed
    doc = json.loads((out / "summary.json").read_text())
    assert set(doc["methods"]) == {"bap-sql sft", "rl", "weak", "partial"}
    expected = frame.groupby(["method", "budget"])["success"].mean() * 100
    for method, entry in doc["methods"].items():
        for level, value in entry["success"].items():
            assert value == pytest.approx(expected[(method, level)])
    rl = doc["methods"]["rl"]["success"]
    assert doc["methods"]["rl"]["frontier_score"] == pytest.approx((rl["XS"] / 2 + rl["S"] + rl["M"] + rl["L"] / 2) / 3)
    assert doc["methods"]["partial"]["frontier_score"] is None
    assert set(doc["methods"]["partial"]["success"]) == {"XS", "S"}
    assert any("partial" in n and "M/L" in n for n in doc["notes"])
    assert doc["reference"] == "bap-sql sft" and doc["replicates"] == 2000 and doc["levels"] == list(LADDER)
    lo, hi = doc["methods"]["rl"]["success_ci95"]["XS"]
    assert lo < rl["XS"] < hi
    # 4 methods → 6 pairs; partial only has XS/S → 3 pairs × 2 + 3 pairs × 4 = 18 comparisons
    assert len(doc["comparisons"]) == 18
    tok = frame[frame["budget"] == "XS"].pivot_table(index=["task_id", "seed"], columns="method", values="total_tokens")
    key = ("rl", "bap-sql sft", "XS")
    comp = next(c for c in doc["comparisons"] if (c["method"], c["reference"], c["budget"]) == key)
    assert comp["tokens"]["estimate"] == pytest.approx(100 * (tok["rl"].sum() / tok["bap-sql sft"].sum() - 1))
    succ = frame[frame["budget"] == "XS"].pivot_table(index=["task_id", "seed"], columns="method", values="success")
    assert comp["quality"]["estimate"] == pytest.approx(100 * (succ["rl"] - succ["bap-sql sft"]).mean())
    gates = {g["method"]: g for g in doc["primary_gates"]}
    assert gates["rl"]["passed"] is True
    assert [s["status"] for s in gates["rl"]["steps"]] == ["pass"] * 4
    assert gates["weak"]["passed"] is False and gates["weak"]["steps"][0]["status"] == "fail"
    assert gates["partial"]["steps"][0]["status"] in ("pass", "fail")
    assert {t["method"] for t in doc["transitions"]} == {"rl", "weak"}
    cov = {(c["method"], c["budget"], c["quantity"]): c for c in doc["estimator_coverage"]}
    assert cov[("rl", None, "rows")]["p95"] == pytest.approx(95.0, abs=2.0)
    assert {(w["method"], w["budget"]) for w in doc["warning_flow"]} >= {("rl", "XS"), ("partial", "S")}
    assert doc["failures"] and all(sum(f["counts"].values()) <= f["episodes"] for f in doc["failures"])
    assert summary.cell("rl", "XS").success == pytest.approx(rl["XS"])


def test_report_shows_tables_in_paper_layout(analysed):
    summary, out, _, _ = analysed
    md = (out / "report.md").read_text()
    assert "| Method | XS (%) | S (%) | M (%) | L (%) | Frontier Score (pp) |" in md
    partial_row = next(line for line in md.splitlines() if line.startswith("| partial |"))
    assert partial_row.endswith("| — | — | — |")
    assert "| Budget | Quality diff. | NI lower bound | Total-token change (95% CI) |" in md
    assert "Gate: **PASSED**" in md
    assert "![" in md and "(frontier.png)" in md
    assert "Method diagnostics at XS/S" in md and "One-shot transitions" in md
    html = (out / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 2
    assert "<link" not in html and "<script" not in html and 'src="http' not in html
    rl_row = next(line for line in md.splitlines() if line.startswith("| rl |"))
    assert rl_row.endswith(f"| {fmt(summary.frontier['rl'])} |")


def test_reference_choice(run_dirs, tmp_path):
    assert comparison_pairs(["a", "b", "ref"], "ref") == [("a", "b"), ("a", "ref"), ("b", "ref")]
    assert comparison_pairs(["a", "b", "c"], "a") == [("b", "a"), ("c", "a"), ("b", "c")]
    logs = load_runs(run_dirs[0][:1])
    summary = summarize(logs, reference="rl", replicates=200)
    assert summary.reference == "rl" and {g.reference for g in summary.gates} == {"rl"}
    assert {t.reference for t in summary.transitions} == {"rl"}
    unnamed = summarize(logs, replicates=200)  # no reference is guessed from names or order
    assert unnamed.reference is None and unnamed.gates == () and unnamed.transitions == ()
    assert len(unnamed.comparisons) == len(summary.comparisons)  # every pair is still compared
    assert any("no reference method named" in n for n in unnamed.notes)
    with pytest.raises(RunLogError, match="reference method 'nope'"):
        summarize(logs, reference="nope", replicates=10)
    with pytest.raises(RunLogError, match="replicates"):
        summarize(logs, replicates=0)


def test_single_method_run_still_reports(tmp_path):
    rows = [dict(method="solo", budget=b, task_id=f"t{i}", db_id=f"d{i % 3}", success=i % 2 == 0)
            for b in LADDER for i in range(12)]
    write_run(tmp_path / "r", episodes_table(rows))
    summary = analyze_runs([tmp_path / "r"], tmp_path / "o", replicates=100)
    assert summary.reference is None and summary.comparisons == () and summary.gates == ()
    assert summary.frontier["solo"] == pytest.approx(50.0)
    doc = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert doc["methods"]["solo"]["success"] == {lv: pytest.approx(50.0) for lv in LADDER}
    assert not math.isnan(doc["methods"]["solo"]["frontier_score"])
