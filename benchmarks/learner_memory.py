"""Peak memory and time of one learner update, with and without gradient checkpointing.

    python benchmarks/learner_memory.py --model DIR [--stage grpo|sft] [--lengths 3000,6000] [--batch 1]
        [--micro-batch-tokens 2048] [--checkpointing off,on] [--repeats 1] [--threads 2] [--pairs PARQUET]

Each (length, checkpointing) case runs in a fresh child process, so its peak RSS is its own: the learner (LoRA rank
16 on ``--model``, float32, CPU) gets ``--batch`` sequences of ``length`` random token ids whose last 300 are the
policy's (the loss mask), cut into micro-batches of ``--micro-batch-tokens`` padded tokens. ``--pairs`` (an SFT
Parquet, e.g. a run's ``sft_pairs.parquet``) takes the first ``--batch`` of its sequences and loss masks instead
(``--lengths`` is then ignored; the table shows their mean length).

- ``--stage grpo`` (default): the sampler's temperature 0.7 / top-p 0.95; the learner scores the sequences, then
  makes one GRPO update on them. The GRPO stage of ``configs/experiments/table2_smollm2.yaml`` runs its learner in
  the process that holds vLLM's engine (9.9 GB), so the learner's share decides whether a long binding-mix
  trajectory (up to 8,128 tokens) fits in 23.5 GB.
- ``--stage sft``: one SFT update (completion NLL at temperature 1), as the SFT and protocol stages make
  (per-episode sequences of at most 2,048 tokens, micro-batches of 4,096 padded tokens), with no engine in the
  process.

With ``--repeats R`` > 1 a first update warms up and the next R are timed (their median is printed). Printed per
case: the peak RSS of the process (GiB), the RSS before the first update, and the update's seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

TAIL = 300  # policy tokens at the end of the trajectory (the loss mask's ones)


def one_case(model: str, length: int, checkpointing: bool, threads: int, *, stage: str = "grpo", batch: int = 1,
             micro_batch_tokens: int = 2048, repeats: int = 1, pairs: str | None = None) -> dict:
    """Run in the child: build the learner, (score,) update; return the measurements."""
    import random
    import resource
    import statistics
    import time

    import torch

    from bapsql.train.algo.grpo import LossConfig
    from bapsql.train.config import LearnerConfig, LoraSpec, OptimConfig
    from bapsql.train.learner.core import Learner, Sample

    torch.set_num_threads(threads)
    sampled = stage == "grpo"
    cfg = LearnerConfig(model_path=model, lora=LoraSpec(rank=16, alpha=32), optim=OptimConfig(lr=1e-5),
                        micro_batch_tokens=micro_batch_tokens, dtype="float32", device="cpu", threads=threads, seed=0,
                        gradient_checkpointing=checkpointing, temperature=0.7 if sampled else 1.0,
                        top_p=0.95 if sampled else 1.0)
    learner = Learner(cfg)
    if pairs is None:
        vocab = min(40_000, int(learner.model.config.vocab_size))
        rng = random.Random(0)
        mask = (0,) * (length - TAIL) + (1,) * TAIL
        samples = [Sample(tuple(rng.randrange(100, vocab) for _ in range(length)), mask) for _ in range(batch)]
    else:
        import pyarrow.parquet as pq

        table = pq.read_table(pairs, columns=["input_ids", "loss_mask"]).slice(0, batch)
        samples = [Sample(tuple(i), tuple(int(m) for m in k)) for i, k in
                   zip(table.column("input_ids").to_pylist(), table.column("loss_mask").to_pylist())]
        length = round(sum(len(x.input_ids) for x in samples) / len(samples))
    if sampled:
        engine = learner.token_logprobs(samples, masked_only=True)
        samples = [Sample(s.input_ids, s.loss_mask, engine_logprobs=tuple(float(v) for v in e), advantage=1.0)
                   for s, e in zip(samples, engine)]
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    seconds = []
    for _ in range(1 + repeats if repeats > 1 else 1):
        t0 = time.perf_counter()
        if sampled:
            learner.grpo_update(samples, LossConfig())
        else:
            learner.sft_update(samples)
        seconds.append(time.perf_counter() - t0)
    timed = seconds[1:] if repeats > 1 else seconds
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    return {"length": length, "checkpointing": checkpointing, "peak_rss_gib": round(peak, 2),
            "rss_before_update_gib": round(before, 2), "update_s": round(statistics.median(timed), 1)}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="a transformers model folder (e.g. a run's sft/merged)")
    p.add_argument("--lengths", default="3000,6000", help="trajectory lengths in tokens, comma-separated")
    p.add_argument("--checkpointing", default="off,on", help="off, on or both (comma-separated)")
    p.add_argument("--stage", choices=("grpo", "sft"), default="grpo", help="which update to time")
    p.add_argument("--batch", type=int, default=1, help="sequences in the update")
    p.add_argument("--micro-batch-tokens", type=int, default=2048, help="the learner's micro-batch (padded tokens)")
    p.add_argument("--repeats", type=int, default=1, help="timed updates after a warm-up one (1: one, no warm-up)")
    p.add_argument("--pairs", default=None, help="an SFT Parquet whose first --batch sequences to use")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    modes = [m.strip() for m in a.checkpointing.split(",")]
    bad = sorted(set(modes) - {"off", "on"})
    if bad:
        p.error(f"--checkpointing: {bad} is not off or on")
    lengths = [int(x) for x in a.lengths.split(",")]
    if a.pairs is not None:
        if not os.path.isfile(a.pairs):
            p.error(f"--pairs: no file {a.pairs} (an SFT Parquet, e.g. <run>/sft_pairs.parquet)")
        lengths = lengths[:1]
    elif min(lengths) <= TAIL:
        p.error(f"--lengths must exceed the {TAIL} policy tokens")
    if a.batch < 1 or a.repeats < 1:
        p.error("--batch and --repeats must be >= 1")
    if a.child:
        print(json.dumps(one_case(a.model, lengths[0], modes[0] == "on", a.threads, stage=a.stage, batch=a.batch,
                                  micro_batch_tokens=a.micro_batch_tokens, repeats=a.repeats, pairs=a.pairs)))
        return
    print(f"{a.stage} update, {a.batch} sequence(s) a case ({a.pairs or 'random ids'}), micro-batches of "
          f"{a.micro_batch_tokens} tokens")
    print("| sequence tokens | checkpointing | peak RSS (GiB) | RSS before the update (GiB) | update (s) |")
    print("|---|---|---|---|---|")
    for length in lengths:
        for mode in modes:
            out = subprocess.run([sys.executable, __file__, "--child", "--model", a.model, "--lengths", str(length),
                                  "--checkpointing", mode, "--threads", str(a.threads), "--stage", a.stage,
                                  "--batch", str(a.batch), "--micro-batch-tokens", str(a.micro_batch_tokens),
                                  "--repeats", str(a.repeats), *(["--pairs", a.pairs] if a.pairs else [])],
                                 capture_output=True, text=True, check=True)
            r = json.loads(out.stdout.strip().splitlines()[-1])
            print(f"| {r['length']} | {mode} | {r['peak_rss_gib']} | {r['rss_before_update_gib']} | {r['update_s']} |",
                  flush=True)


if __name__ == "__main__":
    main()
