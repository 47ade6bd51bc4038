"""Report rendering: rounding, Markdown structure, self-contained HTML, and a real headless-browser render."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from bapsql.analysis.analyze import analyze_runs, summarize
from bapsql.analysis.load import load_runs
from bapsql.analysis.render import render_html, render_markdown
from bapsql.analysis.report import fmt
from bapsql.analysis.synthetic import SyntheticSpec, synthetic_run, write_run
from tests.analysis.helpers import LADDER, episodes_table

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.parametrize(
    ("value", "kwargs", "text"),
    [(30.150000000000002, {}, "30.2"), (90.45 / 3, {}, "30.2"), (34.883, {}, "34.9"), (0.05, {}, "0.1"),
     (-0.04, {}, "0.0"), (-0.04, {"signed": True}, "0.0"), (3.4, {"signed": True}, "+3.4"),
     (-4.5, {"signed": True}, "-4.5"), (1530.4, {"digits": 0, "grouped": True}, "1,530"),
     (0.0059, {"digits": 3}, "0.006"), (None, {}, "—"), (float("nan"), {}, "—"), (float("inf"), {}, "—")],
)
def test_fmt_rounds_half_up_and_marks_missing(value, kwargs, text):
    assert fmt(value, **kwargs) == text


def _summary(tmp_path):
    rows = [dict(method=m, budget=b, seed=s, task_id=f"t{i}", db_id=f"d{i % 3}", success=(i + s + len(m)) % 3 == 0,
                 total_tokens=100 + i, warnings=i % 2, rewrites=int(i % 3 == 0), failure="" if (i + s + len(m)) % 3 == 0
                 else "insufficient_evidence")
            for m in ("sft", "<b>rl|x</b>") for b in LADDER for s in (0, 1) for i in range(9)]
    write_run(tmp_path / "r", episodes_table(rows))
    return summarize(load_runs([tmp_path / "r"]), reference="sft", replicates=200, seed=0)


def test_markdown_tables_are_well_formed_and_escaped(tmp_path):
    md = render_markdown(_summary(tmp_path), figures=("frontier.png",))
    lines = md.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("|---"):
            header = lines[i - 1]
            width = header.replace("\\|", "").count("|")
            j = i + 1
            while j < len(lines) and lines[j].startswith("| "):
                assert lines[j].replace("\\|", "").count("|") == width, lines[j]
                j += 1
    assert "<b>rl\\|x</b>" in md
    assert "(frontier.png)" in md and "(quality_tokens.png)" not in md  # only figures that exist are linked


def test_html_is_self_contained_and_escapes_text(tmp_path):
    page = render_html(_summary(tmp_path), figures={"frontier.png": b"\x89PNG fake"})
    assert page.startswith("<!DOCTYPE html>") and "<style>" in page
    assert "&lt;b&gt;rl|x&lt;/b&gt;" in page and "<b>rl" not in page
    assert page.count("data:image/png;base64,") == 1
    assert "<strong>" in page  # the gate verdict is emphasised


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")
def test_report_renders_in_headless_chromium(tmp_path):
    from PIL import Image

    spec = SyntheticSpec(
        success={m: dict(zip(LADDER, (p, p + 0.03, p + 0.05, p + 0.06))) for m, p in
                 (("sft", 0.31), ("rl", 0.35), ("raw agent", 0.18))},
        tokens={m: dict(zip(LADDER, (1500.0, 1700.0, 1900.0, 2100.0))) for m in ("sft", "rl", "raw agent")},
        n_tasks=300,
    )
    write_run(tmp_path / "run", *synthetic_run(spec))
    analyze_runs([tmp_path / "run"], tmp_path / "out", reference="sft", replicates=500)
    shot = tmp_path / "shot.png"
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}", "--window-size=1280,2000",
           (tmp_path / "out" / "report.html").as_uri()]
    subprocess.run(cmd, check=True, capture_output=True, timeout=120)
    assert shot.is_file() and shot.stat().st_size > 20_000
    with Image.open(shot) as img:
        assert img.size == (1280, 2000)
        colours = img.convert("RGB").getcolors(maxcolors=1_000_000)
    assert colours is not None and len(colours) > 200  # text, tables and an embedded figure, not a blank page


def test_official_ex_states_its_denominator(tmp_path):
    """Issue 30, item 3: the report says over how many episodes Official EX is a mean, and what counts as wrong."""
    rows = [dict(method=m, budget=b, task_id=f"t{i}", db_id=f"d{i % 5}", success=i % 2 == 0,
                 official_ex=(i % 4 != 0) if (m == "a" or i < 10) else None)
            for m in ("a", "b") for b in LADDER for i in range(20)]
    write_run(tmp_path / "r", episodes_table(rows))
    summary = summarize(load_runs([tmp_path / "r"]), replicates=50, seed=0)
    assert summary.cell("a", "XS").official_ex_n == 20 and summary.cell("b", "XS").official_ex_n == 10
    md = render_markdown(summary)
    assert "| a | 20 / 20 | 20 / 20 | 20 / 20 | 20 / 20 |" in md
    assert "| b | 10 / 20 | 10 / 20 | 10 / 20 | 10 / 20 |" in md
    assert "ran no SQL" in md  # the rule for what counts as wrong is stated


def test_coverage_reports_stopped_and_rejected_runs_apart_and_the_placebo_record(tmp_path):
    """Issue 30, items 4 and 7: the report's coverage table shows cap-stopped and preflight-rejected runs apart, and
    a placebo run's record (sweep.json: how far from an exact permutation) reaches the report."""
    import json

    from tests.analysis.helpers import turns_table

    rows = [dict(method=m, budget=b, task_id=f"t{i}", db_id=f"d{i % 3}", success=i % 2 == 0)
            for m in ("p@full", "p@shuffled_estimate") for b in LADDER for i in range(6)]
    turns = [dict(method="p@full", budget="XS", action="execute_query", status="truncated", actual_vm_steps=249_000,
                  est_vm_steps_p50=9e4, est_vm_steps_p95=249_500.0, vm_steps_after=249_100),
             dict(method="p@full", budget="XS", action="execute_query", status="rejected", est_vm_steps_p50=9e5,
                  est_vm_steps_p95=1.2e6),
             dict(method="p@full", budget="XS", action="execute_query", status="ok", actual_vm_steps=10,
                  est_vm_steps_p50=20.0, est_vm_steps_p95=30.0, actual_rows=1, est_rows_p50=1.0, est_rows_p95=1.0)]
    write_run(tmp_path / "r", episodes_table(rows), turns_table(turns))
    (tmp_path / "r" / "sweep.json").write_text(json.dumps({"placebo": {"p@shuffled_estimate": {
        "source": "p@full", "recorded": 40, "requests": 42, "shown": 42, "extra": 3, "unused": 1, "unmatched": 4}}}))
    summary = summarize(load_runs([tmp_path / "r"]), replicates=50, seed=0)
    assert summary.placebo["p@shuffled_estimate"]["unmatched"] == 4
    md = render_markdown(summary)
    assert "| p@full | vm steps | 50.0 | 50.0 | 2 | 1 | 0 | 1 |" in md
    assert "Cost-matched placebo" in md and "| p@shuffled_estimate | p@full | 42 | 3 | 1 | 4 | no |" in md


def test_the_report_counts_tasks_with_an_empty_gold_answer(tmp_path):
    """Issue 30, item 9: an answer of [] is correct without evidence where the gold query returns no rows; the
    report says how many such tasks the runs hold and how methods fare on them."""
    empty, full = '{"kind": "list", "values": []}', '{"kind": "scalar", "values": [3]}'
    rows = [dict(method=m, budget=b, task_id=f"t{i}", db_id=f"d{i % 3}", gold=empty if i < 2 else full,
                 success=(i < 2) if m == "rl" else i % 2 == 0)
            for m in ("rl", "sft") for b in LADDER for i in range(8)]
    write_run(tmp_path / "r", episodes_table(rows))
    summary = summarize(load_runs([tmp_path / "r"]), replicates=50, seed=0)
    assert summary.empty_gold["tasks"] == 2 and summary.empty_gold["of_tasks"] == 8
    assert summary.empty_gold["success"] == {"rl": 100.0, "sft": 50.0}
    md = render_markdown(summary)
    assert "2 of 8 tasks" in md and "empty gold" in md.lower()
