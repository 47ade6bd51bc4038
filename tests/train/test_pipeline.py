"""Pipeline helpers: the interface an intervention gives the policy, and the engine config rollouts serve."""

import pytest

from bapsql.errors import ConfigError
from bapsql.train.config import ModelSection, RolloutSection, TrainConfig
from bapsql.train.pipeline import engine_config, env_options_for


def test_no_planning_removes_estimates_and_rewrite_only():
    full = env_options_for(())
    nop = env_options_for(("no_planning",))
    assert set(full.allowed_actions) - set(nop.allowed_actions) == {"estimate_query", "rewrite_query"}
    assert nop.show_dashboard == full.show_dashboard
    with pytest.raises(ConfigError, match="unknown intervention"):
        env_options_for(("no_such_thing",))


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
