"""Data-parallel training through Ray Train: `fit_data_parallel(body, config, ...)`.

``body(config, dist)`` is a plain function (e.g. `bapsql.train.recipe.sft.sft_worker`) that one worker runs; ``dist`` is
a `RayTrainWorker` giving it what Ray Train knows — ``rank``, ``world``, ``device``, ``wrap(model)`` (Ray Train's
``prepare_model``: DDP across GPUs and nodes, or FSDP with ``config["strategy"] == "fsdp"``) and
``report(metrics, checkpoint_dir=None)`` (``ray.train.report``, with a folder to hand back as the run's checkpoint).
`fit_data_parallel` runs it in a `TorchTrainer` (``ScalingConfig(num_workers, use_gpu, resources_per_worker)``),
copies the named folders of the last checkpoint to ``out_dir`` and returns the final metrics and the per-report
history.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import ray.train
import ray.train.torch
from ray.train.torch import TorchTrainer

from bapsql.errors import ConfigError


class RayTrainWorker:
    """What one Ray Train worker sees (module docstring)."""

    def __init__(self, strategy: str):
        ctx = ray.train.get_context()
        self.rank, self.world = ctx.get_world_rank(), ctx.get_world_size()
        self.device = str(ray.train.torch.get_device())
        self.strategy = strategy

    def wrap(self, model: Any) -> Any:
        kwargs = {"use_orig_params": True} if self.strategy == "fsdp" else None  # frozen base + LoRA
        return ray.train.torch.prepare_model(model, move_to_device=False, parallel_strategy=self.strategy,
                                             parallel_strategy_kwargs=kwargs)

    def report(self, metrics: dict, checkpoint_dir: str | Path | None = None) -> None:
        ckpt = ray.train.Checkpoint.from_directory(str(checkpoint_dir)) if checkpoint_dir is not None else None
        ray.train.report(metrics, checkpoint=ckpt)


def _loop(config: dict) -> None:
    body = config["body"]
    body(config["config"], RayTrainWorker(config["strategy"]))


@dataclass(frozen=True)
class FitResult:
    """The final reported metrics and every report (one dict per report of rank 0)."""

    metrics: dict
    history: tuple[dict, ...]


def fit_data_parallel(body: Callable[[dict, RayTrainWorker], None], config: dict, *, out_dir: str | Path,
                      copy: tuple[str, ...], num_workers: int = 1, use_gpu: bool = False, strategy: str = "ddp",
                      resources_per_worker: dict | None = None, name: str = "train") -> FitResult:
    """Run ``body`` on ``num_workers`` Ray Train workers (Ray must be initialized, or Ray Train starts a local
    instance); copy the folders ``copy`` of the final checkpoint into ``out_dir`` (replacing them)."""
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    trainer = TorchTrainer(
        _loop, train_loop_config={"body": body, "config": config, "strategy": strategy},
        scaling_config=ray.train.ScalingConfig(num_workers=num_workers, use_gpu=use_gpu,
                                               resources_per_worker=resources_per_worker),
        run_config=ray.train.RunConfig(name=name, storage_path=str(out / "ray_train")))
    result = trainer.fit()
    if result.error is not None:
        raise result.error
    if result.checkpoint is None:
        raise ConfigError(f"{name} finished without a checkpoint from rank 0")
    for folder in copy:
        if (out / folder).exists():
            shutil.rmtree(out / folder)
    with result.checkpoint.as_directory() as ckpt:
        for folder in copy:
            shutil.copytree(Path(ckpt) / folder, out / folder)
    history = tuple(dict(r) for r in result.metrics_dataframe.to_dict("records")) \
        if result.metrics_dataframe is not None else ()
    return FitResult(dict(result.metrics), history)
