"""From rollout groups to GRPO training samples: rewards, advantages, and which tokens the loss covers.

A group is the ``G`` `bapsql.rollout.groups.Trajectory` s of one (task, budget) prompt. `group_outcome` gives the
filter its ``(key, successes, size)``; `build_samples` turns kept groups into learner `Sample` s:

- rewards from each trajectory's episode row (``correct``, ``feasible``, ``evidence_score``, ``queries``) with
  `bapsql.train.algo.reward.group_rewards` (``n`` within the group), advantages with
  `bapsql.train.algo.grpo.group_advantages` (within the group);
- every token segment of a trajectory becomes one `Sample` with the trajectory's advantage, its ``loss_mask``
  (policy tokens only) and the engine's sampling logprobs;
- ``trainable_actions`` (context-only RL) keeps the loss only on completions whose turn's action is listed: the
  k-th run of mask-1 tokens across a trajectory's segments is the k-th turn (turn rows carry the action). When the
  runs and turns do not line up (an empty completion) nobody knows which tokens are the listed actions', so the
  trajectory is dropped from the loss (no samples; its reward still counts in its group's baseline) and counted
  in ``misaligned`` (the loop logs it as ``batch/misaligned_dropped``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from bapsql.train.algo.grpo import AdvantageScale, group_advantages
from bapsql.train.algo.reward import RewardConfig, group_rewards
from bapsql.train.learner.core import Sample


@dataclass(frozen=True)
class BatchInfo:
    """What `build_samples` made: per-trajectory rewards/advantages (flattened over the groups, group order kept)
    and counts."""

    rewards: np.ndarray  # [N]
    advantages: np.ndarray  # [N]
    samples: int
    policy_tokens: int
    zero_advantage_groups: int
    misaligned: int  # context-only trajectories dropped because their turns and completions do not line up


def group_outcome(group: Sequence[Any]) -> tuple[tuple[str, str], int, int]:
    """``((task_id, level), successes, size)`` of a group of trajectories."""
    spec = group[0].spec
    return (spec.task_id, spec.level), sum(bool(t.episode["success"]) for t in group), len(group)


def group_reward_array(group: Sequence[Any], cfg: RewardConfig) -> np.ndarray:
    """Rewards ``[G]`` of one group from its episode rows."""
    ep = [t.episode for t in group]
    return group_rewards(np.array([bool(e["correct"]) for e in ep]), np.array([bool(e["feasible"]) for e in ep]),
                         np.clip(np.array([float(e["evidence_score"]) for e in ep]), 0.0, 1.0),
                         np.array([int(e["queries"]) for e in ep]), cfg)


def _runs(mask: Sequence[int]) -> list[tuple[int, int]]:
    """[start, end) of each maximal run of 1s."""
    out, start = [], None
    for i, m in enumerate(mask):
        if m and start is None:
            start = i
        elif not m and start is not None:
            out.append((start, i))
            start = None
    if start is not None:
        out.append((start, len(mask)))
    return out


def restrict_to_actions(segments: Sequence[Any], turns: Sequence[dict], allowed: Sequence[str]
                        ) -> tuple[list[tuple[int, ...]], bool]:
    """Loss masks of ``segments`` keeping only the completions of turns whose ``action`` is in ``allowed``.
    Returns (masks, aligned); when not aligned the original masks come back."""
    masks = [tuple(s.loss_mask) for s in segments]
    spans = [(k, r) for k, m in enumerate(masks) for r in _runs(m)]
    if len(spans) != len(turns):
        return masks, False
    out = [list(m) for m in masks]
    for (k, (a, b)), turn in zip(spans, turns):
        if turn.get("action") not in allowed:
            out[k][a:b] = [0] * (b - a)
    return [tuple(m) for m in out], True


def build_samples(groups: Sequence[Sequence[Any]], reward_cfg: RewardConfig, *, scale: AdvantageScale = "std",
                  trainable_actions: Sequence[str] | None = None,
                  rewards: Sequence[np.ndarray] | None = None) -> tuple[list[Sample], BatchInfo]:
    """Learner samples of the kept ``groups`` (see the module docstring). ``rewards`` (one ``[G]`` array per
    group) replaces the configured reward, e.g. for toy tasks."""
    samples: list[Sample] = []
    all_rewards, advantages = [], []
    zero_groups = misaligned = 0
    for gi, group in enumerate(groups):
        r = group_reward_array(group, reward_cfg) if rewards is None else np.asarray(rewards[gi], dtype=np.float64)
        adv = group_advantages(r, np.zeros(len(r), dtype=np.int64), scale=scale)
        zero_groups += int(np.all(adv == 0))
        all_rewards.extend(r.tolist())
        advantages.extend(adv.tolist())
        for traj, a in zip(group, adv):
            masks = [tuple(s.loss_mask) for s in traj.segments]
            if trainable_actions is not None:
                masks, aligned = restrict_to_actions(traj.segments, traj.turns, trainable_actions)
                if not aligned:
                    misaligned += 1
                    continue
            for seg, mask in zip(traj.segments, masks):
                if not any(mask):
                    continue
                if seg.logprobs is None:
                    raise ValueError(f"episode {traj.spec.episode_id}: the engine returned no sampling logprobs")
                samples.append(Sample(tuple(seg.input_ids), mask, tuple(seg.logprobs), float(a)))
    info = BatchInfo(np.array(all_rewards), np.array(advantages), len(samples),
                     sum(sum(s.loss_mask) for s in samples), zero_groups, misaligned)
    return samples, info
