"""Rollout groups: which episodes a sweep or a training update plays, and what comes back from each.

A *group* is G trajectories of one method on one (task, budget) prompt with one group seed (GRPO compares the
trajectories of a group; DESIGN §5). `GroupSampler` expands prompts into `EpisodeSpec` s:

- ``episode_id`` is `bapsql.logs.writer.episode_id(run, method, level, seed, task_id, sample)`: deterministic, so a
  resumed sweep skips what is on disk, and with one sample per group the ids equal the in-process runner's;
- every trajectory gets its own ``sample_seed`` derived from (group seed, task, level, sample) — sampling seeds of
  a model policy, tie-breaking of a scripted one — the same on every machine and in every visiting order (sample 0
  plays the group seed itself);
- ``group_id`` names (task, level, group seed, policy version); ``policy_version`` is recorded with each episode.

Specs are ordered database by database (`shard_of` maps a database to an env worker, so each worker keeps its
SQLite handles and catalogs warm). A finished episode comes back as a `Trajectory`: its episodes-table row, its
turns-table rows and, for model policies, the token-in/token-out segments training needs.
"""

from __future__ import annotations

import hashlib
import zlib
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from bapsql.env.conditions import split_method
from bapsql.errors import ConfigError
from bapsql.logs.writer import episode_id
from bapsql.types import Task

DEFAULT_SAMPLES_PER_GROUP = 8


def shard_of(db_id: str, n_workers: int) -> int:
    """The env worker (0 ≤ index < n_workers) that hosts every episode on database ``db_id`` (stable crc32)."""
    if n_workers < 1:
        raise ConfigError(f"n_workers must be at least 1, got {n_workers}")
    return zlib.crc32(db_id.encode("utf-8")) % n_workers


def group_id(task_id: str, level: str, seed: int, policy_version: int = 0) -> str:
    """The id of the group of (task, budget level, group seed, policy version)."""
    return f"{task_id}@{level}:s{int(seed)}:v{int(policy_version)}"


def sample_seed(seed: int, task_id: str, level: str, sample: int) -> int:
    """A 31-bit seed of one trajectory, fixed by (group seed, task, level, sample index). Sample 0 plays the group
    seed itself, so a one-sample group replays exactly what the in-process runner plays for that seed."""
    if int(sample) == 0:
        return int(seed) & 0x7FFFFFFF
    key = f"{int(seed)}|{task_id}|{level}|{int(sample)}".encode("utf-8")
    return int.from_bytes(hashlib.blake2b(key, digest_size=4).digest(), "little") & 0x7FFFFFFF


@dataclass(frozen=True)
class EpisodeSpec:
    """One episode to play. ``seed`` is the group seed (the sweep's seed); ``sample_seed`` the trajectory's own."""

    episode_id: str
    run: str
    method: str
    level: str
    seed: int
    sample: int
    sample_seed: int
    task: Task
    group_id: str
    policy_version: int = 0

    @property
    def task_id(self) -> str:
        return self.task.task_id

    @property
    def db_id(self) -> str:
        return self.task.db_id


@dataclass(frozen=True)
class SegmentTokens:
    """One token sequence of a model episode (`bapsql.policies.chat.Segment`, frozen). Parallel, length n:
    ``input_ids``; ``loss_mask`` (1 exactly on sampled policy tokens); ``logprobs`` (sampling logprob on policy
    tokens, 0.0 elsewhere; None when the engine gave none)."""

    input_ids: tuple[int, ...]
    loss_mask: tuple[int, ...]
    logprobs: tuple[float, ...] | None

    def __post_init__(self) -> None:
        n = len(self.input_ids)
        if len(self.loss_mask) != n or (self.logprobs is not None and len(self.logprobs) != n):
            raise ValueError("input_ids, loss_mask and logprobs must have the same length")


