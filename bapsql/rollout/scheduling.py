"""What the rollout driver is configured with, what it returns, and how it shards episodes to env workers.

`DriverConfig` (scheduling knobs), `RolloutResult` (what one `bapsql.rollout.driver.Driver.run` did) and
`assign_shards` (database → env worker, balanced) are plain; the driver imports them (and re-exports them).
"""

from __future__ import annotations

import zlib
from collections import Counter
from dataclasses import dataclass, field
from typing import Sequence

from bapsql.errors import ConfigError
from bapsql.rollout.groups import EpisodeSpec, Trajectory
from bapsql.rollout.stats import CellStats


@dataclass(frozen=True)
class DriverConfig:
    """Scheduling knobs. ``in_flight``: episodes in flight at once; ``scripted_batch``: scripted episodes per worker
    call; ``max_reruns``: reruns of one episode after actor deaths before giving up; ``poll_s``: longest wait for
    one completion; ``log_every_s``: monitor cadence."""

    in_flight: int = 64
    scripted_batch: int = 4
    max_reruns: int = 3
    poll_s: float = 1.0
    log_every_s: float = 10.0

    def __post_init__(self) -> None:
        for name in ("in_flight", "scripted_batch"):
            if getattr(self, name) < 1:
                raise ConfigError(f"driver.{name}: must be at least 1, got {getattr(self, name)}")
        if self.max_reruns < 0:
            raise ConfigError(f"driver.max_reruns: must be >= 0, got {self.max_reruns}")


@dataclass(frozen=True)
class RolloutResult:
    """What one `Driver.run` did. ``trajectories`` only when collected; ``restarts`` counts actor restarts seen."""

    episodes_run: int
    episodes_skipped: int
    reruns: int
    restarts: dict[str, int]
    generated_tokens: int
    engine_calls: int
    wall_s: float
    cells: tuple[CellStats, ...]
    trajectories: tuple[Trajectory, ...] = field(default_factory=tuple)

    @property
    def episodes_per_s(self) -> float:
        return self.episodes_run / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def breaches(self) -> int:
        return sum(c.breaches for c in self.cells)


def assign_shards(specs: Sequence[EpisodeSpec], n_workers: int) -> dict[str, int]:
    """Database → env worker, balancing episode counts (largest database first onto the least loaded worker;
    deterministic). Databases not in ``specs`` fall back to `shard_of`."""
    counts = Counter(s.db_id for s in specs)
    load = [0] * n_workers
    out = {}
    for db, n in sorted(counts.items(), key=lambda kv: (-kv[1], zlib.crc32(kv[0].encode()), kv[0])):
        w = min(range(n_workers), key=lambda i: (load[i], i))
        out[db] = w
        load[w] += n
    return out
