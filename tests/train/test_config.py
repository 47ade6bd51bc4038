"""Strict training configs: every shipped recipe loads; typos fail loudly naming the key; extends merges."""

from pathlib import Path

import pytest

from bapsql.errors import ConfigError
from bapsql.train.config import load_train_config

ROOT = Path(__file__).resolve().parents[2]
# sized for a 2-core machine, not the paper's settings
CPU_RECIPES = ("cpu_learn", "cpu_learn_recover", "cpu_learn_slips", "cpu_learn_split", "cpu_learn_tiny")
RECIPES = sorted(p for p in (ROOT / "configs" / "train").glob("*.yaml") if p.stem not in CPU_RECIPES)


def test_every_recipe_loads_with_the_paper_settings():
    names = {}
    for path in RECIPES:
        cfg = load_train_config(path)
        names[path.stem] = cfg
        assert cfg.seeds == (0, 1, 2) and cfg.lora.rank == 32
        assert (cfg.sft.lr, cfg.sft.effective_batch, cfg.sft.max_length, cfg.sft.epochs) == (1e-4, 128, 8192, 1)
        assert (cfg.grpo.lr, cfg.grpo.updates, cfg.grpo.temperature, cfg.grpo.top_p) == (1e-6, 120, 1.0, 0.95)
        assert (cfg.filter.group_size, cfg.filter.min_success, cfg.filter.max_success,
                cfg.filter.groups_per_update) == (8, 2, 6, 16)
        assert cfg.grpo.loss.kl_coef == 0.0 and cfg.budgets.levels == ("XS", "S", "M", "L")
    assert names["ablation_sql_rl"].reward.variant == "correctness"
    assert names["ablation_no_efficiency"].reward.variant == "no_efficiency"
    assert names["ablation_no_planning"].condition == "no_planning"
    assert names["ablation_no_planning_sql_rl"].reward.variant == "correctness"
    assert names["ablation_context_only"].grpo.trainable_actions == ("manage_evidence",)
    assert names["main_4b"].reward.variant == "full" and names["main_4b"].condition == "full"
    assert names["main_7b"].model.base != names["main_4b"].model.base != names["sql_transfer_4b"].model.base
    assert len({c.name for c in names.values()}) == len(names)


def test_tiny_cpu_learning_recipe_scores_held_out_tasks_of_the_training_databases():
    cfg = load_train_config(ROOT / "configs" / "train" / "cpu_learn_tiny.yaml")
    assert (cfg.data.split, cfg.data.eval_split) == ("train", "test") and "dev" in cfg.eval.extra_splits
    assert cfg.prompt_style == "terse" and cfg.pretrain.enabled and cfg.sft.per_episode and cfg.grpo.log_drift
    assert not cfg.sft.use_gpu and cfg.filter.min_success == 1 and cfg.filter.max_success == 7
    assert (cfg.grpo.prompts, cfg.grpo.schedule) == ("augmented", "cosine")
    # explores at T = 1 and keeps the update that validates best on held-out fresh questions
    assert cfg.grpo.temperature == 1.0 and cfg.grpo.validate_every > 0 and cfg.grpo.keep == "best"


def test_slips_recipe_replays_own_slips_in_recovery_episodes(tmp_path):
    """cpu_learn_slips: the recovery recipe with a slip bank and two SFT epochs; a missing bank stops the SFT
    stage with the command that writes it."""
    from bapsql.errors import DataError
    from bapsql.train.recipe.pipeline import _slip_bank

    cfg = load_train_config(ROOT / "configs" / "train" / "cpu_learn_slips.yaml")
    base = load_train_config(ROOT / "configs" / "train" / "cpu_learn_recover.yaml")
    assert cfg.sft.slips and cfg.sft.epochs == 2 and "workflow.recover_from_error" in cfg.sft.workflows
    assert (cfg.grpo, cfg.filter, cfg.rollout) == (base.grpo, base.filter, base.rollout)  # GRPO as before
    assert base.sft.slips is None and _slip_bank(base) is None
    missing = load_train_config(ROOT / "configs" / "train" / "cpu_learn_slips.yaml",
                                {"sft.slips": str(tmp_path / "none.jsonl")})
    with pytest.raises(DataError, match="jobs.harvest_slips"):
        _slip_bank(missing)


