"""The steps of scripts/gpu_check.py. Each takes the shared `State` and returns ``(detail line, measurements)``; a
failed assertion or exception fails the step. The learner and the engines resolve ``dtype: auto`` (bf16 on a GPU,
float32 on the CPU), as a recipe that names no dtype does.

- `learner_step`: a LoRA learner (gradient checkpointing) makes two GRPO updates on sequences as long as the
  budget's context plus a completion (L: 11,000 + 1,024 tokens); tokens/s of the second, peak memory;
- `agreement_step`: the HF engine (and vLLM when importable) against the learner: the weight-sync probe at the
  first sync (the bounds `WeightSync` measures from it) and the logprobs of completions the engine sampled;
- `stale_step`: a real update at lr 1e-6, a fresh sync, another update, then an engine that keeps the old adapter
  (and one that loads the old files): the identity check must catch both, whatever the numeric noise;
- `sft_step`: one LoRA SFT step on turn pairs the workflows export with this model's tokenizer and template;
- `grpo_step`: one GRPO update through the recipe's wiring (`build_grpo`: in-process rollouts on the HF engine, the
  environment, the adapter sync), then the merged policy;
- `eval_step`: a 16-episode evaluation sweep of that policy (`run_sweep`, in-process backend).
"""

from __future__ import annotations

import gc
import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Settings:
    """Sizes of the check: the GPU's (`GPU`) and the CPU rehearsal's (`CPU`)."""

    device: str
    level: str  # the budget whose context length the learner step measures
    sequences: int
    completion_tokens: int
    micro_batch_tokens: int
    lora_rank: int
    threads: int
    sampled_prompts: int
    sampled_tokens: int
    grpo_groups: int
    grpo_group_size: int
    grpo_tokens: int
    eval_episodes: int
    eval_tokens: int
    engine_len: int = 4096
    vllm_memory: float = 0.3


GPU = Settings("cuda", "L", 8, 1024, 32_768, 32, 4, 16, 32, 2, 4, 48, 16, 64)
CPU = Settings("cpu", "XS", 2, 64, 8192, 8, 2, 8, 16, 2, 2, 24, 16, 24)


@dataclass
class State:
    """What the steps share: the settings, the output folder, the model, and the parts built along the way."""

    settings: Settings
    out: Path
    model: Path
    vllm: bool  # measure vLLM too (importable and not blocked)
    parts: dict[str, Any] = field(default_factory=dict)

    def free(self, *names: str) -> None:
        for name in names:
            part = self.parts.pop(name, None)
            if part is not None and hasattr(part, "close"):
                part.close()
        gc.collect()
        if self.settings.device == "cuda":
            import torch

            torch.cuda.empty_cache()


def _learner(st: State, lr: float = 1e-6) -> Any:
    from bapsql.train.learner.config import LearnerConfig, LoraSpec, OptimConfig
    from bapsql.train.learner.core import Learner

    s = st.settings
    return Learner(LearnerConfig(model_path=str(st.model), lora=LoraSpec(rank=s.lora_rank, alpha=2 * s.lora_rank),
                                 optim=OptimConfig(lr=lr, total_steps=100), micro_batch_tokens=s.micro_batch_tokens,
                                 device=s.device, threads=s.threads, gradient_checkpointing=True, seed=0))


def _engine_config(st: State, kind: str, **kw: Any) -> Any:
    from bapsql.rollout.engines.base import EngineConfig

    s = st.settings
    extra = dict(enable_lora=True, max_lora_rank=s.lora_rank, gpu_memory_utilization=s.vllm_memory,
                 enforce_eager=True, kv_cache_space_gb=1) if kind == "vllm" else {}
    base = dict(kind=kind, model=str(st.model), device=s.device, max_model_len=s.engine_len, max_num_seqs=32,
                num_threads=s.threads)
    return EngineConfig(**{**base, **extra, **kw})


