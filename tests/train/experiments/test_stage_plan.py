"""The stage plan of Table 2 (`bapsql.train.experiments.stage_plan`): reuse / resume / run / skip from the run's
files, GRPO stages extended when ``grpo.updates`` grew, and stale stages made again with their old output set aside."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from bapsql.errors import ConfigError
from bapsql.train.experiments.stage_plan import (
    plan_seed,
    plan_stages,
    read_stages,
    record_attempt,
    set_aside,
    stages_path,
)
from bapsql.train.experiments.table2 import SEED_STAGES, load_table2_config, rl_config, table2_rows
from tests.train.experiments.test_table2 import _doc, _touch_model, _write

CKPT_NAME = "update-000001"


def test_plan_reuses_finished_stages_and_resumes_partial_ones(tmp_path):
    cfg = load_table2_config(_write(tmp_path, _doc()), out_dir=str(tmp_path / "runs"))
    run = cfg.train.run_dir(0)
    assert plan_stages(cfg, 0) == {s: "skip" if s == "protocol" else "run" for s in SEED_STAGES}
    assert plan_stages(cfg, 0, ("sft", "eval"))["pretrain"] == "skip"
    _touch_model(run / "pretrain" / "model")
    _touch_model(run / "sft" / "merged")
    record_attempt(stages_path(cfg, 0), "pretrain", "run", 12.5, True)
    # SFT's output is there but no record says it finished (killed while saving): it runs again
    plan = plan_stages(cfg, 0)
    assert plan["pretrain"] == "reuse" and plan["sft"] == "run"
    record_attempt(stages_path(cfg, 0), "sft", "run", 3.0, True)
    ckpt = run / "rl_full" / "checkpoints" / CKPT_NAME
    ckpt.mkdir(parents=True)
    (ckpt / "state.json").write_text("{}")  # a complete checkpoint folder (bapsql.train.learner.checkpoint)
    plan = plan_stages(cfg, 0)
    assert plan == {"pretrain": "reuse", "protocol": "skip", "sft": "reuse", "rl_full": "resume", "rl_sql": "run",
                    "eval": "run"}
    (run / "table2" / "eval" / "episodes").mkdir(parents=True)
    (run / "table2" / "eval" / "episodes" / "part-0.parquet").write_bytes(b"")
    assert plan_stages(cfg, 0)["eval"] == "resume"
    # a recorded stage whose output was deleted runs again
    import shutil

    shutil.rmtree(run / "sft")
    assert plan_stages(cfg, 0)["sft"] == "run"


def test_pretrain_is_skipped_when_disabled(tmp_path):
    doc = _doc()
    doc["train"]["pretrain"] = {"enabled": False}
    cfg = load_table2_config(_write(tmp_path, doc), out_dir=str(tmp_path / "runs"))
    assert plan_stages(cfg, 0)["pretrain"] == "skip"


def test_unknown_stage_is_named(tmp_path):
    cfg = load_table2_config(_write(tmp_path, _doc()), out_dir=str(tmp_path / "runs"))
    with pytest.raises(ConfigError, match="grpo"):
        plan_stages(cfg, 0, ("grpo",))


def test_stage_record_sums_the_attempts_that_computed(tmp_path):
    path = tmp_path / "stages.json"
    record_attempt(path, "rl_full", "run", 10.0, False)
    record_attempt(path, "rl_full", "resume", 5.0, True)
    stages = record_attempt(path, "rl_full", "reuse", 0.0, True)
    rec = stages["rl_full"]
    assert rec["finished"] and rec["seconds"] == 15.0
    assert [a["action"] for a in rec["attempts"]] == ["run", "resume", "reuse"]
    assert read_stages(path) == json.loads(path.read_text())["stages"]


def test_protocol_model_is_reused_from_its_own_run(tmp_path):
    from bapsql.train.experiments.protocol import protocol_model_dir

    cfg = load_table2_config(_write(tmp_path, _doc(prompting_model="protocol", protocol={"export_pairs": 6})),
                             out_dir=str(tmp_path / "runs"))
    merged = protocol_model_dir(cfg.train, 0)
    assert merged == tmp_path / "runs" / "t2-protocol-seed0" / "sft" / "merged"
    assert plan_stages(cfg, 0)["protocol"] == "run"
    _touch_model(merged)
    record_attempt(stages_path(cfg, 0), "protocol", "run", 1.0, True)
    assert plan_stages(cfg, 0)["protocol"] == "reuse"
    assert [r.engine for r in table2_rows(cfg)][:3] == ["protocol"] * 3


# ----------------------------------------------------------------------------------- stale and short stages
def _cfg(tmp_path: Path, updates: int = 3):
    doc = _doc(prompting_model="protocol", protocol={"export_pairs": 6})
    doc["train"]["grpo"] = {"updates": updates}
    return load_table2_config(_write(tmp_path, doc), out_dir=str(tmp_path / "runs"))


def _checkpoint(run: Path, stage: str, update: int) -> None:
    ckpt = run / stage / "checkpoints" / f"update-{update:06d}"
    ckpt.mkdir(parents=True)
    (ckpt / "state.json").write_text(json.dumps({"update": update}))


def _finished_seed(cfg) -> Path:
    """Every stage of seed 0 recorded finished, its model there, GRPO stages at update 1, no eval yet."""
    from bapsql.train.experiments.protocol import protocol_model_dir
    from bapsql.train.recipe.pipeline import sft_dir, write_grpo_start

    t = cfg.train
    run = t.run_dir(0)
    adapter = sft_dir(t, 0) / "adapter"
    adapter.mkdir(parents=True)
    (adapter / "adapter_model.safetensors").write_bytes(b"lora-weights")
    for model in (protocol_model_dir(t, 0), sft_dir(t, 0) / "merged", run / "rl_full" / "merged",
                  run / "rl_sql" / "merged"):
        _touch_model(model)
    for stage in ("rl_full", "rl_sql"):
        write_grpo_start(rl_config(t, stage), 0, sft_dir(t, 0) / "merged", run / stage)
        _checkpoint(run, stage, 1)
    for stage in ("pretrain", "protocol", "sft", "rl_full", "rl_sql"):
        record_attempt(stages_path(cfg, 0), stage, "run", 1.0, True)
    return run


def _log_episodes(run: Path, method: str, age: float) -> None:
    """A logged partition of ``method`` (episodes and turns) written ``age`` seconds ago."""
    for sub in ("episodes", "turns"):
        part = run / "table2" / "eval" / sub / f"method={method}" / "budget=XS"
        part.mkdir(parents=True, exist_ok=True)
        f = part / "part-00000.parquet"
        f.write_bytes(b"PAR1")
        os.utime(f, (time.time() - age, time.time() - age))


def test_a_finished_grpo_stage_short_of_its_updates_resumes_and_one_past_them_is_an_error(tmp_path):
    run = _finished_seed(_cfg(tmp_path, updates=1))
    assert plan_stages(_cfg(tmp_path, updates=1), 0)["rl_full"] == "reuse"
    steps = plan_seed(_cfg(tmp_path, updates=3), 0)
    assert steps["rl_full"].action == steps["rl_sql"].action == "resume"
    assert "made 1 of grpo.updates 3" in steps["rl_full"].why and CKPT_NAME in steps["rl_full"].why
    _checkpoint(run, "rl_sql", 5)
    with pytest.raises(ConfigError, match=r"grpo.updates: rl_sql of seed 0 made 5 updates, more than the 3"):
        plan_stages(_cfg(tmp_path, updates=3), 0)


def test_grpo_stages_are_redone_when_their_sft_model_changed_and_the_old_ones_are_kept(tmp_path):
    from bapsql.train.recipe.pipeline import sft_dir

    cfg = _cfg(tmp_path, updates=1)
    run = _finished_seed(cfg)
    assert plan_stages(cfg, 0)["rl_full"] == "reuse"
    # SFT trained again after GRPO started from it: another adapter
    (sft_dir(cfg.train, 0) / "adapter" / "adapter_model.safetensors").write_bytes(b"other-lora-weights")
    step = plan_seed(cfg, 0)["rl_full"]
    assert step.action == "redo" and "another SFT adapter" in step.why
    moved = set_aside(cfg, 0, "rl_full", step)
    assert len(moved) == 1 and moved[0].name.startswith("rl_full.stale-")
    assert (moved[0] / "start.json").is_file() and not (run / "rl_full").exists()
    assert plan_stages(cfg, 0)["rl_full"] == "run"  # nothing left to continue from: GRPO starts afresh
    # SFT that runs in this call makes both GRPO stages stale
    (run / "sft" / "merged" / "config.json").unlink()
    plan = plan_seed(cfg, 0)
    assert plan["sft"].action == "run" and plan["rl_sql"].action == "redo"
    assert "trained again in this call" in plan["rl_sql"].why


def test_evaluation_redoes_only_the_rows_whose_model_is_newer_than_their_episodes(tmp_path):
    cfg = _cfg(tmp_path, updates=1)
    run = _finished_seed(cfg)
    logged = [r.logged for r in table2_rows(cfg)]
    for method in logged:
        _log_episodes(run, method, age=0.0)
    record_attempt(stages_path(cfg, 0), "eval", "run", 1.0, True)
    assert plan_stages(cfg, 0)["eval"] == "reuse"
    # BAP-SQL RL's model is rewritten after its episodes were logged (an update more)
    bap = next(m for m in logged if "bap_rl" in m)
    for sub in ("episodes", "turns"):
        for f in (run / "table2" / "eval" / sub / f"method={bap}").rglob("*.parquet"):
            os.utime(f, (time.time() - 60, time.time() - 60))
    step = plan_seed(cfg, 0)["eval"]
    assert step.action == "redo" and step.stale_methods == (bap,) and "bap_rl" in step.why
    moved = set_aside(cfg, 0, "eval", step)
    assert sorted(p.parent.name for p in moved) == ["episodes", "turns"]
    assert all(p.parent.parent.name.startswith("eval.stale-") and any(p.rglob("*.parquet")) for p in moved)
    left = sorted(p.name for p in (run / "table2" / "eval" / "episodes").iterdir())
    assert left == sorted(f"method={m}" for m in logged if m != bap)
    assert plan_stages(cfg, 0)["eval"] == "reuse"  # the rows left are current; a rerun logs the missing ones
    # GRPO resumed in this call (grpo.updates grew): both RL rows are stale, the others not
    plan = plan_seed(_cfg(tmp_path, updates=2), 0)
    assert plan["rl_full"].action == plan["rl_sql"].action == "resume"
    assert plan["eval"].action == "redo" and plan["eval"].stale_methods == tuple(m for m in logged if "sql_rl" in m)


def test_set_aside_is_a_no_op_for_other_actions_and_refused_for_stages_without_a_redo(tmp_path):
    from bapsql.train.experiments.stage_plan import Step

    cfg = _cfg(tmp_path)
    assert set_aside(cfg, 0, "rl_full", Step("resume")) == []
    with pytest.raises(ConfigError, match="sft: has no redo"):
        set_aside(cfg, 0, "sft", Step("redo"))


def test_redo_attempts_count_in_the_stage_time(tmp_path):
    path = tmp_path / "stages.json"
    record_attempt(path, "eval", "run", 10.0, True)
    assert record_attempt(path, "eval", "redo", 4.0, True)["eval"]["seconds"] == 14.0
