"""SFT on the workflows' turn-level pairs, data-parallel through Ray Train (DESIGN §5, paper "Reproducibility").

Recipe: LoRA rank 32, lr 1e-4, effective batch 128 sequences (gradient accumulation), max length 8,192 tokens
(longer pairs are dropped, counted), one epoch, loss on completion tokens only (the pairs' ``loss_mask``), reading the
Parquet that ``bapsql sft-data`` writes (columns ``input_ids``, ``loss_mask``).

- `load_pairs(path, max_length)` → `Sample` list; `sft_epochs(learner, samples, ...)` is the plain training loop one
  worker runs: the same seeded shuffle on every rank, each effective batch split round-robin across ranks
  (``effective_batch / world`` sequences per rank per step), one optimizer step per effective batch. Each rank's
  loss is the token mean of its share; DDP averages the ranks' gradients.
- `run_sft(...)` runs that loop under Ray Train: a `TorchTrainer` with ``ScalingConfig(num_workers, use_gpu)``; each
  worker builds a `Learner` whose forward module is wrapped by ``ray.train.torch.prepare_model`` (DDP across GPUs and
  nodes, or FSDP with ``strategy: fsdp``; a single worker is left unwrapped), reports per-step metrics with
  ``ray.train.report``, and rank 0 hands back the adapter and the SFT-merged model (base + adapter, a plain
  transformers folder: the GRPO stage's base and the engine's model) as a Ray Train checkpoint, copied to ``out_dir``.
  On this machine: one CPU worker. Ray is imported only inside `run_sft`.
"""

from __future__ import annotations

import dataclasses
import math
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from bapsql.errors import ConfigError
from bapsql.train.config import LearnerConfig
from bapsql.train.learner import Sample, UpdateMetrics


@dataclass(frozen=True)
class SFTResult:
    """What an SFT run produced: the adapter, the merged model folder, and the per-step metrics."""

    adapter_dir: Path
    merged_dir: Path
    pairs: int
    dropped_too_long: int
    steps: int
    losses: tuple[float, ...]
    tokens_per_s: float
    seconds: float
    history: tuple[dict, ...] = field(default_factory=tuple)


def load_pairs(path: str | Path, max_length: int) -> tuple[list[Sample], int]:
    """The SFT pairs of ``path`` as samples (prompt+completion ids, completion-only mask) and how many were longer
    than ``max_length`` and dropped."""
    import pyarrow.parquet as pq

    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"SFT data not found: {p}; export it with `bapsql sft-data --out {p}`")
    table = pq.read_table(p, columns=["input_ids", "loss_mask"])
    samples, dropped = [], 0
    for ids, mask in zip(table.column("input_ids").to_pylist(), table.column("loss_mask").to_pylist()):
        if len(ids) > max_length:
            dropped += 1
            continue
        samples.append(Sample(tuple(ids), tuple(int(m) for m in mask)))
    if not samples:
        raise ConfigError(f"{p}: no SFT pair fits max_length {max_length}")
    return samples, dropped


def steps_per_epoch(n: int, effective_batch: int) -> int:
    return max(1, math.ceil(n / effective_batch))


def sft_epochs(learner: Any, samples: Sequence[Sample], *, effective_batch: int, epochs: int = 1, seed: int = 0,
               rank: int = 0, world: int = 1,
               on_step: Callable[[int, UpdateMetrics], None] | None = None) -> list[UpdateMetrics]:
    """Train ``epochs`` passes over ``samples``; one optimizer step per effective batch (see the module docstring).

    Every rank shuffles identically (``seed`` + epoch) and takes ``batch[rank::world]``; a last partial batch is
    used too. Returns the per-step metrics of this rank."""
    if effective_batch % world:
        raise ConfigError(f"effective batch {effective_batch} does not divide by {world} workers")
    out: list[UpdateMetrics] = []
    step = 0
    for epoch in range(epochs):
        order = np.random.default_rng(seed + epoch).permutation(len(samples))
        for start in range(0, len(order), effective_batch):
            batch = [samples[int(i)] for i in order[start:start + effective_batch]]
            mine = batch[rank::world] or batch[:1]
            m = learner.sft_update(mine)
            out.append(m)
            if on_step is not None:
                on_step(step, m)
            step += 1
    return out