def _vocab(st: State) -> int:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(st.model / "tokenizer.json")).get_vocab_size(with_added_tokens=True)


def _grpo_samples(learner: Any, plain: list[Any]) -> list[Any]:
    """On-policy GRPO samples: the learner's own logprobs as the behaviour policy's, advantages ±1."""
    from bapsql.train.learner.core import Sample

    old = learner.token_logprobs(plain)
    return [Sample(s.input_ids, s.loss_mask, tuple(float(x) for x in lp), 1.0 if i % 2 else -1.0)
            for i, (s, lp) in enumerate(zip(plain, old))]


def learner_step(st: State) -> tuple[str, dict]:
    """Two GRPO updates at the budget's lengths; the second is timed (the first warms kernels and allocator)."""
    import torch

    from bapsql.budgets import load_ladder
    from bapsql.train.algo.grpo import LossConfig
    from bapsql.train.learner.core import Sample

    s = st.settings
    learner = _learner(st)
    st.parts["learner"] = learner
    config = learner.model.get_base_model().config
    prompt = min(load_ladder()[s.level].context_tokens, config.max_position_embeddings - s.completion_tokens)
    length = prompt + s.completion_tokens
    rng = random.Random(0)
    vocab = min(_vocab(st), config.vocab_size)
    plain = [Sample(tuple(rng.randrange(vocab) for _ in range(length)), (0,) * prompt + (1,) * s.completion_tokens)
             for _ in range(s.sequences)]
    samples = _grpo_samples(learner, plain)
    learner.grpo_update(samples, LossConfig())
    if s.device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    m = learner.grpo_update(samples, LossConfig())
    assert math.isfinite(m.loss) and math.isfinite(m.grad_norm) and m.grad_norm > 0, m
    dtype = {str(p.dtype).removeprefix("torch.") for p in learner.model.parameters() if not p.requires_grad}
    peak = torch.cuda.max_memory_allocated() / 2 ** 30 if s.device == "cuda" else None
    data = {"level": s.level, "sequences": s.sequences, "sequence_tokens": length, "tokens": m.tokens,
            "seconds": m.seconds, "tokens_per_s": m.tokens_per_s, "peak_gib": peak, "micro_batches": m.micro_batches,
            "micro_batch_tokens": s.micro_batch_tokens, "dtype": sorted(dtype), "lora_rank": s.lora_rank,
            "gradient_checkpointing": True}
    return (f"{s.sequences} x {length:,} tokens ({s.level} context + {s.completion_tokens} completion), "
            f"{'/'.join(sorted(dtype))}: {m.tokens_per_s:,.0f} tok/s" + (f", peak {peak:.1f} GiB" if s.device ==
                                                                         "cuda" else "")), data


def _chat_prompts(st: State, n: int) -> list[list[int]]:
    from bapsql.models.chat_template import ChatTemplate

    template = ChatTemplate.from_dir(st.model)
    return [template.apply([{"role": "system", "content": "You answer questions about a SQLite database."},
                            {"role": "user", "content": f"How many orders did customer {i} place in {2000 + i}?"}],
                           add_generation_prompt=True) for i in range(n)]


