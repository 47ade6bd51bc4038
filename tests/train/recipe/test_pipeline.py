"""Pipeline config: the condition a recipe trains and evaluates under, and the engine config rollouts serve."""

import pytest

from bapsql.errors import ConfigError
from bapsql.train.config import ModelSection, RolloutSection, TrainConfig
from bapsql.train.loop.engine_setup import engine_config


def test_recipes_name_their_condition_and_unknown_ones_are_refused(tmp_path):
    from bapsql.env.records import EnvOptions
    from bapsql.train.config import EvalSection

    nop = TrainConfig(name="x", model=ModelSection(base=str(tmp_path)), condition="no_planning")
    full, planless = EnvOptions().under("full"), EnvOptions().under(nop.condition)
    assert set(full.allowed_actions) - set(planless.allowed_actions) == {"estimate_query", "rewrite_query"}
    assert planless.show_dashboard == full.show_dashboard and planless.condition.preflight == "words"
    with pytest.raises(ConfigError, match="condition: unknown condition 'no_such'"):
        TrainConfig(name="x", model=ModelSection(base=str(tmp_path)), condition="no_such")
    with pytest.raises(ConfigError, match=r"eval.conditions\[1\]"):
        TrainConfig(name="x", model=ModelSection(base=str(tmp_path)), eval=EvalSection(conditions=("full", "nope")))


def test_engine_config_fits_the_largest_budget_and_enables_lora(tmp_path):
    pytest.importorskip("bapsql.rollout.engines.base")
    cfg = TrainConfig(name="x", model=ModelSection(base=str(tmp_path)),
                      rollout=RolloutSection(engine={"kind": "hf", "dtype": "float32"}))
    ec = engine_config(cfg, tmp_path, lora=True)
    assert ec.model == str(tmp_path) and ec.enable_lora and ec.max_lora_rank == 32
    assert ec.max_model_len >= 11_000  # the L budget's live context
    small = TrainConfig(name="x", model=ModelSection(base=str(tmp_path)),
                        rollout=RolloutSection(engine={"kind": "hf", "max_model_len": 2048}))
    with pytest.raises(ConfigError, match="max_model_len"):
        engine_config(small, tmp_path, lora=False)


def test_a_model_window_below_the_largest_budget_caps_the_engine(tmp_path):
    """SmolLM2 has 8,192 positions, L allows 11,000 context tokens: the engine is sized to the window, not refused;
    a model folder without a window keeps the budget's length; a config set below the window is still refused."""
    import json

    from bapsql.experiment import MODEL_LEN_MARGIN, engine_len_need, model_window

    pytest.importorskip("bapsql.rollout.engines.base")
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 8192}))
    assert model_window(tmp_path) == 8192 and model_window(tmp_path / "absent") is None
    assert engine_len_need(11_000, tmp_path) == 8192 and engine_len_need(3_500, tmp_path) == 3_500 + MODEL_LEN_MARGIN
    assert engine_len_need(11_000, "a-served-model-name") == 11_000 + MODEL_LEN_MARGIN
    cfg = TrainConfig(name="x", model=ModelSection(base=str(tmp_path)),
                      rollout=RolloutSection(engine={"kind": "hf", "dtype": "float32"}))
    assert engine_config(cfg, tmp_path, lora=False).max_model_len == 8192
    small = TrainConfig(name="x", model=ModelSection(base=str(tmp_path)),
                        rollout=RolloutSection(engine={"kind": "hf", "max_model_len": 4096}))
    with pytest.raises(ConfigError, match="set at least 8192"):
        engine_config(small, tmp_path, lora=False)


def test_the_engine_carries_the_recipes_chat_template_kwargs_set_in_one_place(tmp_path):
    thinking_off = {"enable_thinking": False}
    cfg = TrainConfig(name="x", model=ModelSection(base=str(tmp_path), chat_template_kwargs=thinking_off),
                      rollout=RolloutSection(engine={"kind": "hf"}))
    assert engine_config(cfg, tmp_path, lora=False).chat_template_kwargs == thinking_off
    clash = TrainConfig(name="x", model=ModelSection(base=str(tmp_path), chat_template_kwargs=thinking_off),
                        rollout=RolloutSection(engine={"kind": "hf", "chat_template_kwargs": {}}))
    with pytest.raises(ConfigError, match="rollout.engine.chat_template_kwargs.*model.chat_template_kwargs"):
        engine_config(clash, tmp_path, lora=False)


