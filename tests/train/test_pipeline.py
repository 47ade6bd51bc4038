"""Pipeline config: the condition a recipe trains and evaluates under, and the engine config rollouts serve."""

import pytest

from bapsql.errors import ConfigError
from bapsql.train.config import ModelSection, RolloutSection, TrainConfig
from bapsql.train.pipeline import engine_config


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


def test_a_recipe_names_its_calibration_file(tmp_path):
    from bapsql.db.calibration import DEFAULT_PATH

    cal = tmp_path / "cal.json"
    cal.write_text(DEFAULT_PATH.read_text())
    assert TrainConfig(name="x", model=ModelSection(base=str(tmp_path)), calibration=str(cal)).calibration == str(cal)
    with pytest.raises(ConfigError, match="calibration: .* is not a file"):
        TrainConfig(name="x", model=ModelSection(base=str(tmp_path)), calibration=str(tmp_path / "missing.json"))