def _agreement(st: State, engine: Any, learner: Any, name: str) -> dict:
    """The first weight sync's probe gap (and the bounds it sets), and the gap on sampled completions."""
    from bapsql.models.chat_template import ChatTemplate
    from bapsql.rollout.engines.base import SamplingParams
    from bapsql.train.learner.core import Sample
    from bapsql.train.learner.weight_sync import WeightSync, make_probe

    s = st.settings
    sync = WeightSync(engine, learner, make_probe(ChatTemplate.from_dir(st.model)), st.out / f"adapters_{name}")
    first = sync.sync(0)
    prompts = _chat_prompts(st, s.sampled_prompts)
    params = [SamplingParams(max_tokens=s.sampled_tokens, temperature=1.0, top_p=1.0, seed=i)
              for i in range(len(prompts))]
    gens = engine.generate(prompts, params, adapter=sync.adapter)
    gaps = []
    for p, g in zip(prompts, gens):
        lp = learner.token_logprobs([Sample(tuple(p) + g.completion_ids, (0,) * len(p) + (1,) * len(g.completion_ids))])
        gaps.extend(abs(a - b) for a, b in zip(g.logprobs, lp[0][len(p):]))
    gaps_a = np.asarray(gaps)
    return {"probe_mean": first.mean_abs, "probe_max": first.max_abs, "tolerance": first.tolerance,
            "max_tolerance": first.max_tolerance, "sampled_tokens": int(gaps_a.size),
            "sampled_mean": float(gaps_a.mean()), "sampled_p99": float(np.quantile(gaps_a, 0.99)),
            "sampled_max": float(gaps_a.max())}


def agreement_step(st: State) -> tuple[str, dict]:
    from bapsql.rollout.engines.hf import HFEngine

    learner = st.parts["learner"]
    engine = HFEngine(_engine_config(st, "hf"))
    st.parts["engine"] = engine
    data = {"hf": _agreement(st, engine, learner, "hf")}
    if st.vllm:
        from bapsql.rollout.engines.vllm import VLLMEngine

        vllm = VLLMEngine(_engine_config(st, "vllm"))
        try:
            data["vllm"] = _agreement(st, vllm, learner, "vllm")
        finally:
            vllm.close()
    line = "; ".join(f"{k}: probe mean {v['probe_mean']:.3g} max {v['probe_max']:.3g}, sampled mean "
                     f"{v['sampled_mean']:.3g} p99 {v['sampled_p99']:.3g} -> sync bounds {v['tolerance']:.3g} / "
                     f"{v['max_tolerance']:.3g}" for k, v in data.items())
    return line + ("" if st.vllm else "; vllm: not installed (skipped)"), data


class StaleEngine:
    """The HF engine as a stale one would look: ``mode`` "skip" ignores loads (keeps serving the version it has),
    "old_files" loads the previous folder under the new version number."""

    def __init__(self, engine: Any):
        self.engine = engine
        self.mode = "ok"
        self.current: Any = None
        self.previous: str | None = None

    def load_adapter(self, path: str, name: str, version: int) -> Any:
        from bapsql.rollout.engines.base import AdapterRef

        if self.mode == "skip" and self.current is not None:
            return AdapterRef(name, version, str(path), self.current.lora_id)
        self.current = self.engine.load_adapter(self.previous if self.mode == "old_files" else path, name, version)
        self.previous = str(path)
        return self.current

    def served_adapter(self, adapter: Any) -> Any:
        return self.engine.served_adapter(adapter)

    def logprobs_of(self, prompt_ids: Any, completion_ids: Any, *, adapter: Any = None) -> list[float]:
        return self.engine.logprobs_of(prompt_ids, completion_ids, adapter=self.engine.served_adapter(adapter))