@dataclass(frozen=True)
class Trajectory:
    """A finished episode: ``episode`` / ``turns`` are rows of the episodes / turns log tables; ``segments`` the
    token sequences (empty for scripted policies); ``worker`` the env worker that played it."""

    spec: EpisodeSpec
    episode: dict
    turns: tuple[dict, ...]
    segments: tuple[SegmentTokens, ...] = field(default_factory=tuple)
    worker: int = -1

    @property
    def episode_id(self) -> str:
        return self.spec.episode_id

    @property
    def success(self) -> bool:
        return bool(self.episode["success"])


@dataclass(frozen=True)
class Prompt:
    """One group to play: a task, a budget level and the group seed."""

    task: Task
    level: str
    seed: int


class GroupSampler:
    """Expands prompts into episode specs, ``samples_per_group`` trajectories each (default 8)."""

    def __init__(self, run: str, *, samples_per_group: int = DEFAULT_SAMPLES_PER_GROUP):
        if not run:
            raise ConfigError("run name must be non-empty")
        if samples_per_group < 1:
            raise ConfigError(f"samples_per_group must be at least 1, got {samples_per_group}")
        self.run = run
        self.samples_per_group = samples_per_group

    def group(self, method: str, prompt: Prompt, *, policy_version: int = 0) -> tuple[EpisodeSpec, ...]:
        """The G specs of one group (sample 0 … G-1)."""
        t, level, seed = prompt.task, prompt.level, int(prompt.seed)
        gid = group_id(t.task_id, level, seed, policy_version)
        return tuple(
            EpisodeSpec(episode_id=episode_id(self.run, method, level, seed, t.task_id, k), run=self.run,
                        method=method, level=level, seed=seed, sample=k,
                        sample_seed=sample_seed(seed, t.task_id, level, k), task=t, group_id=gid,
                        policy_version=policy_version)
            for k in range(self.samples_per_group))

    def groups(self, method: str, prompts: Iterable[Prompt], *, policy_version: int = 0) -> list[EpisodeSpec]:
        """Specs of several groups, in prompt order (a training update)."""
        return [s for p in prompts for s in self.group(method, p, policy_version=policy_version)]

    def sweep(self, methods: Sequence[str], tasks: Sequence[Task], levels: Sequence[str], seeds: Sequence[int], *,
              policy_version: int = 0) -> list[EpisodeSpec]:
        """Every (method, level, seed, task) group of an evaluation sweep, ordered database by database (then
        method, level, seed, task) so consecutive specs share warm database handles."""
        if len(set(methods)) != len(methods):
            raise ConfigError(f"methods must be distinct, got {list(methods)}")
        ordered = sorted(tasks, key=lambda t: (t.db_id, t.task_id))
        return [s for t in ordered for m in methods for lv in levels for seed in seeds
                for s in self.group(m, Prompt(t, lv, seed), policy_version=policy_version)]


def episode_rows(spec: EpisodeSpec, summary: Any, turn_records: Sequence[Any]) -> tuple[dict, tuple[dict, ...]]:
    """The episodes-table row and turns-table rows of a finished episode (its env's `EpisodeSummary` and
    `TurnRecord` s), labelled by ``spec``: the one place a played episode becomes log rows (the in-process runner
    and the env workers both call it)."""
    ep = summary.to_row()  # a fresh dict: completed in place (one dict per row, not a copy per merge)
    cond = split_method(spec.method)[1]
    ep.update({"run": spec.run, "episode_id": spec.episode_id, "sample": spec.sample, "group_id": spec.group_id,
               "method": spec.method, "condition": cond, "seed": spec.seed, "policy_version": spec.policy_version})
    meta = {"run": spec.run, "episode_id": spec.episode_id, "method": spec.method, "condition": cond,
            "budget": spec.level, "seed": spec.seed, "task_id": spec.task_id, "db_id": spec.db_id}
    turns = []
    for rec in turn_records:
        row = rec.to_row()
        row.update(meta)
        turns.append(row)
    return ep, tuple(turns)