def test_the_evaluation_engine_fits_the_evaluated_budgets_not_only_the_trained_ones(tmp_path):
    from bapsql.budgets import load_ladder
    from bapsql.train.config import BudgetSection

    cfg = TrainConfig(name="x", model=ModelSection(base=str(tmp_path)), budgets=BudgetSection(levels=("XS", "S")),
                      rollout=RolloutSection(engine={"kind": "hf", "dtype": "float32"}))
    ladder = load_ladder()
    train = engine_config(cfg, tmp_path, lora=True)
    assert ladder["S"].context_tokens <= train.max_model_len < ladder["L"].context_tokens
    evaluation = engine_config(cfg, tmp_path, lora=False, levels=("XS", "S", "M", "L"))
    assert evaluation.max_model_len >= ladder["L"].context_tokens


def test_a_recipe_names_its_calibration_file(tmp_path):
    from bapsql.db.calibration import DEFAULT_PATH

    cal = tmp_path / "cal.json"
    cal.write_text(DEFAULT_PATH.read_text())
    assert TrainConfig(name="x", model=ModelSection(base=str(tmp_path)), calibration=str(cal)).calibration == str(cal)
    with pytest.raises(ConfigError, match="calibration: .* is not a file"):
        TrainConfig(name="x", model=ModelSection(base=str(tmp_path)), calibration=str(tmp_path / "missing.json"))


def test_keep_history_until_drops_the_updates_a_resume_redoes(tmp_path):
    import json

    from bapsql.train.recipe.pipeline import keep_history_until

    path = tmp_path / "history.jsonl"
    path.write_text("".join(json.dumps({"update": float(u), "loss": u / 10}) + "\n" for u in range(1, 8)))
    assert keep_history_until(path, 5) == 5
    assert [json.loads(x)["update"] for x in path.read_text().splitlines()] == [1, 2, 3, 4, 5]
    assert keep_history_until(path, 0) == 0 and not path.exists()
    assert keep_history_until(path, 3) == 0


@pytest.mark.slow
def test_a_resumed_grpo_stage_logs_each_update_once(tiny_model_dir, tmp_path):
    """Crash after update 3 but before its checkpoint (the newest is update 2): the resumed stage redoes update 3,
    and history.jsonl holds updates 1, 2, 3 once each."""
    import json
    import shutil

    from bapsql.train.config import DataSection, GRPOSection
    from bapsql.train.recipe.pipeline import run_grpo_stage
    from tests.policies.minibench import build_minibench
    from tests.train.tiny_stage import tiny_stage_config

    bench = build_minibench(tmp_path / "bench")
    cfg = tiny_stage_config("resume", tiny_model_dir, tmp_path / "runs",
                            DataSection(benchmark=str(bench), split="train", limit=4),
                            GRPOSection(lr=1e-2, updates=3, max_new_tokens=4, top_p=1.0, sft_init="none"))
    first = run_grpo_stage(cfg, 0)
    assert [h["update"] for h in first.history] == [1, 2, 3]
    shutil.rmtree(first.run_dir / "checkpoints" / "update-000003")  # the crash lost update 3's checkpoint
    again = run_grpo_stage(cfg, 0, resume=True)
    assert again.resumed_from == 2
    lines = [json.loads(x) for x in (again.run_dir / "history.jsonl").read_text().splitlines()]
    assert [h["update"] for h in lines] == [1, 2, 3] and [h["update"] for h in again.history] == [1, 2, 3]