def stale_step(st: State) -> tuple[str, dict]:
    from bapsql.errors import WeightSyncError
    from bapsql.models.chat_template import ChatTemplate
    from bapsql.train.algo.grpo import LossConfig
    from bapsql.train.learner.core import Sample
    from bapsql.train.learner.weight_sync import WeightSync, make_probe

    learner, engine = st.parts["learner"], StaleEngine(st.parts["engine"])
    probe = make_probe(ChatTemplate.from_dir(st.model))
    sync = WeightSync(engine, learner, probe, st.out / "adapters_stale")
    sync.sync(0)
    ids = probe.prompt_ids + probe.completion_ids
    plain = [Sample(ids, (0,) * len(probe.prompt_ids) + (1,) * len(probe.completion_ids))] * 2
    learner.grpo_update(_grpo_samples(learner, plain), LossConfig())
    fresh = sync.sync(1)
    learner.grpo_update(_grpo_samples(learner, plain), LossConfig())
    caught = {}
    for mode in ("skip", "old_files"):
        engine.mode = mode
        try:
            sync.sync(2)
            caught[mode] = ""
        except WeightSyncError as exc:
            caught[mode] = str(exc)
    engine.mode = "skip"
    numeric_alone = True
    try:
        sync.check(engine.current, 2)  # the probe alone, on the engine that kept v1
        numeric_alone = False
    except WeightSyncError:
        pass
    engine.mode = "ok"
    recovered = sync.sync(2)
    assert all(caught.values()), f"a stale adapter was accepted: {caught}"
    data = {"lr": 1e-6, "learner_delta": fresh.learner_delta, "noise_mean": fresh.mean_abs,
            "tolerance": fresh.tolerance, "caught": caught, "numeric_check_alone_catches": numeric_alone,
            "recovered_version": recovered.version}
    return (f"lr 1e-6: learner moved {fresh.learner_delta:.2g}/token, engine-learner noise {fresh.mean_abs:.2g}; "
            f"skipped load and old files caught by identity (probe alone: "
            f"{'caught' if numeric_alone else 'missed'})"), data


def sft_step(st: State) -> tuple[str, dict]:
    from bapsql.data.tasks import resolve_benchmark
    from bapsql.policies.sft_export import export_sft
    from bapsql.train.recipe.sft import load_pairs

    learner = st.parts["learner"]
    data_path = st.out / "sft_pairs.parquet"
    export_sft(resolve_benchmark("demo"), "train", 8, data_path, workflows=("workflow.direct_aggregation",),
               budgets=("XS",), tokenizer_dir=st.model, max_length=4096)
    samples, dropped = load_pairs(data_path, 4096)
    m = learner.sft_update(samples)
    assert math.isfinite(m.loss) and m.grad_norm > 0 and m.loss_tokens > 0, m
    return (f"{m.sequences} workflow turn pairs, {m.tokens:,} tokens: loss {m.loss:.3f}, grad norm "
            f"{m.grad_norm:.3g}, {m.tokens_per_s:,.0f} tok/s"), {"pairs": m.sequences, "tokens": m.tokens,
                                                             "loss": m.loss, "grad_norm": m.grad_norm,
                                                             "tokens_per_s": m.tokens_per_s, "dropped": dropped}


def _token_reward(group: Any) -> Any:
    """A reward that depends on what was sampled (the share of even token ids): a random-weight model never solves a
    task, and a zero reward would make the update a no-op."""
    out = []
    for t in group:
        toks = [i for seg in t.segments for i, m in zip(seg.input_ids, seg.loss_mask) if m]
        out.append(sum(1 for i in toks if i % 2 == 0) / max(1, len(toks)))
    return np.array(out)


