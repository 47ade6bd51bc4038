"""``bapsql analyze`` and ``python -m jobs.analyze``: end to end on synthetic run dirs, and clear errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from bapsql.analysis.synthetic import SyntheticSpec, synthetic_run, write_run
from bapsql.cli import cli

LADDER = ("XS", "S", "M", "L")
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    spec = SyntheticSpec(
        success={"sft": dict(zip(LADDER, (0.3, 0.33, 0.36, 0.38))), "rl": dict(zip(LADDER, (0.36, 0.4, 0.41, 0.4)))},
        tokens={"sft": dict(zip(LADDER, (1500.0, 1700.0, 1900.0, 2100.0))),
                "rl": dict(zip(LADDER, (1400.0, 1600.0, 1850.0, 2100.0)))},
        n_tasks=200, n_databases=6, seeds=(0, 1),
    )
    root = tmp_path_factory.mktemp("cli") / "run"
    write_run(root, *synthetic_run(spec))
    return root


def test_analyze_writes_the_report_and_says_where(run_dir, tmp_path):
    out = tmp_path / "report"
    result = CliRunner().invoke(cli, ["analyze", str(run_dir), "--out", str(out), "--replicates", "300",
                                      "--seed", "3", "--reference", "sft"])
    assert result.exit_code == 0, result.output
    assert f"{out}/report.html" in result.stdout
    assert "bootstrap" in result.stderr  # progress goes to stderr
    doc = json.loads((out / "summary.json").read_text())
    assert doc["reference"] == "sft" and doc["replicates"] == 300 and doc["seed"] == 3
    assert set(doc["methods"]["rl"]["success"]) == set(LADDER)
    assert doc["methods"]["rl"]["frontier_score"] > doc["methods"]["sft"]["frontier_score"]
    for name in ("report.md", "report.html", "frontier.png", "quality_tokens.png"):
        assert (out / name).stat().st_size > 0


def test_reference_option(run_dir, tmp_path):
    result = CliRunner().invoke(cli, ["analyze", str(run_dir), "--out", str(tmp_path / "o"), "--reference", "rl",
                                      "--replicates", "50"])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "o" / "summary.json").read_text())["reference"] == "rl"


@pytest.mark.parametrize(
    ("args", "message"),
    [(["analyze", "{missing}", "--out", "{out}"], "run directory not found"),
     (["analyze", "{empty}", "--out", "{out}"], "no episodes/**/*.parquet"),
     (["analyze", "{run}", "--out", "{out}", "--reference", "nope"], "reference method 'nope'"),
     (["analyze", "{run}", "--out", "{out}", "--replicates", "0"], "0 is not in the range"),
     (["analyze", "--out", "{out}"], "Missing argument")],
)
def test_bad_input_is_a_one_line_error_not_a_traceback(run_dir, tmp_path, args, message):
    (tmp_path / "empty").mkdir()
    subst = {"missing": tmp_path / "nope", "empty": tmp_path / "empty", "run": run_dir, "out": tmp_path / "o"}
    result = CliRunner().invoke(cli, [a.format(**subst) for a in args])
    assert result.exit_code != 0
    assert message in result.output
    assert "Traceback" not in result.output and not isinstance(result.exception, (TypeError, KeyError, ValueError))


def test_help_lists_the_options():
    result = CliRunner().invoke(cli, ["analyze", "--help"])
    assert result.exit_code == 0
    for option in ("--out", "--reference", "--replicates", "--seed"):
        assert option in result.output


@pytest.mark.slow  # several seconds: the slow tier
def test_jobs_entrypoint(run_dir, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "jobs.analyze", str(run_dir), "--out", str(tmp_path / "j"),
                           "--replicates", "50"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "j" / "summary.json").is_file() and "report:" in proc.stdout



def test_jobs_entrypoint_reports_bad_input_cleanly(tmp_path, capsys):
    from jobs.analyze import main

    with pytest.raises(SystemExit) as exit_info:
        main([str(tmp_path / "nope"), "--out", str(tmp_path / "k")])
    assert exit_info.value.code != 0
    assert "run directory not found" in capsys.readouterr().err
