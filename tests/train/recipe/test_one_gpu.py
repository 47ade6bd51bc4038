"""The one-GPU recipe (configs/train/one_gpu.yaml) and its evaluation sweep (configs/experiments/one_gpu.yaml):
the engine and the learner share one GPU by Ray GPU shares and vLLM memory fractions in a private local Ray, and
the same file runs end to end (SFT → GRPO → evaluation) at toy size on the CPU with SmolLM2-135M (slow tier)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bapsql.experiment import load_experiment
from bapsql.train.config import load_train_config

ROOT = Path(__file__).resolve().parents[3]
RECIPE = ROOT / "configs" / "train" / "one_gpu.yaml"
SWEEP = ROOT / "configs" / "experiments" / "one_gpu.yaml"
SMOLLM2 = Path.home() / ".cache" / "bapsql" / "models" / "smollm2-135m-instruct"

# What the CPU variant changes: where things run (no GPU: no GPU shares, CPU engine and learner) and how big they
# are (a few pairs, one update of two groups of two, two evaluation tasks at XS). Every other key — the Ray
# session, the remote learner, the vLLM engine with LoRA slots, the measured sync bounds, the stages — is the file's.
CPU_TOY = {
    "model.device": "cpu", "model.threads": 2, "model.learner_gpus": 0.0, "model.learner_cpus": 1,
    "lora.rank": 8, "lora.alpha": 16,
    "data.limit": 4,
    "sft.export_pairs": 4, "sft.effective_batch": 4, "sft.micro_batch_tokens": 4096, "sft.max_length": 2048,
    "sft.warmup_steps": 0, "sft.use_gpu": False, "sft.workflows": ["workflow.direct_aggregation"],
    "sft.budgets": ["XS"],
    "grpo.updates": 1, "grpo.max_new_tokens": 32, "grpo.micro_batch_tokens": 4096,
    "filter.group_size": 2, "filter.min_success": 0, "filter.max_success": 2, "filter.groups_per_update": 2,
    "filter.max_rounds": 1, "filter.enabled": False,
    "budgets.levels": ["XS"],
    "rollout.engine.device": "cpu", "rollout.engine.enforce_eager": True, "rollout.engine.kv_cache_space_gb": 1,
    "rollout.engine.max_num_seqs": 8, "rollout.engine.num_threads": 1,
    "rollout.engine_gpus": 0.0, "rollout.env_workers": 1, "rollout.engine_threads": 1, "rollout.in_flight": 8,
    "rollout.num_cpus": 4,
    "checkpoint.every": 1, "monitor.kind": "none",
    "eval.budgets": ["XS"], "eval.limit": 2, "eval.max_new_tokens": 32, "eval.replicates": 200,
}


def test_the_engine_and_the_learner_share_one_gpu_in_a_private_local_ray():
    cfg = load_train_config(RECIPE)
    r, m = cfg.rollout, cfg.model
    assert r.use_ray and r.ray_address is None and r.engine_replicas == 1
    assert m.remote_learner and 0 < m.learner_gpus < 1 and 0 < r.engine_gpus < 1
    assert m.learner_gpus + r.engine_gpus <= 1  # GRPO: engine + learner on the one GPU
    assert 2 * r.engine_gpus <= 1  # evaluation: the SFT and the GRPO engine side by side
    assert 2 * r.engine["gpu_memory_utilization"] <= 0.9  # ... and their vLLM memory shares
    assert cfg.sft.num_workers == 1 and cfg.sft.use_gpu
    assert m.dtype == "auto" and "dtype" not in r.engine  # bf16 on the GPU by default (bapsql.models.dtype)
    assert cfg.lora.target_modules is None and cfg.sync.tolerance is None
    assert cfg.eval.enabled and cfg.sft.enabled and cfg.grpo.enabled


def test_the_eval_sweep_serves_the_recipes_policies_on_the_same_gpu():
    cfg = load_train_config(RECIPE)
    sweep = load_experiment(SWEEP)
    shares = sweep.workers.engine_gpus * len(sweep.engines)
    assert 0 < shares <= 1 and sum(e.gpu_memory_utilization for e in sweep.engines.values()) <= 0.9
    assert sweep.ray.address is None
    assert sweep.engines["base"].model == cfg.model.base
    assert sweep.engines["sft"].model == str(cfg.run_dir(0) / "sft" / "merged")
    assert sweep.engines["grpo"].model == str(cfg.run_dir(0) / "grpo" / "merged")
    assert sweep.sampling.template_kwargs == cfg.model.chat_template_kwargs
    assert all(e.dtype == "auto" and e.kind == "vllm" for e in sweep.engines.values())


@pytest.mark.slow
@pytest.mark.skipif(not (SMOLLM2 / "config.json").is_file(),
                    reason="SmolLM2-135M is not fetched (bapsql model fetch smollm2-135m-instruct)")
@pytest.mark.skipif(__import__("importlib").util.find_spec("vllm") is None, reason="vllm not installed")
def test_the_recipe_runs_sft_grpo_and_evaluation_at_toy_size_on_the_cpu(tmp_path, monkeypatch):
    """one_gpu.yaml with `CPU_TOY`: SFT (Ray Train, one worker), one GRPO update (remote learner actor, vLLM engine
    actor with LoRA slots, weight sync with the identity check and bounds measured at update 0), then the evaluation
    sweep of the SFT and the GRPO policy and its report."""
    import json

    from bapsql.train.recipe.pipeline import run_recipe

    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    monkeypatch.setenv("WANDB_MODE", "offline")
    cfg = load_train_config(RECIPE, {**CPU_TOY, "model.base": str(SMOLLM2), "out_dir": str(tmp_path / "runs")})
    result = run_recipe(cfg, 0)
    assert result.sft is not None and (cfg.run_dir(0) / "sft" / "merged" / "config.json").is_file()
    assert result.grpo is not None and result.grpo.updates == 1 and len(result.grpo.history) == 1
    update = result.grpo.history[0]
    assert update["update"] == 1 and 0 < update["sync/tolerance"] <= cfg.sync.tolerance_ceiling
    assert update["sync/logprob_mismatch_mean"] <= update["sync/tolerance"]
    assert (result.grpo.merged_dir / "config.json").is_file()
    summary = json.loads((result.report_dir / "summary.json").read_text())
    assert set(summary["methods"]) == {"model.sft@full", "model.grpo@full"}
    assert set(result.success) == {"model.sft@full", "model.grpo@full"}