def grpo_step(st: State) -> tuple[str, dict]:
    from bapsql.data.tasks import load_tasks, resolve_benchmark
    from bapsql.train.algo.filter import FilterConfig
    from bapsql.train.config import (BudgetSection, CheckpointSection, DataSection, GRPOSection, ModelSection,
                                     MonitorSection, RolloutSection, TrainConfig)
    from bapsql.train.learner.config import LoraSpec
    from bapsql.train.loop.grpo_setup import build_grpo

    s = st.settings
    cfg = TrainConfig(
        name="gpu-check", model=ModelSection(base=str(st.model), device=s.device, threads=s.threads,
                                             gradient_checkpointing=True),
        lora=LoraSpec(rank=s.lora_rank, alpha=2 * s.lora_rank), out_dir=str(st.out / "grpo"),
        data=DataSection(benchmark="demo", split="train"),
        grpo=GRPOSection(lr=1e-6, updates=1, max_new_tokens=s.grpo_tokens, top_p=1.0, sft_init="none",
                         micro_batch_tokens=s.micro_batch_tokens),
        filter=FilterConfig(group_size=s.grpo_group_size, min_success=0, max_success=s.grpo_group_size,
                            groups_per_update=s.grpo_groups, max_rounds=1, enabled=False),
        budgets=BudgetSection(levels=("XS",)),
        rollout=RolloutSection(engine={"kind": "hf", "device": s.device, "num_threads": s.threads,
                                       "max_num_seqs": 32}, use_ray=False, env_workers=1),
        checkpoint=CheckpointSection(every=1), monitor=MonitorSection(kind="none"))
    tasks = load_tasks(resolve_benchmark("demo"), "train", limit=16)
    setup = build_grpo(cfg, 0, base=st.model, tasks=tasks, run_dir=st.out / "grpo", run_name="gpu-check",
                       total_updates=1)
    setup.trainer.reward_fn = _token_reward
    try:
        first = setup.trainer.start()
        (record,) = setup.trainer.run(1)
        merged = setup.learner.merge_and_save(st.out / "grpo" / "merged")
    finally:
        setup.close()
    st.parts["policy"] = merged
    m = record.metrics
    assert m.get("learner/skipped") == 0.0 and m.get("learner/grad_norm", 0.0) > 0, m
    data = {"first_sync": {"mean": first.mean_abs, "max": first.max_abs, "tolerance": first.tolerance},
            "update_sync": {k: m[k] for k in m if k.startswith("sync/")}, "reward_mean": m.get("reward/mean"),
            "loss": m.get("learner/loss"), "grad_norm": m.get("learner/grad_norm"),
            "rollout_s": m.get("time/rollout_s"), "learner_s": m.get("time/learner_s"), "merged": str(merged)}
    return (f"{s.grpo_groups} groups x {s.grpo_group_size}: loss {m['learner/loss']:.3g}, grad norm "
            f"{m['learner/grad_norm']:.3g}; adapter sync v1 identity ok, mean |d| {m['sync/logprob_mismatch_mean']:.3g}"
            f" (bound {m['sync/tolerance']:.3g} from update 0); rollout {m['time/rollout_s']:.1f} s, learner "
            f"{m['time/learner_s']:.1f} s"), data


def eval_step(st: State) -> tuple[str, dict]:
    from bapsql.experiment import ExperimentConfig, SamplingConfig, WorkersConfig, validate
    from bapsql.logs.reader import read_episodes
    from bapsql.rollout.sweep import run_sweep

    s = st.settings
    model = Path(st.parts.get("policy", st.model))
    engine = _engine_config(st, "hf", model=str(model))
    cfg = validate(ExperimentConfig(
        run="gpu-check-eval", methods=("model:check@full",), benchmark="demo", split="dev", limit=s.eval_episodes,
        budgets=("XS",), seeds=(0,), engines={"check": engine},
        sampling=SamplingConfig(max_tokens=s.eval_tokens, temperature=1.0, top_p=1.0),
        workers=WorkersConfig(env_workers=2, in_flight=s.eval_episodes)))
    summary = run_sweep(cfg, out_dir=st.out / "eval", backend="local")
    eps = read_episodes(st.out / "eval")
    assert len(eps) == s.eval_episodes == eps["episode_id"].nunique(), f"{len(eps)} episodes written"
    r = summary.result
    data = {"episodes": int(len(eps)), "wall_s": r.wall_s, "episodes_per_s": r.episodes_per_s,
            "generated_tokens": r.generated_tokens, "success": float(eps["success"].mean()),
            "policy": str(model)}
    return (f"{len(eps)} episodes of {model.name} at XS in {r.wall_s:.1f} s, {r.generated_tokens:,} tokens "
            f"generated, success {eps['success'].mean():.2f} (random weights)"), data


STEPS = {"learner": learner_step, "agreement": agreement_step, "stale": stale_step, "sft": sft_step,
         "grpo": grpo_step, "eval": eval_step}
NEEDS = {"agreement": "learner", "stale": "agreement", "sft": "learner"}  # a step needs the parts of another
