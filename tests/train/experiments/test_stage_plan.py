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
    LEDGER_RECIPES,
    Step,
    mark_started,
    plan_seed,
    plan_stages,
    read_stages,
    recipe_changes,
    record_attempt,
    set_aside,
    stage_recipe,
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
def _cfg(tmp_path: Path, updates: int = 3, protocol_pairs: int = 6, **train):
    """The toy Table 2 config with ``grpo.updates`` and any ``train`` sections (``grpo`` merged with the updates)."""
    doc = _doc(prompting_model="protocol", protocol={"export_pairs": protocol_pairs})
    doc["train"]["grpo"] = {"updates": updates, **train.pop("grpo", {})}
    doc["train"].update(train)
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


def _history(run: Path, stage: str, updates: int) -> None:
    (run / stage / "history.jsonl").write_text("".join(json.dumps({"update": float(u + 1)}) + "\n"
                                                       for u in range(updates)))


def test_a_finished_grpo_stage_without_checkpoints_is_judged_by_its_history(tmp_path):
    import shutil

    run = _finished_seed(_cfg(tmp_path, updates=2))
    for stage in ("rl_full", "rl_sql"):
        shutil.rmtree(run / stage / "checkpoints")
        _history(run, stage, 2)
    assert plan_stages(_cfg(tmp_path, updates=2), 0)["rl_full"] == "reuse"
    # the key grew and there is nothing to resume from: made again from the SFT model, the old folder kept
    step = plan_seed(_cfg(tmp_path, updates=3), 0)["rl_full"]
    assert step.action == "redo" and "made 2 of grpo.updates 3" in step.why and "no checkpoint" in step.why
    moved = set_aside(_cfg(tmp_path, updates=3), 0, "rl_full", step)
    assert [p.name.split(".stale-")[0] for p in moved] == ["rl_full"] and (moved[0] / "history.jsonl").is_file()
    # a history past the key is refused like a checkpoint past it
    with pytest.raises(ConfigError, match=r"rl_sql of seed 0 made 2 updates, more than the 1 .*history.jsonl"):
        plan_stages(_cfg(tmp_path, updates=1), 0)


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
    # the rows left are current; the set-aside row has no episode, so the sweep resumes for it (a redo stopped
    # right after its set-aside must not read as finished)
    step = plan_seed(cfg, 0)["eval"]
    assert step.action == "resume" and step.why.endswith("rows with no episode yet: bap_rl")
    # GRPO resumed in this call (grpo.updates grew): both RL rows are stale, the others not
    plan = plan_seed(_cfg(tmp_path, updates=2), 0)
    assert plan["rl_full"].action == plan["rl_sql"].action == "resume"
    assert plan["eval"].action == "redo" and plan["eval"].stale_methods == tuple(m for m in logged if "sql_rl" in m)


def test_a_stage_marked_started_is_unfinished_until_its_attempt_is_recorded(tmp_path):
    cfg = _cfg(tmp_path, updates=1)
    run = _finished_seed(cfg)
    for method in (r.logged for r in table2_rows(cfg)):
        _log_episodes(run, method, age=0.0)
    path = stages_path(cfg, 0)
    record_attempt(path, "eval", "run", 1.0, True)
    assert plan_stages(cfg, 0)["eval"] == "reuse"
    mark_started(path, "eval")  # a redo or resume that was killed before it recorded its attempt
    assert not read_stages(path)["eval"]["finished"] and read_stages(path)["eval"]["seconds"] == 1.0
    assert plan_seed(cfg, 0)["eval"] == Step("resume", "the sweep skips the episodes it logged")
    # an evaluation of some rows only (--rows) is recorded unfinished and leaves the rest to resume
    record_attempt(path, "eval", "resume", 2.0, False)
    assert plan_stages(cfg, 0)["eval"] == "resume"
    assert record_attempt(path, "eval", "resume", 3.0, True)["eval"] == {
        **read_stages(path)["eval"], "finished": True, "seconds": 6.0}
    assert plan_stages(cfg, 0)["eval"] == "reuse"
    mark_started(tmp_path / "fresh" / "stages.json", "sft")  # no ledger yet: one is made
    assert read_stages(tmp_path / "fresh" / "stages.json") == {
        "sft": {"finished": False, "seconds": 0.0, "attempts": []}}


def test_set_aside_is_a_no_op_for_other_actions_and_refused_for_stages_without_a_redo(tmp_path):
    cfg = _cfg(tmp_path)
    assert set_aside(cfg, 0, "rl_full", Step("resume")) == []
    with pytest.raises(ConfigError, match="pretrain: has no redo"):
        set_aside(cfg, 0, "pretrain", Step("redo"))


