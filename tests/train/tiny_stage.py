"""The config of a seconds-scale GRPO stage on the untrained tiny model (test helper): 2 samples per group, one
group per update, the filter off, XS only, the HF engine in-process, no trajectory logs, a memory monitor."""

from __future__ import annotations

from pathlib import Path

from bapsql.train.algo.filter import FilterConfig
from bapsql.train.config import (BudgetSection, CheckpointSection, DataSection, GRPOSection, ModelSection,
                                 MonitorSection, RolloutSection, SyncSection, TrainConfig)


def tiny_stage_config(name: str, model_dir: Path, out_dir: Path, data: DataSection, grpo: GRPOSection) -> TrainConfig:
    """A `TrainConfig` named ``name`` training ``model_dir`` on ``data`` with ``grpo``, writing under ``out_dir``;
    checkpoints every 2 updates, 5 kept."""
    return TrainConfig(
        name=name, model=ModelSection(base=str(model_dir), dtype="float32", device="cpu", threads=1),
        out_dir=str(out_dir), data=data, grpo=grpo,
        filter=FilterConfig(group_size=2, min_success=0, max_success=2, groups_per_update=1, max_rounds=1,
                            enabled=False),
        budgets=BudgetSection(levels=("XS",)),
        rollout=RolloutSection(engine={"kind": "hf", "dtype": "float32", "device": "cpu", "num_threads": 1},
                               use_ray=False, env_workers=1, write_trajectories=False),
        sync=SyncSection(tolerance=1e-3), checkpoint=CheckpointSection(every=2, keep=5),
        monitor=MonitorSection(kind="memory"))
