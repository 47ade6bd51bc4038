"""SFT on the workflows' turn-level pairs, data-parallel through Ray Train (DESIGN §5, paper "Reproducibility").

Recipe: LoRA rank 32, lr 1e-4, effective batch 128 sequences (gradient accumulation), max length 8,192 tokens
(longer pairs are dropped, counted), one epoch, loss on completion tokens only (the pairs' ``loss_mask``), reading the
Parquet that ``bapsql sft-data`` writes (columns ``input_ids``, ``loss_mask``).

- `load_pairs(path, max_length)` → `Sample` list; `sft_epochs(learner, samples, ...)` is the plain training loop one
  worker runs: the same seeded shuffle on every rank, each effective batch split round-robin across ranks
  (``effective_batch / world`` sequences per rank per step), one optimizer step per effective batch. Each rank's
  loss is the token mean of its share; DDP averages the ranks' gradients.
- `run_sft(...)` runs `sft_worker` under Ray Train (`bapsql.rollout.ray_shell.train.fit_data_parallel`: a
  `TorchTrainer` with ``ScalingConfig(num_workers, use_gpu)``); each worker builds a `Learner` whose forward module
  is wrapped by Ray Train's ``prepare_model`` (DDP across GPUs and nodes, or FSDP with ``strategy: fsdp``; a single
  worker is left unwrapped), reports per-step metrics, and rank 0 hands back the adapter and the SFT-merged model
  (base + adapter, a plain transformers folder: the GRPO stage's base and the engine's model) as the run's
  checkpoint, copied to ``out_dir``. On this machine: one CPU worker. This module never imports Ray (the shell does).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from bapsql.errors import ConfigError
from bapsql.train.learner.config import LearnerConfig
from bapsql.train.learner.core import Sample, UpdateMetrics


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


def progress_line(done: int, total: int, loss: float, elapsed_s: float) -> str:
    """One progress line of an SFT run (rank 0 prints it; Ray forwards a worker's stdout to the driver's console)."""
    eta = elapsed_s / done * (total - done) if done else float("nan")
    return (f"SFT step {done}/{total} ({100 * done / total:.0f}%)  loss {loss:.3f}  elapsed {elapsed_s / 60:.1f} min"
            f"  eta {eta / 60:.1f} min")


def sft_worker(config: dict, dist: Any) -> None:
    """One data-parallel SFT worker (see `run_sft`). ``dist`` says what the worker is (``rank``, ``world``,
    ``device``) and how to wrap its model and report (`bapsql.rollout.ray_shell.train.RayTrainWorker`)."""
    import tempfile

    from bapsql.train.learner.core import Learner

    rank, world = dist.rank, dist.world
    samples, dropped = load_pairs(config["data"], config["max_length"])
    lcfg: LearnerConfig = config["learner"]
    total = steps_per_epoch(len(samples), config["effective_batch"]) * config["epochs"]
    lcfg = dataclasses.replace(lcfg, optim=dataclasses.replace(lcfg.optim, total_steps=total), device=dist.device)
    learner = Learner(lcfg, wrap=dist.wrap if world > 1 else None)
    t0 = time.perf_counter()

    every = max(1, total // 20)

    def report(step: int, m: UpdateMetrics) -> None:
        if rank == 0 and (step % every == 0 or step == total - 1):
            line = progress_line(step + 1, total, m.loss, time.perf_counter() - t0)
            print(line, flush=True)  # the worker's log
            if config.get("progress_file"):  # the driver tails it (Ray runs with log_to_driver off)
                with open(config["progress_file"], "a") as fh:
                    fh.write(line + "\n")
        if step < total - 1:
            dist.report({"step": step, "loss": m.loss, "grad_norm": m.grad_norm, "lr": m.lr,
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
            dist.report(final, checkpoint_dir=tmp)
    else:
        dist.report(final)


def run_sft(data: str | Path, learner_cfg: LearnerConfig, out_dir: str | Path, *, effective_batch: int = 128,
            max_length: int = 8192, epochs: int = 1, seed: int = 0, num_workers: int = 1, use_gpu: bool = False,
            strategy: str = "ddp", resources_per_worker: dict | None = None) -> SFTResult:
    """Run SFT with Ray Train (`bapsql.rollout.ray_shell.train.fit_data_parallel`; Ray must be initialized, or it
    starts a local instance) and copy the adapter and merged model to ``out_dir/adapter`` and ``out_dir/merged``."""
    from bapsql.rollout.ray_shell.train import fit_data_parallel

    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    progress = out / "progress.log"
    progress.write_text("")
    t0 = time.perf_counter()
    with _echo_lines(progress):
        fit = fit_data_parallel(
            sft_worker, {"data": str(Path(data).resolve()), "learner": learner_cfg, "max_length": max_length,
                         "effective_batch": effective_batch // num_workers * num_workers, "epochs": epochs,
                         "seed": seed, "progress_file": str(progress)},
            out_dir=out, copy=("adapter", "merged"), num_workers=num_workers, use_gpu=use_gpu, strategy=strategy,
            resources_per_worker=resources_per_worker, name="sft")
    m = fit.metrics
    return SFTResult(adapter_dir=out / "adapter", merged_dir=out / "merged", pairs=int(m["pairs"]),
                     dropped_too_long=int(m["dropped_too_long"]), steps=int(m["step"]) + 1,
                     losses=tuple(float(x) for x in m["losses"]), tokens_per_s=float(m["tokens_per_s"]),
                     seconds=time.perf_counter() - t0, history=fit.history)


@contextlib.contextmanager
def _echo_lines(path: Path, every_s: float = 2.0) -> Iterator[None]:
    """Print the lines appended to ``path`` to stderr while the body runs (rank 0's progress: Ray keeps worker
    output out of the driver's console). A worker on another node writes its own copy; its log keeps the lines."""
    import sys
    import threading

    stop = threading.Event()

    def pump() -> None:
        pos = 0
        while True:
            done = stop.wait(every_s)
            try:
                with open(path) as fh:
                    fh.seek(pos)
                    chunk = fh.read()
                    pos = fh.tell()
            except OSError:
                chunk = ""
            if chunk:
                sys.stderr.write(chunk)
                sys.stderr.flush()
            if done:
                return

    thread = threading.Thread(target=pump, name="sft-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=10)
