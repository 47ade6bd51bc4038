"""Peak memory of the learner's token logprobs: the chunked LM head (`bapsql.train.algo.logprobs`) vs the full-logits
path.

    python benchmarks/bench_logprobs.py [--vocab 151936] [--hidden 128] [--chunk N] [--tiny-tokens 8000]

Each case runs in a fresh subprocess and reports its peak resident memory above what it held just before the
measured step (``ru_maxrss`` − RSS before; CPU, float32), so cases never see each other's allocations:

1. ``head``: forward + backward of the logprobs of ``N`` positions through a ``vocab × hidden`` output head (a
   150k-vocabulary head, Qwen's 151,936 by default), plain (all ``[N, V]`` logits at once, as the learner did) vs
   chunked (``--chunk`` positions per chunk; default: the learner's automatic size for the vocabulary), for several
   ``N`` up to the L budget's 11,000-token context. The plain path is not run at 11,000 (it
   would need ~20 GiB on a 24 GiB machine shared with others); its per-token cost is measured at smaller ``N``
   and extrapolated linearly (its memory is linear in ``N``).
2. ``tiny``: one real `Learner.sft_update` (LoRA, forward + backward, every position in the loss) on one
   ``--tiny-tokens``-token sequence of the tiny model, with ``logprob_chunk_tokens`` 0 (plain, the learner's path
   before this change) vs the default (automatic).

Prints a Markdown table. Peak RSS includes allocator slack, so compare ratios within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

L_TOKENS = 11_000  # the L budget's context


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def run_head(n: int, vocab: int, hidden: int, chunk: int) -> dict:
    """Forward + backward of ``n`` logprobs through a ``vocab × hidden`` head; ``chunk`` 0 = plain."""
    import torch

    from bapsql.train.algo.logprobs import chunked_token_logprobs, reference_token_logprobs

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(vocab, hidden, generator=g) * 0.02
    hidden_states = torch.randn(n, hidden, generator=g).requires_grad_(True)
    targets = torch.randint(0, vocab, (n,), generator=g)
    before = _rss_mib()
    if chunk:
        lp = chunked_token_logprobs(hidden_states, weight, targets, chunk=chunk)
    else:
        lp = reference_token_logprobs(hidden_states, weight, targets)
    lp.sum().backward()
    return {"peak_above_mib": _peak_mib() - before, "value": float(lp.sum())}


def run_tiny(tokens: int, chunk: int, model_dir: str) -> dict:
    """One LoRA SFT update of the tiny model on a ``tokens``-long sequence, all positions in the loss."""
    import random

    from bapsql.train.config import LearnerConfig, LoraSpec, OptimConfig
    from bapsql.train.learner.core import Learner, Sample

    learner = Learner(LearnerConfig(model_path=model_dir, lora=LoraSpec(rank=32, alpha=64), optim=OptimConfig(),
                                    micro_batch_tokens=tokens, dtype="float32", device="cpu", threads=1,
                                    logprob_chunk_tokens=None if chunk < 0 else chunk))
    rng = random.Random(0)
    sample = Sample(tuple(rng.randrange(100, 8000) for _ in range(tokens)), (0,) + (1,) * (tokens - 1))
    before = _rss_mib()
    m = learner.sft_update([sample])
    return {"peak_above_mib": _peak_mib() - before, "value": m.loss}


def _case(args: list[str]) -> dict:
    out = subprocess.run([sys.executable, __file__, "--case", *args], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, default=151_936)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--chunk", type=int, default=None)
    ap.add_argument("--tiny-tokens", type=int, default=8000)
    ap.add_argument("--case", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.case:
        kind, *rest = args.case
        res = run_head(*map(int, rest)) if kind == "head" else run_tiny(int(rest[0]), int(rest[1]), rest[2])
        print(json.dumps(res))
        return

    from bapsql.train.algo.logprobs import auto_chunk

    args.chunk = args.chunk or auto_chunk(args.vocab)
    print("| case | positions | path | peak above start (MiB) | logits [N, V] float32 (MiB) |")
    print("|---|---:|---|---:|---:|")
    per_token = []
    for n in (512, 1024, 2048):
        plain = _case(["head", str(n), str(args.vocab), str(args.hidden), "0"])
        chunked = _case(["head", str(n), str(args.vocab), str(args.hidden), str(args.chunk)])
        assert abs(plain["value"] - chunked["value"]) < 1e-2 * max(1.0, abs(plain["value"]))
        logits = n * args.vocab * 4 / 2**20
        per_token.append(plain["peak_above_mib"] / n)
        print(f"| head V={args.vocab} | {n} | plain | {plain['peak_above_mib']:.0f} | {logits:.0f} |")
        print(f"| head V={args.vocab} | {n} | chunked ({args.chunk}) | {chunked['peak_above_mib']:.0f} | {logits:.0f} |")
    big = _case(["head", str(L_TOKENS), str(args.vocab), str(args.hidden), str(args.chunk)])
    logits = L_TOKENS * args.vocab * 4 / 2**20
    projected = max(per_token) * L_TOKENS
    print(f"| head V={args.vocab} | {L_TOKENS} (L) | plain, projected from the rows above | ~{projected:.0f} | "
          f"{logits:.0f} |")
    print(f"| head V={args.vocab} | {L_TOKENS} (L) | chunked ({args.chunk}) | {big['peak_above_mib']:.0f} | "
          f"{logits:.0f} |")

    from bapsql.models.tiny import TinySpec, make_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "tiny"
        make_tiny_model(model, seed=0, spec=TinySpec(max_position_embeddings=max(8192, args.tiny_tokens)))
        n = args.tiny_tokens
        plain = _case(["tiny", str(n), "0", str(model)])
        chunked = _case(["tiny", str(n), "-1", str(model)])
        assert abs(plain["value"] - chunked["value"]) < 1e-4 * max(1.0, abs(plain["value"]))
        logits = n * 8192 * 4 / 2**20
        print(f"| tiny model SFT update (V=8192) | {n} | plain (today's path) | {plain['peak_above_mib']:.0f} | "
              f"{logits:.0f} |")
        print(f"| tiny model SFT update (V=8192) | {n} | chunked ({auto_chunk(8192)}, auto) | "
              f"{chunked['peak_above_mib']:.0f} | "
              f"{logits:.0f} |")


if __name__ == "__main__":
    main()
