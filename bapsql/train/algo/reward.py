"""Trajectory rewards for GRPO (DESIGN §5, paper "RL objective"). Pure numpy, no torch.

For one rollout group of ``G`` trajectories of the same (task, budget) prompt::

    R_i = 1[correct_i ∧ feasible_i] · (1 + w·e_i) · r_tool(m_i, n)

with ``e_i ∈ [0, 1]`` the deterministic evidence score, ``m_i`` the trajectory's executed query count, ``w = 0.4``
the evidence weight and ``n`` the smallest query count among the group's *successful* (correct ∧ feasible)
trajectories. The tool factor is OTC-PO's (Wang et al. 2025), as in its public GRPO reward implementation:

- ``n > 0``: ``f(m, n) = 2mn/(m+n)`` and ``r_tool = sin(f·π/(2n))`` — 1 at ``m = n``, falling towards 0 as
  ``m → ∞`` (successful trajectories always have ``m ≥ n``; for ``m < n`` the formula is still defined and < 1);
- ``n = 0`` (some successful trajectory executed no query): ``r_tool = 1`` if ``m = 0`` else
  ``cos(m·π/(2m + c))``. ``c`` is OTC-PO's smoothing constant; its reference implementation uses ``c = 1``
  (so one extra query scores cos(π/3) = 0.5, and the factor stays in (0, 1) for every m because m/(2m+c) < 1/2).

When no trajectory of the group succeeds, every reward is 0 and ``n`` is irrelevant (reported as -1).

Variants (``RewardVariant``):

- ``full``: the formula above (BAP-SQL);
- ``no_efficiency``: ``r_tool = 1`` (same evidence bonus, same gate) — the no-efficiency-shaping ablation;
- ``correctness``: ``R = 1[correct ∧ feasible]`` — matched SQL-RL (no evidence bonus, no tool factor).

Shapes: every array argument is ``[G]`` (one group) and the result is ``[G]`` float64. `group_rewards` handles
one group; `batch_rewards` applies it to many groups given a ``[N]`` group index.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

from bapsql.errors import ConfigError

RewardVariant = Literal["full", "no_efficiency", "correctness"]
REWARD_VARIANTS: tuple[str, ...] = ("full", "no_efficiency", "correctness")
OTC_C = 1.0  # OTC-PO's smoothing constant of the n = 0 cosine branch (its reference implementation's default)


@dataclass(frozen=True)
class RewardConfig:
    """Which reward to use. ``evidence_weight`` is the 0.4 of ``1 + 0.4e``; ``otc_c`` the cosine branch's c."""

    variant: RewardVariant = "full"
    evidence_weight: float = 0.4
    otc_c: float = OTC_C

    def __post_init__(self) -> None:
        if self.variant not in REWARD_VARIANTS:
            raise ConfigError(f"reward.variant: {self.variant!r} is not one of {list(REWARD_VARIANTS)}")
        if self.evidence_weight < 0:
            raise ConfigError(f"reward.evidence_weight: must be >= 0, got {self.evidence_weight}")
        if self.otc_c <= 0:
            raise ConfigError(f"reward.otc_c: must be > 0, got {self.otc_c}")


def tool_factor(m: np.ndarray, n: int, c: float = OTC_C) -> np.ndarray:
    """OTC-PO's ``r_tool(m, n)`` for query counts ``m`` ``[G]`` (ints >= 0) and the group's ``n`` (>= 0)."""
    m = np.asarray(m, dtype=np.float64)
    if np.any(m < 0) or n < 0:
        raise ValueError("query counts must be non-negative")
    if n == 0:
        return np.where(m == 0, 1.0, np.cos(m * math.pi / (2.0 * m + c)))
    f = 2.0 * m * n / (m + n)
    return np.sin(f * math.pi / (2.0 * n))


def min_success_queries(success: np.ndarray, queries: np.ndarray) -> int:
    """``n``: the smallest query count among successful trajectories, or -1 when none succeeded. ``[G]`` → int."""
    success = np.asarray(success, dtype=bool)
    if not success.any():
        return -1
    return int(np.asarray(queries)[success].min())


def group_rewards(correct: np.ndarray, feasible: np.ndarray, evidence: np.ndarray, queries: np.ndarray,
                  cfg: RewardConfig = RewardConfig()) -> np.ndarray:
    """Rewards ``[G]`` of one group from per-trajectory ``correct``, ``feasible`` (bool ``[G]``), ``evidence``
    (float ``[G]`` in [0, 1]) and ``queries`` (int ``[G]``), under ``cfg.variant`` (see the module docstring)."""
    correct = np.asarray(correct, dtype=bool)
    feasible = np.asarray(feasible, dtype=bool)
    evidence = np.asarray(evidence, dtype=np.float64)
    queries = np.asarray(queries, dtype=np.int64)
    if not (correct.shape == feasible.shape == evidence.shape == queries.shape) or correct.ndim != 1:
        raise ValueError(f"group arrays must all be [G]; got {correct.shape}, {feasible.shape}, "
                         f"{evidence.shape}, {queries.shape}")
    if np.any((evidence < 0) | (evidence > 1)):
        raise ValueError("evidence scores must lie in [0, 1]")
    gate = (correct & feasible).astype(np.float64)
    if cfg.variant == "correctness":
        return gate
    bonus = 1.0 + cfg.evidence_weight * evidence
    if cfg.variant == "no_efficiency":
        return gate * bonus
    n = min_success_queries(gate > 0, queries)
    if n < 0:
        return np.zeros_like(gate)
    return gate * bonus * tool_factor(queries, n, cfg.otc_c)


def batch_rewards(group: np.ndarray, correct: np.ndarray, feasible: np.ndarray, evidence: np.ndarray,
                  queries: np.ndarray, cfg: RewardConfig = RewardConfig()) -> np.ndarray:
    """Rewards ``[N]`` of many trajectories; ``group`` ``[N]`` (any hashable ids) says which group each belongs
    to, and ``n`` is computed within each group."""
    group = np.asarray(group)
    out = np.zeros(len(group), dtype=np.float64)
    arrays = [np.asarray(a) for a in (correct, feasible, evidence, queries)]
    for g in np.unique(group):
        idx = np.flatnonzero(group == g)
        out[idx] = group_rewards(*(a[idx] for a in arrays), cfg=cfg)
    return out