def test_split_recipe_is_the_slips_recipe_with_grpo_on_the_train_questions():
    """cpu_learn_split: only GRPO's prompt source differs, so the slips run's SFT model serves it unchanged."""
    import dataclasses

    cfg = load_train_config(ROOT / "configs" / "train" / "cpu_learn_split.yaml")
    base = load_train_config(ROOT / "configs" / "train" / "cpu_learn_slips.yaml")
    assert base.grpo.prompts == "augmented" and cfg.grpo.prompts == "split"
    assert cfg.grpo == dataclasses.replace(base.grpo, prompts="split")
    assert (cfg.sft, cfg.model, cfg.lora, cfg.data) == (base.sft, base.model, base.lora, base.data)


def test_smoke_recipe_is_cpu_sized():
    cfg = load_train_config(ROOT / "configs" / "smoke.yaml")
    assert cfg.model.base == "builtin:tiny" and cfg.rollout.engine["kind"] == "vllm" and cfg.eval.enabled
    assert cfg.grpo.updates <= 5 and not cfg.sft.use_gpu and cfg.sft.num_workers == 1


def test_typos_and_bad_values_fail_naming_the_key(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nmodel: {base: m}\ngrpo: {learning_rate: 1.0e-6}\n")
    with pytest.raises(ConfigError, match="learning_rate"):
        load_train_config(bad)
    bad.write_text("name: x\nmodel: {base: m}\nfilter: {min_success: 7, max_success: 6}\n")
    with pytest.raises(ConfigError, match="min_success"):
        load_train_config(bad)
    bad.write_text("name: x\nmodel: {base: m}\nrollout: {engine: {kind: vllm, model: /x}}\n")
    with pytest.raises(ConfigError, match="rollout.engine.model"):
        load_train_config(bad)
    bad.write_text("name: x\nmodel: {base: m}\nreward: {variant: shaped}\n")
    with pytest.raises(ConfigError, match="variant"):
        load_train_config(bad)
    bad.write_text("name: x\nmodel: {base: m}\nsft: {conditions: [raw, dashbord]}\n")
    with pytest.raises(ConfigError, match=r"sft\.conditions\[1\]: .*dashbord"):
        load_train_config(bad)


def test_extends_merges_and_overrides(tmp_path):
    (tmp_path / "parent.yaml").write_text("name: p\nmodel: {base: m, dtype: float32}\ngrpo: {lr: 1.0e-5, updates: 9}\n")
    (tmp_path / "child.yaml").write_text("extends: parent.yaml\nname: c\ngrpo: {updates: 3}\n")
    cfg = load_train_config(tmp_path / "child.yaml", {"grpo.top_p": 0.5})
    assert (cfg.name, cfg.model.dtype, cfg.grpo.lr, cfg.grpo.updates, cfg.grpo.top_p) == ("c", "float32", 1e-5, 3, 0.5)
    (tmp_path / "loop.yaml").write_text("extends: loop.yaml\nname: l\nmodel: {base: m}\n")
    with pytest.raises(ConfigError, match="cycle"):
        load_train_config(tmp_path / "loop.yaml")
    assert cfg.run_dir(2).name == "c-seed2"


def test_cluster_settings_reach_the_learner_chat_template_and_sync(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("name: x\nmodel: {base: m, chat_template_kwargs: {enable_thinking: false}, "
                    "logprob_chunk_tokens: 512}\ngrpo: {temperature: 0.7}\nlora: {target_modules: [q_proj]}\n"
                    "sync: {delta_tolerance: 0.3}\n")
    cfg = load_train_config(path)
    assert cfg.model.chat_template_kwargs == {"enable_thinking": False} and cfg.sync.delta_tolerance == 0.3
    grpo = cfg.learner_config("m", "grpo", seed=0, total_steps=1)
    assert (grpo.temperature, grpo.logprob_chunk_tokens, grpo.lora.target_modules) == (0.7, 512, ("q_proj",))
    assert cfg.learner_config("m", "sft", seed=0, total_steps=1).temperature == 1.0  # SFT imitates at T = 1
    path.write_text("name: x\nmodel: {base: m}\n")
    assert load_train_config(path).lora.target_modules is None  # discovered from the model
    path.write_text("name: x\nmodel: {base: m}\nsync: {delta_tolerance: 1.5}\n")
    with pytest.raises(ConfigError, match="delta_tolerance"):
        load_train_config(path)


def test_the_grpo_learner_scores_under_the_rollouts_temperature_and_nucleus(tmp_path):
    """The GRPO stage's learner takes grpo.top_p with grpo.temperature (the engines' processed logprobs are
    renormalised over that nucleus); SFT and greedy rollouts (raw logprobs) get the full softmax at T = 1."""
    path = tmp_path / "c.yaml"
    path.write_text("name: x\nmodel: {base: m}\ngrpo: {temperature: 0.7, top_p: 0.9}\n")
    cfg = load_train_config(path)
    grpo = cfg.learner_config("m", "grpo", seed=0, total_steps=1)
    assert (grpo.temperature, grpo.top_p, grpo.top_k) == (0.7, 0.9, 0)
    sft = cfg.learner_config("m", "sft", seed=0, total_steps=1)
    assert (sft.temperature, sft.top_p) == (1.0, 1.0)
    greedy = load_train_config(path, {"grpo.temperature": 0.0}).learner_config("m", "grpo", seed=0, total_steps=1)
    assert (greedy.temperature, greedy.top_p) == (1.0, 1.0)


def test_a_grpo_schedule_spans_every_optimizer_step_of_the_run():
    """``grpo.schedule`` decays over updates x epochs x mini_batches optimizer steps (the learner steps its
    scheduler once per optimizer step), so a cosine run reaches its last step near 0, not at a quarter of the run;
    the default stays constant and a bad name is refused with its key."""
    from bapsql.config import from_mapping
    from bapsql.train.config import TrainConfig
    from bapsql.train.learner.core import _lr_lambda

    raw = {"name": "x", "model": {"base": "m"}, "grpo": {"schedule": "cosine", "epochs": 2, "mini_batches": 2}}
    optim = from_mapping(TrainConfig, raw).learner_config("m", "grpo", seed=0, total_steps=5).optim
    assert (optim.schedule, optim.total_steps) == ("cosine", 20)
    factor = _lr_lambda(optim.schedule, optim.warmup_steps, optim.total_steps)
    assert factor(0) == 1.0 and factor(5) > 0.8 and factor(19) < 0.01
    assert from_mapping(TrainConfig, {"name": "x", "model": {"base": "m"}}).learner_config(
        "m", "grpo", seed=0, total_steps=5).optim.schedule == "constant"
    assert from_mapping(TrainConfig, raw).learner_config("m", "sft", seed=0, total_steps=5).optim.total_steps == 5
    with pytest.raises(ConfigError, match="grpo.schedule"):
        from_mapping(TrainConfig, {"name": "x", "model": {"base": "m"}, "grpo": {"schedule": "step"}})


def test_each_stage_may_set_its_own_gradient_checkpointing():
    """``sft.gradient_checkpointing`` / ``grpo.gradient_checkpointing`` override ``model.gradient_checkpointing``
    for that stage's learner (SFT's short sequences fit without it, GRPO's long trajectories may not); null keeps
    the model's; a non-boolean is refused with its key."""
    from bapsql.config import from_mapping
    from bapsql.train.config import TrainConfig

    def stages(**sections):
        cfg = from_mapping(TrainConfig, {"name": "x", **sections})
        return tuple(cfg.learner_config("m", s, seed=0, total_steps=1).gradient_checkpointing for s in ("sft", "grpo"))

    assert stages(model={"base": "m"}) == (False, False)
    assert stages(model={"base": "m", "gradient_checkpointing": True}) == (True, True)
    assert stages(model={"base": "m", "gradient_checkpointing": True}, sft={"gradient_checkpointing": False}) == (
        False, True)
    assert stages(model={"base": "m"}, grpo={"gradient_checkpointing": True}) == (False, True)
    with pytest.raises(ConfigError, match="sft.gradient_checkpointing"):
        from_mapping(TrainConfig, {"name": "x", "model": {"base": "m"}, "sft": {"gradient_checkpointing": "on"}})
