"""``bapsql sweep``: runs an experiment YAML (here in-process with --local), resumes, and fails with one clear line."""

from __future__ import annotations

import json

import pytest
import yaml
from click.testing import CliRunner

from bapsql.cli import cli
from bapsql.logs.reader import read_episodes
from tests.rollout.rollout_bench import build_rollout_bench


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    root = tmp_path_factory.mktemp("sweepcli")
    bench = build_rollout_bench(root / "bench")
    path = root / "exp.yaml"
    path.write_text(yaml.safe_dump({"run": "cli", "benchmark": str(bench), "split": "dev",
                                    "methods": ["workflow:estimate_rewrite", "scripted.drafter@raw"], "budgets": ["XS"],
                                    "seeds": [0], "limit": 4, "workers": {"env_workers": 2}}))
    return path


def test_sweep_runs_logs_and_resumes(config, tmp_path):
    runner = CliRunner()
    out = tmp_path / "run"
    res = runner.invoke(cli, ["sweep", str(config), "--out", str(out), "--local"])
    assert res.exit_code == 0, res.output
    assert "8 episodes logged" in res.output and "bapsql analyze" in res.output
    eps = read_episodes(out)
    assert len(eps) == 8 and set(eps["method"]) == {"workflow.estimate_rewrite@full", "scripted.drafter@raw"}
    assert json.loads((out / "sweep.json").read_text())["episodes_run"] == 8
    again = runner.invoke(cli, ["sweep", str(config), "--out", str(out), "--local"])
    assert again.exit_code == 0 and "0 episodes logged" in again.output and "8 already there" in again.output
    assert len(read_episodes(out)) == 8


def test_sweep_errors_are_one_line(config, tmp_path):
    runner = CliRunner()
    res = runner.invoke(cli, ["sweep", str(tmp_path / "missing.yaml")])
    assert res.exit_code == 2 and "is not a file" in res.output and "Traceback" not in res.output
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"run": "x", "methods": ["scripted.drafter@raw"], "seedz": [0]}))
    res = runner.invoke(cli, ["sweep", str(bad), "--local"])
    assert res.exit_code == 1 and "seedz" in res.output and "Traceback" not in res.output
    res = runner.invoke(cli, ["sweep", str(config), "--local", "--address", "auto"])
    assert res.exit_code == 2 and "exclude each other" in res.output


def test_sweep_help_describes_the_command():
    res = CliRunner().invoke(cli, ["sweep", "--help"])
    assert res.exit_code == 0 and "--address" in res.output and "resum" in res.output
