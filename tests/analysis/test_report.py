"""Report rendering: rounding, Markdown structure, self-contained HTML, and a real headless-browser render."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from bapsql.analysis.analyze import analyze_runs, summarize
from bapsql.analysis.load import load_runs
from bapsql.analysis.report import fmt, render_html, render_markdown
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
