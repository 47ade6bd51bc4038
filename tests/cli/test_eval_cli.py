"""`bapsql eval`, `bapsql policies`, `bapsql sft-data` through click's CliRunner."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from bapsql.cli import cli
from bapsql.logs.reader import read_episodes
from tests.policies.minibench import build_minibench


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("BAPSQL_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
    yield build_minibench(tmp_path_factory.mktemp("bench"))
    mp.undo()


def test_policies_lists_every_name():
    res = CliRunner().invoke(cli, ["policies"])
    assert res.exit_code == 0
    names = [line.split()[0] for line in res.output.splitlines() if line.strip()]
    assert "workflow.estimate_rewrite" in names and "scripted.drafter" in names and "workflow.recover_from_error" in names and len(names) == 11
    conds = CliRunner().invoke(cli, ["conditions"])
    assert conds.exit_code == 0
    presets = [line.split()[0] for line in conds.output.splitlines() if line.strip()]
    assert presets == ["raw", "dashboard", "adaptive_posthoc", "full", "no_planning", "no_interface",
                       "shuffled_estimate", "no_rewrite", "deterministic_rewrite", "no_abstention"]


def test_eval_writes_parquet_and_prints_a_table(bench, tmp_path):
    out = tmp_path / "run"
    res = CliRunner().invoke(cli, ["eval", "--benchmark", str(bench), "--split", "dev", "--policy", "scripted.drafter@raw",
                                   "--budgets", "XS,S", "--seeds", "0,1", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "24 episodes logged" in res.output
    assert list(out.glob("episodes/**/*.parquet")) and list(out.glob("turns/**/*.parquet"))
    eps = read_episodes(out)
    assert len(eps) == 24 and set(eps["method"]) == {"scripted.drafter@raw"}
    again = CliRunner().invoke(cli, ["eval", "--benchmark", str(bench), "--split", "dev", "--policy", "scripted.drafter@raw",
                                     "--budgets", "XS,S", "--seeds", "0,1", "--out", str(out)])
    assert again.exit_code == 0 and "(24 already there)" in again.output


def test_eval_with_condition_option_records_the_calibration(bench, tmp_path):
    res = CliRunner().invoke(cli, ["eval", "--benchmark", str(bench), "--policy", "workflow:estimate_rewrite",
                                   "--condition", "shuffled_estimate", "--budgets", "XS", "--out",
                                   str(tmp_path / "r"), "--limit", "2"])
    assert res.exit_code == 0, res.output
    eps = read_episodes(tmp_path / "r")
    assert set(eps["method"]) == {"workflow.estimate_rewrite@shuffled_estimate"}
    assert set(eps["condition"]) == {"shuffled_estimate"}
    record = json.loads((tmp_path / "r" / "sweep.json").read_text())
    assert record["methods"] == ["workflow.estimate_rewrite@shuffled_estimate"]
    assert record["calibration"] is None and len(record["calibration_sha256"]) == 64


@pytest.mark.parametrize("args,needle", [
    (["--budgets", "XXL"], "unknown budget level"),
    (["--seeds", "a,b"], "--seeds must be comma-separated integers"),
    (["--policy", "workflow.nope"], "unknown policy"),
    (["--split", "nosuch"], "unknown split"),
])
def test_bad_input_is_one_clear_line(bench, tmp_path, args, needle):
    base = {"--benchmark": str(bench), "--policy": "scripted.drafter@raw", "--out": str(tmp_path / "x")}
    for k, v in zip(args[::2], args[1::2]):
        base[k] = v
    res = CliRunner().invoke(cli, ["eval", *[x for kv in base.items() for x in kv]])
    assert res.exit_code != 0 and needle in res.output
    assert "Traceback" not in res.output and res.exception is None or isinstance(res.exception, SystemExit)


def test_missing_benchmark_folder(tmp_path):
    res = CliRunner().invoke(cli, ["eval", "--benchmark", str(tmp_path / "none"), "--policy", "scripted.drafter@raw",
                                   "--out", str(tmp_path / "o")])
    assert res.exit_code == 2 and "is not a folder" in res.output


def test_sft_data_writes_pairs(bench, tmp_path):
    out = tmp_path / "sft.parquet"
    res = CliRunner().invoke(cli, ["sft-data", "--benchmark", str(bench), "--split", "train", "--n", "20",
                                   "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "20 pairs" in res.output
    assert pq.read_table(out).num_rows == 20


def test_sft_data_per_episode_with_branch_tries_reports_the_branches(bench, tmp_path):
    out = tmp_path / "eps.parquet"
    res = CliRunner().invoke(cli, ["sft-data", "--benchmark", str(bench), "--split", "train", "--n", "6",
                                   "--out", str(out), "--per-episode", "--branch-tries", "8"])
    assert res.exit_code == 0, res.output
    rows = pq.read_table(out).to_pylist()
    assert len(rows) == 6 and all(r["turn"] == r["completion"].count("<tool_call>") for r in rows)
    line = next(x for x in res.output.splitlines() if x.startswith("took their branch: "))
    assert "workflow.estimate_rewrite=" in line  # the mini benchmark's listings overflow XS / S: it rewrote
    bad = CliRunner().invoke(cli, ["sft-data", "--benchmark", str(bench), "--out", str(out), "--branch-tries", "-1"])
    assert bad.exit_code == 2 and "--branch-tries" in bad.output


@pytest.mark.parametrize("cmd", ["eval", "policies", "sft-data"])
def test_help(cmd):
    res = CliRunner().invoke(cli, [cmd, "--help"])
    assert res.exit_code == 0 and "Usage" in res.output
