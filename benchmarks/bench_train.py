"""Training throughput on the tiny model: learner tokens/s (SFT and GRPO), weight-sync time, and the rollout /
filter / learner / sync split of one GRPO update.

    python benchmarks/bench_train.py [--engine hf|vllm] [--pairs 64] [--updates 1] [--workdir DIR]

1. SFT: ``--pairs`` real workflow pairs of the embedded benchmark (``export_sft``), one epoch of LoRA SFT steps
   (effective batch 16) on ``builtin:tiny`` — tokens/s over all tokens processed, and over loss tokens.
2. GRPO: the same sequences as GRPO samples (engine logprobs = the learner's, advantages ±1) — tokens/s.
3. Weight sync: save adapter → engine ``load_adapter`` → probe check, 5 times, with ``--engine``.
4. One update of the real loop, in-process (LocalBackend): 4 groups × 8 trajectories of the tiny policy on the
   embedded benchmark's train split with ``--engine``; the metrics' time split.
Prints a Markdown table row per figure. Numbers depend on CPU contention (this machine's 2 cores are shared).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", choices=("hf", "vllm"), default="hf")
    ap.add_argument("--pairs", type=int, default=64)
    ap.add_argument("--updates", type=int, default=1)
    ap.add_argument("--workdir", default=None)
    args = ap.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench_train_"))
    work.mkdir(parents=True, exist_ok=True)

    import torch

    from bapsql.models.resolve import resolve_model
    from bapsql.policies.sft_export import export_sft
    from bapsql.train.algo.filter import FilterConfig
    from bapsql.train.algo.grpo import LossConfig
    from bapsql.train.config import (BudgetSection, CheckpointSection, DataSection, GRPOSection, LearnerConfig,
                                     ModelSection, MonitorSection, OptimConfig, RolloutSection, TrainConfig)
    from bapsql.train.learner.core import Learner, Sample
    from bapsql.train.recipe.sft import load_pairs, sft_epochs

    torch.set_num_threads(1)
    model = Path(resolve_model("builtin:tiny"))
    pairs = work / "pairs.parquet"
    if not pairs.is_file():
        export_sft("demo", "train", args.pairs, pairs, seed=0, tokenizer_dir=model)
    samples, _ = load_pairs(pairs, 8192)
    rows = []

    learner = Learner(LearnerConfig(model_path=str(model), optim=OptimConfig(lr=1e-3), dtype="float32",
                                    device="cpu", threads=1))
    sft_epochs(learner, samples[:16], effective_batch=16)  # warm-up
    t = time.perf_counter()
    ms = sft_epochs(learner, samples, effective_batch=16)
    dt = time.perf_counter() - t
    tok, loss_tok = sum(m.tokens for m in ms), sum(m.loss_tokens for m in ms)
    rows.append(("SFT learner", f"{tok / dt:,.0f} tok/s ({loss_tok / dt:,.0f} loss tok/s)",
                 f"{len(samples)} pairs, mean {tok / len(samples):.0f} tokens, {len(ms)} steps of 16, {dt:.1f} s"))

    lps = learner.token_logprobs(samples, masked_only=True)
    grpo = [Sample(s.input_ids, s.loss_mask, tuple(lp), 1.0 if i % 2 else -1.0) for i, (s, lp) in
            enumerate(zip(samples, lps))]
    t = time.perf_counter()
    n = 0
    for lo in range(0, len(grpo), 16):
        m = learner.grpo_update(grpo[lo:lo + 16], LossConfig())
        n += m.tokens
    dt = time.perf_counter() - t
    rows.append(("GRPO learner", f"{n / dt:,.0f} tok/s", f"same sequences as GRPO samples, {dt:.1f} s"))

    from bapsql.models.chat_template import ChatTemplate
    from bapsql.rollout.engines.base import EngineConfig
    from bapsql.rollout.engines.factory import make_engine
    from bapsql.train.learner.weight_sync import WeightSync, make_probe

    extra = {"kv_cache_space_gb": 1} if args.engine == "vllm" else {}
    engine = make_engine(EngineConfig(kind=args.engine, model=str(model), dtype="float32", device="cpu",
                                      num_threads=1, enable_lora=True, max_lora_rank=32, max_model_len=4096, **extra))
    sync = WeightSync(engine, learner, make_probe(ChatTemplate.from_dir(model)), work / "adapters", tolerance=0.02)
    times = []
    for v in range(5):
        rep = sync.sync(v)
        times.append((rep.save_s, rep.load_s, rep.check_s, rep.mean_abs))
        learner.sft_update(samples[:4])
    med = [statistics.median(x[i] for x in times) for i in range(3)]
    rows.append((f"weight sync ({args.engine})", f"{sum(med) * 1000:,.0f} ms",
                 f"save {med[0] * 1000:.0f} + load {med[1] * 1000:.0f} + check {med[2] * 1000:.0f} ms (median of 5); "
                 f"probe mismatch {max(x[3] for x in times):.1e}"))
    engine.close()
    del engine

    from bapsql.data.load import load_benchmark
    from bapsql.data.tasks import resolve_benchmark
    from bapsql.env.records import EnvOptions
    from bapsql.rollout.agent import AgentConfig
    from bapsql.rollout.backend import LocalBackend
    from bapsql.train.loop.engine_setup import engine_config
    from bapsql.train.loop.rollouts import TrainingRollouts
    from bapsql.train.loop.trainer import GRPOTrainer

    cfg = TrainConfig(
        name="bench", model=ModelSection(base=str(model), dtype="float32", device="cpu", threads=1),
        out_dir=str(work), data=DataSection(benchmark="demo"),
        grpo=GRPOSection(lr=5e-4, updates=args.updates, max_new_tokens=64, top_p=0.95, sft_init="none"),
        filter=FilterConfig(group_size=8, groups_per_update=4, max_rounds=1, enabled=False),
        budgets=BudgetSection(), checkpoint=CheckpointSection(every=1000), monitor=MonitorSection(kind="none"),
        rollout=RolloutSection(engine={"kind": args.engine, "dtype": "float32", "num_threads": 1, **extra},
                               use_ray=False, env_workers=1))
    tasks = sorted(load_benchmark(resolve_benchmark("demo"), split="train").tasks, key=lambda t: t.task_id)
    learner = Learner(cfg.learner_config(model, "grpo", seed=0, total_steps=args.updates))
    rollouts = TrainingRollouts(LocalBackend(), run_name="bench", method="model.policy",
                                agent=AgentConfig(model_dir=str(model), max_tokens=64, top_p=0.95),
                                engine=engine_config(cfg, model, lora=True), tasks=tasks, group_size=8,
                                env_options=EnvOptions())
    trainer = GRPOTrainer(cfg, seed=0, learner=learner, rollouts=rollouts, tasks=tasks,
                          probe=make_probe(ChatTemplate.from_dir(model)), run_dir=work / "grpo")
    trainer.start()
    for _ in range(args.updates):
        m = trainer.step().metrics
        split = " / ".join(f"{m[f'time/{k}_s']:.1f} s ({100 * m[f'time/{k}_share']:.0f}%)"
                           for k in ("rollout", "filter", "learner", "sync"))
        rows.append((f"one update ({args.engine})", f"{m['time/update_s']:.1f} s",
                     f"rollout / filter / learner / sync = {split}; 32 trajectories, "
                     f"{m['rollout/generated_tokens']:.0f} generated tokens "
                     f"({m['throughput/rollout_tokens_per_s']:.0f} tok/s), learner "
                     f"{m.get('throughput/learner_tokens_per_s', 0):,.0f} tok/s"))
    rollouts.close()

    print("| figure | value | details |")
    print("|---|---|---|")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]} |")


if __name__ == "__main__":
    main()
