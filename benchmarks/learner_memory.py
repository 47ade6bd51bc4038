"""Peak memory and time of one GRPO learner update on one long trajectory, with and without gradient checkpointing.

    python benchmarks/learner_memory.py --model DIR [--lengths 3000,6000] [--checkpointing off,on] [--threads 2]

Each (length, checkpointing) case runs in a fresh child process, so its peak RSS is its own: the learner (LoRA rank
16 on ``--model``, float32, CPU, the sampler's temperature 0.7 / top-p 0.95) scores one trajectory of ``length``
random token ids whose last 300 are the policy's, then makes one GRPO update on it. Printed per case: the peak RSS of
the process (GiB), the RSS before the update, and the update's seconds. The GRPO stage of
``configs/experiments/table2_smollm2.yaml`` runs its learner in the process that holds vLLM's engine (9.9 GB), so
the learner's share decides whether a long binding-mix trajectory (up to 8,128 tokens) fits in 23.5 GB.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

TAIL = 300  # policy tokens at the end of the trajectory (the loss mask's ones)


def one_case(model: str, length: int, checkpointing: bool, threads: int) -> dict:
    """Run in the child: build the learner, score, update; return the measurements."""
    import random
    import resource
    import time

    import torch

    from bapsql.train.algo.grpo import LossConfig
    from bapsql.train.config import LearnerConfig, LoraSpec, OptimConfig
    from bapsql.train.learner.core import Learner, Sample

    torch.set_num_threads(threads)
    cfg = LearnerConfig(model_path=model, lora=LoraSpec(rank=16, alpha=32), optim=OptimConfig(lr=1e-5),
                        micro_batch_tokens=2048, dtype="float32", device="cpu", threads=threads, seed=0,
                        gradient_checkpointing=checkpointing, temperature=0.7, top_p=0.95)
    learner = Learner(cfg)
    rng = random.Random(0)
    ids = tuple(rng.randrange(100, 40_000) for _ in range(length))
    mask = (0,) * (length - TAIL) + (1,) * TAIL
    engine = tuple(float(v) for v in learner.token_logprobs([Sample(ids, mask)], masked_only=True)[0])
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    t0 = time.perf_counter()
    learner.grpo_update([Sample(ids, mask, engine_logprobs=engine, advantage=1.0)], LossConfig())
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    return {"length": length, "checkpointing": checkpointing, "peak_rss_gib": round(peak, 2),
            "rss_before_update_gib": round(before, 2), "update_s": round(seconds, 1)}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="a transformers model folder (e.g. a run's sft/merged)")
    p.add_argument("--lengths", default="3000,6000", help="trajectory lengths in tokens, comma-separated")
    p.add_argument("--checkpointing", default="off,on", help="off, on or both (comma-separated)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    modes = [m.strip() for m in a.checkpointing.split(",")]
    bad = sorted(set(modes) - {"off", "on"})
    if bad:
        p.error(f"--checkpointing: {bad} is not off or on")
    lengths = [int(x) for x in a.lengths.split(",")]
    if a.child:
        print(json.dumps(one_case(a.model, lengths[0], modes[0] == "on", a.threads)))
        return
    print("| trajectory tokens | checkpointing | peak RSS (GiB) | RSS before the update (GiB) | update (s) |")
    print("|---|---|---|---|---|")
    for length in lengths:
        for mode in modes:
            out = subprocess.run([sys.executable, __file__, "--child", "--model", a.model, "--lengths", str(length),
                                  "--checkpointing", mode, "--threads", str(a.threads)],
                                 capture_output=True, text=True, check=True)
            r = json.loads(out.stdout.strip().splitlines()[-1])
            print(f"| {r['length']} | {mode} | {r['peak_rss_gib']} | {r['rss_before_update_gib']} | {r['update_s']} |",
                  flush=True)


if __name__ == "__main__":
    main()
