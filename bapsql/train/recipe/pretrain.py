"""In-domain pretraining of the tiny model on a copy-heavy corpus (the CPU learning recipe's first stage).

Why: a freshly built 3M-parameter model, briefly pretrained on the tokenizer corpus, learns the tool-call scaffold in
SFT but not the SQL: it must copy table, column and value strings out of the question and schema, and result values
into the answer, which needs induction-style attention that a few hundred SFT steps do not grow (measured in
/work/shared/notes/cpu-learning.md). This stage grows it: full-parameter next-token training on whole episodes of a
workflow over *augmented* tasks of the training databases (`bapsql.data.augment`: fresh questions of the same
templates, none equal to a held-out test question), the loss on every completion token.

Contract of `run_pretrain(cfg, seed, run_dir)`:

- builds the model from ``cfg.pretrain`` (`TinySpec`, random init from ``seed``; `make_tiny_model` without its
  tokenizer-corpus steps) into ``run_dir/pretrain/model``;
- exports the corpus once into ``run_dir/pretrain/corpus.parquet`` (`export_sft` with ``per_episode``, successes only,
  the config's prompt style, workflows and budgets, over `augment_tasks` excluding ``data.eval_split``'s tasks; with
  several ``pretrain.conditions`` an equal share of the episodes under each, `corpus_conditions`);
- trains ``steps`` AdamW steps of ``batch`` episodes (warm-up, cosine to 10 %), logits only at completion positions
  (the output matrix is a third of the FLOPs; most positions are prompt), on ``threads`` torch threads; with
  ``copy_batch > 0`` each step also trains ``copy_batch`` sequences of the synthetic copy task
  (`bapsql.train.recipe.copy_task`), which grows the attention that copies result values into answers;
- saves the weights in place and ``run_dir/pretrain/result.json`` with the loss curve (every ``log_every`` steps: the
  batch's completion loss, and on 32 episodes of real fit-split tasks — questions the corpus does not contain — the
  completion NLL and the teacher-forced exact-completion share, `heldout_metrics`).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bapsql.errors import ConfigError


@dataclass(frozen=True)
class PretrainResult:
    model_dir: Path
    corpus_episodes: int
    steps: int
    tokens: int
    seconds: float
    tokens_per_s: float
    curve: tuple[dict, ...]  # {"step", "loss", "heldout_nll", "seconds"}


def _batch(rows: list[dict], pad: int) -> tuple[Any, Any]:
    """Right-padded ``input_ids [B, T]`` and ``labels [B, T]`` (-100 outside completions)."""
    import torch

    width = max(len(r["input_ids"]) for r in rows)
    x = torch.full((len(rows), width), pad, dtype=torch.long)
    y = torch.full((len(rows), width), -100, dtype=torch.long)
    for i, r in enumerate(rows):
        ids = torch.tensor(r["input_ids"], dtype=torch.long)
        mask = torch.tensor(r["loss_mask"], dtype=torch.bool)
        x[i, :len(ids)] = ids
        y[i, :len(ids)] = torch.where(mask, ids, torch.full_like(ids, -100))
    return x, y


def completion_loss(model: Any, x: Any, y: Any, *, reduction: str = "mean") -> Any:
    """Next-token cross-entropy at completion positions only: ``x, y [B, T]`` → scalar (mean or sum)."""
    import torch

    hidden = model.model(input_ids=x).last_hidden_state[:, :-1]
    target = y[:, 1:]
    sel = target != -100
    return torch.nn.functional.cross_entropy(model.lm_head(hidden[sel]), target[sel], reduction=reduction)


def heldout_metrics(model: Any, rows: list[dict], pad: int, batch: int = 16) -> dict[str, float]:
    """Over ``rows``: ``nll`` = mean completion NLL per token; ``token_acc`` = share of completion tokens that are
    the argmax; ``exact`` = share of sequences whose every completion token is the argmax (teacher-forced: an upper
    bound on greedy success, one forward pass instead of an episode)."""
    import torch

    total = n = correct = exact = 0.0
    model.eval()
    with torch.no_grad():
        for i in range(0, len(rows), batch):
            x, y = _batch(rows[i:i + batch], pad)
            hidden = model.model(input_ids=x).last_hidden_state[:, :-1]
            target = y[:, 1:]
            sel = target != -100
            logits = model.lm_head(hidden[sel])
            total += float(torch.nn.functional.cross_entropy(logits, target[sel], reduction="sum"))
            n += int(sel.sum())
            hit = torch.zeros_like(target, dtype=torch.bool)
            hit[sel] = logits.argmax(-1) == target[sel]
            correct += float(hit[sel].sum())
            exact += float(((hit | ~sel).all(dim=1)).sum())
    model.train()
    return {"nll": total / max(n, 1), "token_acc": correct / max(n, 1), "exact": exact / max(len(rows), 1)}


def heldout_nll(model: Any, rows: list[dict], pad: int, batch: int = 16) -> float:
    """Mean completion NLL per token over ``rows``."""
    return heldout_metrics(model, rows, pad, batch)["nll"]


def train_sequences(model: Any, rows: list[dict], *, steps: int, batch: int, lr: float, seed: int, pad: int,
                    heldout: list[dict] = (), log_every: int = 100, warmup: int = 50,
                    on_log: Any = None, copy: Any = None) -> tuple[list[dict], int, float]:
    """Full-parameter training over ``rows`` (dicts with ``input_ids``, ``loss_mask``); returns (curve, tokens, s).
    With ``copy`` (a `CopyTask`) each step adds the loss of a fresh batch of the synthetic copy task; the logged
    ``loss`` stays the episodes' completion loss."""
    import torch

    from bapsql.train.recipe.copy_task import copy_sequences

    if not rows:
        raise ConfigError("pretrain: the corpus is empty")
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, s / steps)))))
    rng = np.random.default_rng(seed)
    copy_rng = np.random.default_rng([seed, 1])  # its own stream: the episodes' order does not depend on it
    order: list[int] = []
    curve: list[dict] = []
    tokens = 0
    t0 = time.perf_counter()
    model.train()
    for step in range(steps):
        if len(order) < batch:
            order = [int(i) for i in rng.permutation(len(rows))] + order
        chunk = [rows[order.pop()] for _ in range(batch)]
        x, y = _batch(chunk, pad)
        tokens += sum(len(r["input_ids"]) for r in chunk)
        loss = completion_loss(model, x, y)
        total = loss
        if copy is not None:
            cx, cy = copy_sequences(copy, copy_rng)
            tokens += int(cx.numel())
            total = loss + completion_loss(model, cx, cy)
        total.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        if step % log_every == 0 or step == steps - 1:
            held = heldout_metrics(model, list(heldout), pad) if heldout else {}
            point = {"step": step, "loss": round(float(loss.detach()), 4),
                     "heldout_nll": round(held["nll"], 4) if held else None,
                     "heldout_exact": round(held["exact"], 4) if held else None,
                     "seconds": round(time.perf_counter() - t0, 1)}
            curve.append(point)
            if on_log is not None:
                on_log(point)
    model.eval()
    return curve, tokens, time.perf_counter() - t0


