"""Learner throughput as a ratio: `Learner.sft_update` / `Learner.grpo_update` tokens/s ÷ a bare torch forward +
backward + AdamW step of the same model, adapter, batch and lengths (goal: ratio >= 0.8).

    python benchmarks/bench_learner_ratio.py [--model smollm2-135m-instruct] [--batch 4] [--length 512]
        [--repeats 5] [--threads 2] [--mask-share 1.0] [--top-p 1.0] [--data text|random] [--json FILE]

- Model: ``--model`` (a registry name, ``builtin:tiny`` or a folder), float32 on CPU, ``torch.set_num_threads(
  --threads)``; LoRA rank 32 (alpha 64, dropout 0) on the attention and MLP projections (q, k, v, o, gate, up, down).
- Data: ``--batch`` sequences of ``--length`` token ids, one micro-batch of the learner (no padding: every
  sequence has the same length): consecutive windows of real agent transcripts (``--data text``: scripted workflow
  episodes on the embedded benchmark's dev tasks, rendered with the model's chat template; the model's
  distributions there are what GRPO sees) or uniformly random ids (``--data random``: flat distributions, the
  worst case for the top-p nucleus). Loss mask: the last ``--mask-share`` of each
  sequence's positions (1.0: every position but the first, the same positions the bare loop's cross-entropy
  covers). GRPO samples carry the learner's own logprobs as engine logprobs (computed once, untimed) and
  advantages ±1; the GRPO learner samples at temperature 1 and ``--top-p`` (1.0: no nucleus; 0.95: the paper's,
  which adds the nucleus sort to every position).
- Learner: `bapsql.train.learner.core.Learner` (its default micro-batching, chunked logprobs and gradient clipping), one
  ``sft_update`` / ``grpo_update`` = one optimizer step over the batch.
- Bare: a second copy of the same HF model with the same peft LoRA, ``loss = cross_entropy(logits[:, :-1],
  ids[:, 1:])`` over the masked positions (``ignore_index``), ``loss.backward()``, ``AdamW.step()``,
  ``zero_grad()``: what a plain training loop does, on the identical tensors.
- Protocol: one warm-up step of each side, then ``--repeats`` rounds, each timing bare, learner SFT, learner GRPO
  back to back in the same process (so load on the machine hits all sides alike); the ratio of a round is learner
  tok/s ÷ that round's bare tok/s; the table gives the median and the range over rounds. Tokens = all tokens
  processed (batch × length) on both sides.

Prints a Markdown table; ``--json FILE`` also writes the rounds and medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")  # attention + MLP


def episode_text_ids(model_dir: str, n_tokens: int) -> list[int]:
    """At least ``n_tokens`` token ids of real agent transcripts: scripted workflow episodes on the embedded
    benchmark's dev tasks (level M, terse prompt), each rendered with the model's chat template, concatenated."""
    from bapsql.budgets import load_ladder
    from bapsql.data.tasks import load_tasks, resolve_benchmark
    from bapsql.env.episode import BudgetedSQLEnv
    from bapsql.env.handles import DatabaseHandles
    from bapsql.env.records import EnvOptions
    from bapsql.policies.registry import make_policy
    from bapsql.rollout.agent import load_template
    from bapsql.rollout.runner import play_episode
    from bapsql.tokens import load_token_counter

    template = load_template(model_dir)
    handles = DatabaseHandles(load_token_counter(model_dir))
    tasks = load_tasks(resolve_benchmark("demo"), "dev")
    policies = ("workflow.drill_down", "workflow.estimate_rewrite", "workflow.evidence_compression")
    ids: list[int] = []
    for i, task in enumerate(tasks * 4):
        env = BudgetedSQLEnv(token_counter=handles.token_counter, handles=handles,
                             options=EnvOptions(prompt_style="terse"))
        play_episode(env, make_policy(policies[i % len(policies)]), task, load_ladder()["M"], 0)
        ids += template.apply(env.messages)
        if len(ids) >= n_tokens:
            break
    handles.close()
    return ids


def make_batch(vocab: int, batch: int, length: int, mask_share: float, seed: int = 0, text: list[int] | None = None):
    """``batch`` sequences of ``length`` ids — consecutive windows of ``text`` when given, else random ids in
    [3, vocab) — and their loss masks."""
    import torch

    g = torch.Generator().manual_seed(seed)
    if text is not None:
        if len(text) < batch * length:
            raise SystemExit(f"only {len(text)} tokens of transcripts for {batch} x {length}")
        ids = torch.tensor(text[:batch * length], dtype=torch.long).view(batch, length)
    else:
        ids = torch.randint(3, vocab, (batch, length), generator=g)
    trained = max(1, min(length - 1, round((length - 1) * mask_share)))
    mask = torch.zeros((batch, length), dtype=torch.long)
    mask[:, length - trained:] = 1
    return ids, mask


class Bare:
    """The plain loop: HF model + peft LoRA, full logits, cross-entropy, backward, AdamW."""

    def __init__(self, model_dir: str, rank: int, lr: float):
        import torch
        from peft import LoraConfig, get_peft_model
        from transformers import AutoModelForCausalLM

        torch.manual_seed(0)
        base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        self.model = get_peft_model(base, LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0,
                                                     target_modules=list(TARGETS), bias="none",
                                                     task_type="CAUSAL_LM"))
        self.model.train()
        self.opt = torch.optim.AdamW([p for p in self.model.parameters() if p.requires_grad], lr=lr)

    def step(self, ids, mask) -> float:
        import torch

        targets = ids[:, 1:].masked_fill(mask[:, 1:] == 0, -100)
        logits = self.model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False).logits
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), targets.reshape(-1),
                                                 ignore_index=-100)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return float(loss.detach())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--length", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rank", type=int, default=32)
    ap.add_argument("--mask-share", type=float, default=1.0, help="share of each sequence's positions trained")
    ap.add_argument("--top-p", type=float, default=1.0, help="the GRPO learner's sampling nucleus")
    ap.add_argument("--data", choices=["text", "random"], default="text",
                    help="token ids: windows of real agent transcripts, or uniformly random ids")
    ap.add_argument("--json", default=None, help="also write the results to this JSON file")
    a = ap.parse_args()

    import torch

    from bapsql.models.resolve import resolve_model
    from bapsql.train.algo.grpo import LossConfig
    from bapsql.train.config import LearnerConfig, LoraSpec, OptimConfig
    from bapsql.train.learner.core import Learner, Sample

    torch.set_num_threads(a.threads)
    model = resolve_model(a.model)
    load = os.getloadavg()[0]
    print(f"bench_learner_ratio: {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} CPUs, {a.threads} torch "
          f"threads, load {load:.1f}; {a.model}, batch {a.batch} x {a.length} ({a.data}), mask share "
          f"{a.mask_share}, GRPO top_p {a.top_p}", flush=True)

    def learner(top_p: float) -> Learner:
        return Learner(LearnerConfig(model_path=model, lora=LoraSpec(rank=a.rank, alpha=2 * a.rank, dropout=0.0,
                                                                     target_modules=TARGETS),
                                     optim=OptimConfig(lr=1e-5), dtype="float32", device="cpu", threads=a.threads,
                                     temperature=1.0, top_p=top_p))

    sft, grpo, bare = learner(1.0), learner(a.top_p), Bare(model, a.rank, 1e-5)
    vocab = bare.model.get_output_embeddings().out_features
    text = episode_text_ids(model, a.batch * a.length) if a.data == "text" else None
    ids, mask = make_batch(vocab, a.batch, a.length, a.mask_share, text=text)
    sft_samples = [Sample(tuple(r.tolist()), tuple(m.tolist())) for r, m in zip(ids, mask)]
    engine_lp = grpo.token_logprobs(sft_samples, masked_only=True)  # untimed: the sampler's logprobs
    grpo_samples = [Sample(s.input_ids, s.loss_mask, tuple(float(x) for x in lp), 1.0 if i % 2 else -1.0)
                    for i, (s, lp) in enumerate(zip(sft_samples, engine_lp))]
    loss_cfg = LossConfig()
    tokens = a.batch * a.length

    def timed(fn) -> float:
        t = time.perf_counter()
        fn()
        return tokens / (time.perf_counter() - t)

    sides = {"bare": lambda: bare.step(ids, mask), "learner SFT": lambda: sft.sft_update(sft_samples),
             "learner GRPO": lambda: grpo.grpo_update(grpo_samples, loss_cfg)}
    for fn in sides.values():  # warm-up (allocator, first-call costs)
        fn()
    rounds = []
    for r in range(a.repeats):
        tps = {name: timed(fn) for name, fn in sides.items()}
        rounds.append(tps)
        print(f"round {r + 1}: " + ", ".join(f"{k} {v:,.0f} tok/s" for k, v in tps.items())
              + f" (load {os.getloadavg()[0]:.1f})", flush=True)

    def ratios(name: str) -> list[float]:
        return [rd[name] / rd["bare"] for rd in rounds]

    result = {"date": time.strftime("%Y-%m-%d %H:%M"), "model": a.model, "batch": a.batch, "length": a.length,
              "data": a.data,
              "threads": a.threads, "rank": a.rank, "mask_share": a.mask_share, "grpo_top_p": a.top_p,
              "load_start": load, "load_end": os.getloadavg()[0], "rounds": rounds,
              "median_tok_s": {k: statistics.median(rd[k] for rd in rounds) for k in sides},
              "median_ratio": {k: statistics.median(ratios(k)) for k in sides if k != "bare"}}
    print()
    print("| side | median tok/s | ratio to bare (median, range over rounds) |")
    print("|---|---|---|")
    for k in sides:
        rs = "1 (reference)" if k == "bare" else \
            f"**{result['median_ratio'][k]:.2f}** ({min(ratios(k)):.2f}–{max(ratios(k)):.2f})"
        print(f"| {k} | {result['median_tok_s'][k]:,.0f} | {rs} |")
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {a.json}")


if __name__ == "__main__":
    main()
