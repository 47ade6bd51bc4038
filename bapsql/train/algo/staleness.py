"""Policy versions of rollouts and the staleness gate of pipelined GRPO (DESIGN §5 "Pipelining"). Pure.

Every trajectory carries the policy version that sampled it (``EpisodeSpec.policy_version``: the adapter after that
many updates). A group's version is the oldest of its trajectories'. The learner at version ``u`` (it has taken
``u`` updates) trains a group of version ``v`` only if its *staleness* ``u − v`` is at most ``max_staleness``
(``k``); older groups are dropped, counted, never trained.

- `group_version(group)`: the version of a group of trajectories;
- `staleness_gate(versions, learner_version, k)`: ``[N]`` bool, which groups may be trained;
- `staleness_histogram(staleness, k)`: ``[k + 1]`` counts of trained groups by staleness 0…k;
- `staleness_metrics(...)`: the monitor's ``staleness/*`` keys of one update;
- `PendingBatch`: the rollouts of one future update, generated and judged ahead of time (the pipelined loop keeps up
  to ``k`` of them and saves them in checkpoints, `dumps_pending` / `loads_pending`).
"""

from __future__ import annotations

import io
import pickle
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

PENDING_FORMAT = 1
PENDING_FILE = "pending.pkl"  # the pending batches in a checkpoint folder
# Where the classes a checkpoint's pending batches name moved when bapsql/train/ was split into sub-packages: a
# pipelined run checkpointed before the split still resumes.
MOVED_MODULES = {"bapsql.train.staleness": "bapsql.train.algo.staleness",
                 "bapsql.train.filter": "bapsql.train.algo.filter",
                 "bapsql.train.sampler": "bapsql.train.algo.sampler",
                 "bapsql.train.batch": "bapsql.train.loop.batch",
                 "bapsql.train.learner": "bapsql.train.learner.core"}


def group_version(group: Sequence[Any]) -> int:
    """The policy version of a group: the oldest ``spec.policy_version`` of its trajectories."""
    if not group:
        raise ValueError("an empty group has no policy version")
    return min(int(t.spec.policy_version) for t in group)


def staleness_gate(versions: np.ndarray, learner_version: int, max_staleness: int) -> np.ndarray:
    """``[N]`` bool: group ``i`` (sampled by version ``versions[i]``) may be trained by the learner at
    ``learner_version``, i.e. ``0 <= learner_version − versions[i] <= max_staleness``. A version newer than the
    learner's is a bookkeeping error and raises."""
    v = np.asarray(versions, dtype=np.int64)
    if v.ndim != 1:
        raise ValueError(f"versions must be [N], got shape {v.shape}")
    if max_staleness < 0:
        raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
    lag = int(learner_version) - v
    if np.any(lag < 0):
        raise ValueError(f"groups of versions {sorted(set(v[lag < 0].tolist()))} are newer than the learner "
                         f"(version {learner_version})")
    return lag <= max_staleness


def staleness_histogram(staleness: np.ndarray, max_staleness: int) -> np.ndarray:
    """``[max_staleness + 1]`` counts of ``staleness`` values ``[N]`` (each in 0…max_staleness)."""
    s = np.asarray(staleness, dtype=np.int64)
    if s.size and (s.min() < 0 or s.max() > max_staleness):
        raise ValueError(f"staleness values must lie in [0, {max_staleness}], got {s.min()}..{s.max()}")
    return np.bincount(s, minlength=max_staleness + 1)[: max_staleness + 1]


def staleness_metrics(versions: np.ndarray, learner_version: int, max_staleness: int) -> dict[str, float]:
    """The ``staleness/*`` metrics of one update over its groups' ``versions`` ``[N]``: the histogram of the trained
    groups' staleness (``staleness/groups_0`` … ``staleness/groups_k``), their mean and max, and how many groups the
    gate dropped (``staleness/dropped_groups``)."""
    v = np.asarray(versions, dtype=np.int64)
    keep = staleness_gate(v, learner_version, max_staleness)
    lag = learner_version - v[keep]
    hist = staleness_histogram(lag, max_staleness)
    out = {f"staleness/groups_{i}": float(c) for i, c in enumerate(hist)}
    out["staleness/mean"] = float(lag.mean()) if lag.size else 0.0
    out["staleness/max"] = float(lag.max()) if lag.size else 0.0
    out["staleness/dropped_groups"] = float((~keep).sum())
    return out


@dataclass(frozen=True)
class PendingBatch:
    """The rollouts of update ``target`` (0-based), sampled with policy ``version`` and already judged by the
    difficulty filter: ``fill`` is its `bapsql.train.algo.filter.FillResult` (the kept groups), ``drawn`` every group
    drawn for it (success and reward metrics), ``rollout_s`` / ``generated`` what producing it cost."""

    target: int
    version: int
    fill: Any
    drawn: tuple
    rollout_s: float
    generated: int


def dumps_pending(batches: Sequence[PendingBatch]) -> bytes:
    """The pending batches as checkpoint bytes (pickle: trajectories, token ids and engine logprobs, exactly)."""
    return pickle.dumps({"format": PENDING_FORMAT, "batches": list(batches)}, protocol=pickle.HIGHEST_PROTOCOL)


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        return super().find_class(MOVED_MODULES.get(module, module), name)


def loads_pending(data: bytes) -> list[PendingBatch]:
    """Inverse of `dumps_pending` (only checkpoints this code wrote: pickle runs code, never load foreign files),
    also of the bytes written before the training package's split (`MOVED_MODULES`)."""
    raw = _Unpickler(io.BytesIO(data)).load()
    if not isinstance(raw, dict) or raw.get("format") != PENDING_FORMAT:
        raise ValueError(f"pending rollouts of an unknown format {raw.get('format') if isinstance(raw, dict) else '?'}")
    return list(raw["batches"])