def test_redo_attempts_count_in_the_stage_time(tmp_path):
    path = tmp_path / "stages.json"
    record_attempt(path, "eval", "run", 10.0, True)
    assert record_attempt(path, "eval", "redo", 4.0, True)["eval"]["seconds"] == 14.0


def test_a_stage_whose_settings_changed_is_redone_and_placement_or_memory_keys_are_no_change(tmp_path):
    from bapsql.train.experiments.protocol import protocol_model_dir

    cfg = _cfg(tmp_path, updates=1)
    run = _finished_seed(cfg)
    # the ledger keeps the settings the protocol and SFT stages computed with (table2_run records them)
    for stage in LEDGER_RECIPES:
        record_attempt(stages_path(cfg, 0), stage, "run", 1.0, True, stage_recipe(cfg, stage))
    assert plan_stages(cfg, 0)["sft"] == "reuse" and "sft.lr" in stage_recipe(cfg, "sft")
    # where a stage runs, how it fits memory, what it logs and grpo.updates (a resume) change nothing it makes
    same = _cfg(tmp_path, updates=1, sft={"num_workers": 2, "micro_batch_tokens": 999, "gradient_checkpointing": True},
                grpo={"log_drift": True, "micro_batch_tokens": 777, "gradient_checkpointing": True})
    assert {s: a for s, a in plan_stages(same, 0).items() if s not in ("pretrain", "eval")} == {
        "protocol": "reuse", "sft": "reuse", "rl_full": "reuse", "rl_sql": "reuse"}
    # a GRPO setting: the GRPO stages only (their start.json holds the config they last ran with)
    lr = _cfg(tmp_path, updates=1, grpo={"lr": 1.23e-05})
    steps = plan_seed(lr, 0)
    assert steps["sft"].action == "reuse" and steps["rl_full"].action == steps["rl_sql"].action == "redo"
    assert steps["rl_full"].why.startswith("its settings changed: grpo.lr ") and "1.23e-05" in steps["rl_full"].why
    # the protocol adapter's settings: that stage only
    steps = plan_seed(_cfg(tmp_path, updates=1, protocol_pairs=9), 0)
    assert steps["protocol"].action == "redo" and "sft.export_pairs 6 → 9" in steps["protocol"].why
    assert steps["sft"].action == steps["rl_full"].action == "reuse"
    proto = protocol_model_dir(cfg.train, 0).parent.parent
    (proto / "sft_pairs.parquet").write_bytes(b"PAR1")
    moved = set_aside(cfg, 0, "protocol", steps["protocol"])
    assert sorted(p.name.split(".stale-")[0] for p in moved) == ["sft", "sft_pairs"] and moved[0].parent == proto
    # SFT's data (the branch lever): SFT is redone, and both GRPO stages with it; the protocol SFT pins the key at 0
    lever = _cfg(tmp_path, updates=1, sft={"branch_tries": 8})
    steps = plan_seed(lever, 0)
    assert steps["sft"].action == "redo" and steps["sft"].why == "its settings changed: sft.branch_tries 0 → 8"
    assert steps["rl_full"].action == "redo" and "trained again in this call" in steps["rl_full"].why
    (run / "sft_pairs.parquet").write_bytes(b"PAR1")
    (run / "sft_pairs.stale-20261201T000000.parquet").write_bytes(b"PAR1")
    moved = set_aside(lever, 0, "sft", steps["sft"])
    assert sorted(p.name.split(".stale-")[0] for p in moved) == ["sft", "sft_pairs"]
    assert not (run / "sft").exists() and not (run / "sft_pairs.parquet").exists()
    assert (run / "sft_pairs.stale-20261201T000000.parquet").is_file()  # an earlier set-aside is left where it is


def test_recipe_changes_name_the_keys_and_ignore_keys_one_side_lacks():
    changed = recipe_changes({"sft.lr": 1e-4, "lora.rank": 8}, {"sft.lr": 2e-4, "lora.rank": 8})
    assert changed == "sft.lr 0.0001 → 0.0002"
    assert recipe_changes(None, {"sft.lr": 1e-4}) == "" and recipe_changes({}, {"sft.lr": 1e-4}) == ""
    # a key the code added since (its default is the old behaviour), or one it removed, is no change
    assert recipe_changes({"sft.lr": 1e-4, "sft.gone": 1}, {"sft.lr": 1e-4, "sft.branch_tries": 0}) == ""