def _worker_loop(config: dict) -> None:
    """Ray Train's ``train_loop_per_worker``: one data-parallel SFT worker (see `run_sft`)."""
    import tempfile

    import ray.train
    import ray.train.torch

    from bapsql.train.learner import Learner

    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    samples, dropped = load_pairs(config["data"], config["max_length"])
    lcfg: LearnerConfig = config["learner"]
    total = steps_per_epoch(len(samples), config["effective_batch"]) * config["epochs"]
    lcfg = dataclasses.replace(lcfg, optim=dataclasses.replace(lcfg.optim, total_steps=total),
                               device=str(ray.train.torch.get_device()))
    kwargs = {"use_orig_params": True} if config["strategy"] == "fsdp" else None  # frozen base + LoRA

    def ddp(m):
        return ray.train.torch.prepare_model(m, move_to_device=False, parallel_strategy=config["strategy"],
                                             parallel_strategy_kwargs=kwargs)
    learner = Learner(lcfg, wrap=ddp if world > 1 else None)
    t0 = time.perf_counter()

    def report(step: int, m: UpdateMetrics) -> None:
        if step < total - 1:
            ray.train.report({"step": step, "loss": m.loss, "grad_norm": m.grad_norm, "lr": m.lr,
                              "tokens_per_s": m.tokens_per_s, "tokens": m.tokens})

    metrics = sft_epochs(learner, samples, effective_batch=config["effective_batch"], epochs=config["epochs"],
                         seed=config["seed"], rank=rank, world=world, on_step=report)
    final = {"step": len(metrics) - 1, "loss": metrics[-1].loss, "grad_norm": metrics[-1].grad_norm,
             "lr": metrics[-1].lr, "tokens_per_s": sum(m.tokens for m in metrics) / (time.perf_counter() - t0),
             "tokens": metrics[-1].tokens, "pairs": len(samples), "dropped_too_long": dropped,
             "losses": [m.loss for m in metrics]}
    if rank == 0:
        with tempfile.TemporaryDirectory() as tmp:
            learner.save_adapter(Path(tmp) / "adapter")
            learner.merge_and_save(Path(tmp) / "merged")
            ray.train.report(final, checkpoint=ray.train.Checkpoint.from_directory(tmp))
    else:
        ray.train.report(final)


def run_sft(data: str | Path, learner_cfg: LearnerConfig, out_dir: str | Path, *, effective_batch: int = 128,
            max_length: int = 8192, epochs: int = 1, seed: int = 0, num_workers: int = 1, use_gpu: bool = False,
            strategy: str = "ddp", resources_per_worker: dict | None = None) -> SFTResult:
    """Run SFT with Ray Train's `TorchTrainer` (Ray must be initialized, or it starts a local instance) and copy
    the adapter and merged model to ``out_dir/adapter`` and ``out_dir/merged``."""
    import ray.train
    from ray.train.torch import TorchTrainer

    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    trainer = TorchTrainer(
        _worker_loop,
        train_loop_config={"data": str(Path(data).resolve()), "learner": learner_cfg, "max_length": max_length,
                           "effective_batch": effective_batch // num_workers * num_workers, "epochs": epochs,
                           "seed": seed, "strategy": strategy},
        scaling_config=ray.train.ScalingConfig(num_workers=num_workers, use_gpu=use_gpu,
                                               resources_per_worker=resources_per_worker),
        run_config=ray.train.RunConfig(name="sft", storage_path=str(out / "ray_train")),
    )
    result = trainer.fit()
    if result.error is not None:
        raise result.error
    if result.checkpoint is None:
        raise ConfigError("SFT finished without a checkpoint from rank 0")
    for name in ("adapter", "merged"):
        if (out / name).exists():
            shutil.rmtree(out / name)
    with result.checkpoint.as_directory() as ckpt:
        shutil.copytree(Path(ckpt) / "adapter", out / "adapter")
        shutil.copytree(Path(ckpt) / "merged", out / "merged")
    m = result.metrics
    history = tuple(dict(r) for r in result.metrics_dataframe.to_dict("records")) \
        if result.metrics_dataframe is not None else ()
    return SFTResult(adapter_dir=out / "adapter", merged_dir=out / "merged", pairs=int(m["pairs"]),
                     dropped_too_long=int(m["dropped_too_long"]), steps=int(m["step"]) + 1,
                     losses=tuple(float(x) for x in m["losses"]), tokens_per_s=float(m["tokens_per_s"]),
                     seconds=time.perf_counter() - t0, history=history)
