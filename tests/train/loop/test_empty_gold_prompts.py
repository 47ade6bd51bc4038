"""Issue 30, item 9: tasks whose gold query returns no rows stay out of GRPO's prompts unless the config asks."""

from __future__ import annotations

import json

import pytest

from bapsql.config import from_mapping
from bapsql.errors import ConfigError
from bapsql.train.config import TrainConfig
from tests.policies.minibench import build_minibench_with_empty_gold


def _cfg(root, **grpo):
    return from_mapping(TrainConfig, {"name": "g", "model": {"base": "builtin:tiny"},
                                      "data": {"benchmark": str(root), "split": "dev", "eval_split": "train"},
                                      "grpo": grpo})


def test_empty_gold_tasks_are_left_out_of_grpo_prompts_by_default(tmp_path):
    from bapsql.train.loop.grpo_data import grpo_tasks

    root = build_minibench_with_empty_gold(tmp_path / "mini")
    default = grpo_tasks(_cfg(root), 0, root)
    assert default and "library-empty" not in {t.task_id for t in default}
    from bapsql.train.loop.grpo_data import grpo_prompt_tasks

    prompts, empty = grpo_prompt_tasks(_cfg(root), 0, root)
    assert [t.task_id for t in prompts] == [t.task_id for t in default] and [t.task_id for t in empty] == [
        "library-empty"]
    included = grpo_tasks(_cfg(root, empty_gold="include"), 0, root)
    assert {t.task_id for t in included} == {t.task_id for t in default} | {"library-empty"}
    with pytest.raises(ConfigError, match="grpo.empty_gold"):
        _cfg(root, empty_gold="sometimes")
    with pytest.raises(ConfigError, match="empty_golds"):
        _cfg(root, empty_golds="include")


def test_the_grpo_stage_records_how_many_it_left_out(tmp_path):
    from bapsql.train.loop.grpo_data import grpo_prompt_tasks, write_prompt_record

    root = build_minibench_with_empty_gold(tmp_path / "mini")
    path = write_prompt_record(_cfg(root), *grpo_prompt_tasks(_cfg(root), 0, root), tmp_path / "grpo")
    record = json.loads(path.read_text())
    assert record["empty_gold"] == "exclude" and record["empty_gold_tasks"] == 1 and record["empty_gold_left_out"] == 1
    assert record["prompts"] == len(json.loads(path.read_text())["task_ids"])


@pytest.mark.slow  # ~15 s: one tiny GRPO update
def test_a_grpo_stage_writes_its_prompt_and_start_records(tiny_model_dir, tmp_path):
    from bapsql.train.config import DataSection, GRPOSection
    from bapsql.train.recipe.pipeline import run_grpo_stage
    from tests.train.tiny_stage import tiny_stage_config

    root = build_minibench_with_empty_gold(tmp_path / "mini")
    cfg = tiny_stage_config("empty", tiny_model_dir, tmp_path / "runs",
                            DataSection(benchmark=str(root), split="dev", eval_split="train"),
                            GRPOSection(lr=1e-2, updates=1, max_new_tokens=4, top_p=1.0, sft_init="none"))
    res = run_grpo_stage(cfg, 0)
    prompts = json.loads((res.run_dir / "prompts.json").read_text())
    assert prompts["empty_gold_left_out"] == 1 and "library-empty" not in prompts["task_ids"]
    start = json.loads((res.run_dir / "start.json").read_text())
    assert start["sft_init"] == "none" and start["sft_adapter_sha256"] is None
    assert start["config"]["grpo.empty_gold"] == "exclude" and start["config"]["reward.variant"] == "full"