def corpus_conditions(cfg: Any) -> tuple[str, ...]:
    """The conditions the corpus is played under: ``pretrain.conditions``, or the training condition alone."""
    return tuple(cfg.pretrain.conditions) or (cfg.condition,)


def _shares(total: int, k: int) -> list[int]:
    """``total`` split into ``k`` near-equal positive parts (the first ``total % k`` one larger)."""
    if total < k:
        raise ConfigError(f"pretrain: {total} corpus episodes cannot cover {k} conditions; raise corpus_episodes or "
                          "augment_rounds")
    return [total // k + (i < total % k) for i in range(k)]


def _concat_parquet(parts: list[Path], out: Path) -> None:
    """Concatenate Parquet files of one schema into ``out`` (written whole, then renamed), then drop the parts."""
    import os

    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.concat_tables([pq.read_table(p) for p in parts], promote_options="default")
    tmp = out.with_name(f".{out.name}.tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, out)
    for p in parts:
        p.unlink()


def read_rows(path: Path) -> list[dict]:
    """The ``input_ids`` / ``loss_mask`` rows of a sequence Parquet file (a corpus, or `export_sft`'s episodes)."""
    import pyarrow.parquet as pq

    return pq.read_table(path, columns=["input_ids", "loss_mask"]).to_pylist()


def run_pretrain(cfg: Any, seed: int, run_dir: Path, *, console: Any = None) -> PretrainResult:
    """The pretraining stage (see the module docstring). ``cfg`` is a `TrainConfig`."""
    import torch
    from transformers import Qwen2ForCausalLM

    from bapsql.data.augment import augment_tasks
    from bapsql.data.tasks import load_tasks, resolve_benchmark
    from bapsql.env.records import EnvOptions
    from bapsql.models.tiny import TinySpec, make_tiny_model
    from bapsql.policies.sft_export import export_sft

    p = cfg.pretrain
    out = run_dir / "pretrain"
    model_dir = out / "model"
    root = resolve_benchmark(cfg.data.benchmark)
    spec = TinySpec(hidden_size=p.hidden_size, num_layers=p.num_layers, num_heads=p.num_heads,
                    num_kv_heads=p.num_kv_heads, intermediate_size=p.intermediate_size,
                    max_position_embeddings=p.max_positions)
    make_tiny_model(model_dir, seed=seed, spec=spec, pretrain_steps=0)
    corpus = out / "corpus.parquet"
    options = EnvOptions(prompt_style=cfg.prompt_style)
    heldout_path = out / "heldout.parquet"
    if not heldout_path.is_file():  # episodes of real fit tasks, to watch; the corpus never sees these questions
        export_sft(root, cfg.data.split, 64, heldout_path, seed=seed + 7, workflows=p.workflows, budgets=p.budgets,
                   env_options=options, per_episode=True, only_successes=True, tokenizer_dir=model_dir)
    if not corpus.is_file():
        import pyarrow.parquet as pq

        watched = set(pq.read_table(heldout_path, columns=["task_id"]).column("task_id").to_pylist())
        fit = [t for t in load_tasks(root, cfg.data.split) if t.task_id in watched]
        banned = load_tasks(root, cfg.data.eval_split)  # held-out test questions never reach the corpus
        aug = augment_tasks(root, cfg.data.split, p.augment_rounds, seed=seed + 1, exclude=[*banned, *fit])
        if console is not None:
            console.print(f"[cyan]pretrain corpus: {len(aug)} augmented tasks on the {cfg.data.split} databases[/cyan]")
        # one pass over the augmented tasks draws one budget per task; asking for more episodes than tasks would
        # replay passes mostly for the other budget's near-duplicate (only the dashboard line differs)
        total = min(p.corpus_episodes, int(0.8 * len(aug)))
        conditions = corpus_conditions(cfg)
        parts = []
        for i, (cond, n) in enumerate(zip(conditions, _shares(total, len(conditions)), strict=True)):
            part = corpus if len(conditions) == 1 else out / f"corpus-{cond}.parquet"
            export_sft(root, cfg.data.split, n, part, seed=seed + 101 * i, workflows=p.workflows, budgets=p.budgets,
                       condition=cond, env_options=options, per_episode=True, tasks=aug, only_successes=True,
                       tokenizer_dir=model_dir)
            parts.append(part)
        if len(parts) > 1:
            _concat_parquet(parts, corpus)
    rows = read_rows(corpus)
    heldout = read_rows(heldout_path)[:32]
    pad = json.loads((model_dir / "config.json").read_text())["pad_token_id"]
    threads = torch.get_num_threads()
    torch.set_num_threads(p.threads)
    try:
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        def log(pt: dict) -> None:
            if console is not None:
                console.print(f"[cyan]pretrain step {pt['step']}: loss {pt['loss']}, held-out completion NLL "
                              f"{pt['heldout_nll']}, exact {pt['heldout_exact']} ({pt['seconds']} s)[/cyan]")

        copy = None
        if p.copy_batch > 0:
            from transformers import AutoTokenizer

            from bapsql.train.recipe.copy_task import CopyTask, copy_alphabet

            tok = AutoTokenizer.from_pretrained(model_dir)
            texts = tok.batch_decode([[i] for i in range(len(tok))])
            copy = CopyTask(copy_alphabet(texts, p.copy_words, seed), p.copy_batch, p.copy_length)
        curve, tokens, seconds = train_sequences(model, rows, steps=p.steps, batch=p.batch, lr=p.lr, seed=seed,
                                                 pad=pad, heldout=heldout, log_every=p.log_every, on_log=log,
                                                 copy=copy)
    finally:
        torch.set_num_threads(threads)
    model.save_pretrained(model_dir, safe_serialization=True)
    result = PretrainResult(model_dir, len(rows), p.steps, tokens, seconds, tokens / max(seconds, 1e-9),
                            tuple(curve))
    (out / "result.json").write_text(json.dumps({
        "model_dir": str(model_dir), "corpus_episodes": len(rows), "steps": p.steps, "tokens": tokens,
        "seconds": round(seconds, 1), "tokens_per_s": round(result.tokens_per_s, 1), "curve": curve}, indent=1))
    return result