def test_augmented_grpo_prompts_are_fresh_questions_of_the_training_databases():
    """``grpo.prompts: augmented``: tasks on data.split's databases whose questions are neither SFT's (data.split)
    nor held out (data.eval_split), drawn apart from the pretraining corpus (seed + 1) and the same on a rerun;
    ``data.limit`` keeps the first N; "split" gives SFT's own tasks."""
    from bapsql.config import from_mapping
    from bapsql.data.augment import augment_tasks, normalise
    from bapsql.data.tasks import load_tasks, resolve_benchmark
    from bapsql.train.loop.grpo_data import grpo_tasks

    root = resolve_benchmark("demo")
    raw = {"name": "g", "model": {"base": "builtin:tiny"}, "data": {"split": "train", "eval_split": "test"}, "grpo": {"prompts": "augmented",
                                                                              "prompt_rounds": 1}}
    cfg = from_mapping(TrainConfig, raw)
    tasks = grpo_tasks(cfg, 0, root)
    train, test = load_tasks(root, "train"), load_tasks(root, "test")
    seen = {normalise(t.question) for t in [*train, *test]}
    assert tasks and not any(normalise(t.question) in seen for t in tasks)
    assert {t.db_id for t in tasks} <= {t.db_id for t in train} and all("augmented" in t.tags for t in tasks)
    assert [t.question for t in grpo_tasks(cfg, 0, root)] == [t.question for t in tasks]
    corpus = {normalise(t.question) for t in augment_tasks(root, "train", 1, seed=1, exclude=[*train, *test])}
    assert {normalise(t.question) for t in tasks} != corpus
    limited = from_mapping(TrainConfig, {**raw, "data": {**raw["data"], "limit": 5}})
    assert [t.task_id for t in grpo_tasks(limited, 0, root)] == [t.task_id for t in tasks[:5]]
    own = from_mapping(TrainConfig, {"name": "g", "model": {"base": "builtin:tiny"}, "data": {"split": "train", "eval_split": "test"}})
    assert [t.task_id for t in grpo_tasks(own, 0, root)] == [t.task_id for t in train]


@pytest.mark.parametrize("grpo, key", [({"prompts": "test"}, "grpo.prompts"),
                                       ({"prompt_rounds": 0}, "grpo.prompt_rounds")])
def test_a_bad_grpo_prompt_source_is_named(grpo, key):
    from bapsql.config import from_mapping

    with pytest.raises(ConfigError, match=key):
        from_mapping(TrainConfig, {"name": "g", "model": {"base": "builtin:tiny"}, "grpo": grpo})


def test_a_shared_sft_model_is_the_first_seeds_for_every_seed(tmp_path):
    """sft.shared: GRPO seeds start from one SFT model (the first seed's), so their pooled comparison measures GRPO."""
    from bapsql.train.config import SFTSection
    from bapsql.train.recipe.pipeline import sft_dir

    base = TrainConfig(name="r", seeds=(3, 5), out_dir=str(tmp_path), model=ModelSection(base="m"))
    assert sft_dir(base, 5) == tmp_path / "r-seed5" / "sft"
    shared = TrainConfig(name="r", seeds=(3, 5), out_dir=str(tmp_path), model=ModelSection(base="m"),
                         sft=SFTSection(shared=True))
    assert sft_dir(shared, 5) == sft_dir(shared, 3) == tmp_path / "r-seed3" / "sft"


def test_a_merging_engine_gets_no_lora_slots_and_refuses_pipelined_rollouts(tmp_path):
    from bapsql.train.config import GRPOSection

    merge = {"kind": "vllm", "adapter_mode": "merge"}
    cfg = TrainConfig(name="x", model=ModelSection(base=str(tmp_path)), rollout=RolloutSection(engine=merge))
    ec = engine_config(cfg, tmp_path, lora=True)
    assert ec.adapter_mode == "merge" and not ec.enable_lora
    piped = TrainConfig(name="x", model=ModelSection(base=str(tmp_path)), rollout=RolloutSection(engine=merge),
                        grpo=GRPOSection(max_staleness=1))
    with pytest.raises(ConfigError, match="adapter_mode: merge.*max_staleness"):
        engine_config(piped, tmp_path, lora=True)
