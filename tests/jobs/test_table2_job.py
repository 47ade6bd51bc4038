"""``python -m jobs.table2`` end to end on a toy slice, killed (SIGKILL) after a stage and resumed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

REPO = Path(__file__).resolve().parents[2]

TOY = {
    "train": {
        "extends": str(REPO / "configs" / "train" / "cpu_learn_tiny.yaml"),
        "name": "toy",
        "monitor": {"kind": "none"},
        "data": {"limit": 8},
        "pretrain": {"steps": 3, "batch": 2, "corpus_episodes": 16, "augment_rounds": 1, "log_every": 1,
                     "hidden_size": 64, "num_layers": 1, "intermediate_size": 128,
                     "conditions": ["raw", "dashboard", "adaptive_posthoc", "full"], "budgets": ["XS", "S"]},
        "sft": {"export_pairs": 8, "epochs": 1, "effective_batch": 8},
        "grpo": {"updates": 1, "max_new_tokens": 16},
        "filter": {"group_size": 2, "min_success": 0, "max_success": 2, "groups_per_update": 1, "max_rounds": 1,
                   "max_groups_per_round": 1, "enabled": False},
        "checkpoint": {"every": 1, "keep": 2},
        "eval": {"budgets": ["XS", "S"], "limit": 2, "max_new_tokens": 16, "replicates": 50},
    },
}


def test_cli_names_a_bad_stage_and_a_missing_preset(tmp_path):
    from jobs.table2 import main

    result = CliRunner().invoke(main, ["--stages", "sft,grpo"])
    assert result.exit_code != 0 and "grpo" in result.output
    cfg = tmp_path / "t.yaml"
    cfg.write_text(yaml.safe_dump(TOY))
    result = CliRunner().invoke(main, ["--config", str(cfg), "--quick", "--out-dir", str(tmp_path / "runs")])
    assert result.exit_code != 0 and "no quick: preset" in result.output
    result = CliRunner().invoke(main, ["--config", str(cfg), "--out-dir", str(tmp_path / "runs"), "--stages", "eval",
                                       "--rows", "sft,bap-rl"])
    assert result.exit_code != 0 and "unknown row(s) ['bap-rl']" in result.output


def _stages(run: Path) -> dict:
    path = run / "table2" / "stages.json"
    try:
        return json.loads(path.read_text())["stages"] if path.is_file() else {}
    except json.JSONDecodeError:
        return {}


def _kill_leftovers(marker: str) -> None:
    """SIGKILL the processes this test started that outlived their group (Ray's, named by the run folder)."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmd:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except OSError:
                pass


@pytest.mark.slow
def test_table2_job_end_to_end_resumes_after_a_kill(tmp_path):
    cfg = tmp_path / "toy.yaml"
    cfg.write_text(yaml.safe_dump(TOY))
    out = tmp_path / "runs"
    run = out / "toy-seed0"
    env = {**os.environ, "PYTHONPATH": str(REPO), "WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path),
           "RAY_AUTH_MODE": "disabled"}
    cmd = [sys.executable, "-m", "jobs.table2", "--config", str(cfg), "--out-dir", str(out)]
    log = (tmp_path / "first.log").open("w")
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 900
        while not _stages(run).get("sft", {}).get("finished"):
            assert proc.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "SFT did not finish in 15 minutes"
            time.sleep(1)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        _kill_leftovers(str(tmp_path))
    first = _stages(run)
    assert first["pretrain"]["finished"] and first["sft"]["finished"]
    assert not first.get("eval", {}).get("finished")
    sft_model = run / "sft" / "merged" / "config.json"
    stamp = sft_model.stat().st_mtime_ns

    again = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    _kill_leftovers(str(tmp_path))
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    stages = _stages(run)
    assert [a["action"] for a in stages["pretrain"]["attempts"]] == ["run", "reuse"]
    assert [a["action"] for a in stages["sft"]["attempts"]] == ["run", "reuse"]
    assert sft_model.stat().st_mtime_ns == stamp  # reused, not retrained
    for stage in ("rl_full", "rl_sql", "eval"):
        assert stages[stage]["finished"] and stages[stage]["seconds"] > 0
    # the trained rows are evaluated first (an interrupted sweep has them whole), the prompting rows after
    methods = json.loads((run / "table2" / "eval" / "sweep.json").read_text())["config"]["methods"]
    assert [m[len("model."):].split("@")[0] for m in methods[:3]] == ["sft", "sql_rl", "bap_rl"]
    assert [m.split("@")[1] for m in methods[3:]] == ["raw", "dashboard", "adaptive_posthoc"]
    # 16 new tokens a turn cannot hold the answers of the toy's lists: GRPO and the sweep say so before they run
    assert "gold answers need more than 16 new tokens" in " ".join((again.stdout + again.stderr).split())
    report = out / "toy-table2"
    md = (report / "table2.md").read_text()
    for label in ("Raw agent", "Dashboard", "Adaptive post-hoc", "BAP-SQL SFT", "SQL-RL (matched)", "BAP-SQL RL"):
        assert f"| {label} |" in md
    assert (report / "table2" / "report.md").is_file() and (report / "gate" / "report.md").is_file()
    assert (run / "rl_full" / "merged" / "config.json").is_file() and (run / "rl_sql" / "merged").is_dir()
    # both RL stages trained from the same SFT model with their own reward
    done = json.loads((report / "table2.json").read_text())
    assert {r["key"] for r in done["rows"]} == {"raw", "dashboard", "adaptive_posthoc", "sft", "sql_rl", "bap_rl"}
    # issue 30, item 8: ... the same SFT adapter, by hash, and the same config but for the reward
    from bapsql.train.recipe.pipeline import tree_sha256
    from bapsql.train.experiments.table2 import load_table2_config, rl_pair

    starts = [json.loads((run / stage / "start.json").read_text()) for stage in ("rl_full", "rl_sql")]
    assert starts[0]["sft_adapter_sha256"] == starts[1]["sft_adapter_sha256"] == tree_sha256(run / "sft" / "adapter")
    assert starts[0]["init_model"] == starts[1]["init_model"] == str(run / "sft" / "merged")
    assert (starts[0]["config"]["reward.variant"], starts[1]["config"]["reward.variant"]) == ("full", "correctness")
    assert {k for k in starts[0]["config"] if starts[0]["config"][k] != starts[1]["config"].get(k)} == {
        "reward.variant"}
    pair = rl_pair(load_table2_config(cfg, out_dir=str(out)), 0)
    assert pair.same_start and pair.differences == ("reward.variant",)

    # grpo.updates grows: both GRPO stages continue from their checkpoint, the RL rows' episodes are set aside and
    # evaluated again, the other rows are kept
    more = tmp_path / "more.yaml"
    more.write_text(yaml.safe_dump({**TOY, "train": {**TOY["train"], "grpo": {**TOY["train"]["grpo"], "updates": 2}}}))
    cmd_more = [sys.executable, "-m", "jobs.table2", "--config", str(more), "--out-dir", str(out),
                "--stages", "rl_full,rl_sql,eval", "--rows", "bap_rl"]
    third = subprocess.run(cmd_more, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    _kill_leftovers(str(tmp_path))
    said = " ".join((third.stdout + third.stderr).split())
    assert third.returncode == 0, third.stdout[-3000:] + third.stderr[-3000:]
    assert said.count("resume: it made 1 of grpo.updates 2 updates; continues from update-000001") == 2
    stages = _stages(run)
    for stage in ("rl_full", "rl_sql"):
        assert stages[stage]["attempts"][-1]["action"] == "resume"
        assert (run / stage / "checkpoints" / "update-000002").is_dir()
    assert stages["eval"]["attempts"][-1]["action"] == "redo"
    (stale,) = (run / "table2").glob("eval.stale-*")
    assert sorted(p.name for p in (stale / "episodes").iterdir()) == ["method=model.bap_rl@full",
                                                                      "method=model.sql_rl@full"]
    # --rows bap_rl: only BAP-SQL RL was evaluated again; the stage stays unfinished and the next call plays SQL-RL
    assert not stages["eval"]["finished"] and "rows bap_rl only" in said
    logged = sorted(p.name for p in (run / "table2" / "eval" / "episodes").iterdir())
    assert len(logged) == 5 and "method=model.sql_rl@full" not in logged
    fourth = subprocess.run([*cmd_more[:-3], "eval,report"], cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=1800)
    _kill_leftovers(str(tmp_path))
    assert fourth.returncode == 0, fourth.stdout[-3000:] + fourth.stderr[-3000:]
    assert "rows with no episode yet: sql_rl" in " ".join((fourth.stdout + fourth.stderr).split())
    assert _stages(run)["eval"]["finished"] and _stages(run)["eval"]["attempts"][-1]["action"] == "resume"
    assert len(list((run / "table2" / "eval" / "episodes").iterdir())) == 6


def test_default_stages_are_every_stage_in_order():
    from bapsql.train.experiments.table2 import STAGES
    from jobs.table2 import DEFAULT_STAGES

    assert tuple(DEFAULT_STAGES.split(",")) == STAGES
