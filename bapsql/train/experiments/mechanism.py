"""Mechanism diagnostics of Table 2 (issue 34): does the budget mechanism have anything to act on?

BAP-SQL RL differs from matched SQL-RL only through the full reward (`bapsql.train.algo.reward`): within a group,
``R_i = 1[success_i] · (1 + w·e_i) · r_tool(m_i, n)``. GRPO normalises rewards within the group, so a group whose
successes all earn the same full reward gets the same advantages as under the correctness reward. The full reward
acts only in groups whose successes differ in executed query count ``m`` or evidence score ``e``.

`group_spread` measures that on GRPO training rollouts (the episodes table of ``rl_full/rollouts`` or
``rl_sql/rollouts``: one row per trajectory, with ``group_id``, ``budget``, ``correct``, ``feasible``, ``success``,
``queries`` and ``evidence_score``), per budget level:

- ``groups``: groups drawn; ``mixed``: groups with at least one success and one failure (the ones the difficulty
  filter can keep); ``multi``: groups with at least two successes;
- ``queries_differ`` / ``evidence_differ``: of ``multi``, the share (%) whose successes differ in query count /
  evidence score;
- ``full_differs``: of ``multi``, the share whose successes' full rewards (recomputed from the logged fields with
  `group_rewards`, whatever reward the run trained on) are not all equal — where the two RL rows' updates can differ;
- ``queries_sd`` / ``evidence_sd``: the mean within-group standard deviation (population) over all trajectories of
  the ``mixed`` groups.

The policy-visible warning share and the rewrite share among warned episodes come from the evaluation sweep
(`bapsql.analysis.diagnostics.warning_flow`, in the analysis summary).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from bapsql.analysis.metrics import level_key
from bapsql.train.algo.reward import RewardConfig, group_rewards

COLUMNS: tuple[str, ...] = ("group_id", "budget", "method", "correct", "feasible", "success", "queries",
                            "evidence_score")


@dataclass(frozen=True)
class GroupSpread:
    """The spread inside GRPO groups at one budget level (module docstring); percentages are NaN when their
    denominator is 0."""

    budget: str
    groups: int
    mixed: int
    multi: int
    queries_differ_pct: float
    evidence_differ_pct: float
    full_differs_pct: float
    queries_sd: float
    evidence_sd: float


def _pct(k: int, n: int) -> float:
    return 100.0 * k / n if n else math.nan


def _differ(values: np.ndarray) -> bool:
    return values.size > 1 and not np.allclose(values, values[0])


def group_spread(episodes: pd.DataFrame, *, reward: RewardConfig = RewardConfig(variant="full")) -> tuple[
        GroupSpread, ...]:
    """`GroupSpread` per budget level of the trajectories in ``episodes`` (columns `COLUMNS`; ``method`` is used only
    to keep validation rollouts, logged as ``<method>.val@...``, out). Levels in ladder order."""
    missing = sorted(set(COLUMNS) - set(episodes.columns))
    if missing:
        raise ValueError(f"episodes lack column(s) {missing}; expected GRPO rollout episodes with {list(COLUMNS)}")
    ep = episodes[~episodes["method"].astype(str).str.contains(r"\.val@", regex=True)]
    out = []
    for budget, by_level in ep.groupby("budget", sort=False):
        n = mixed = multi = q_diff = e_diff = r_diff = 0
        q_sd: list[float] = []
        e_sd: list[float] = []
        for _, g in by_level.groupby("group_id", sort=False):
            n += 1
            ok = g["success"].to_numpy(dtype=bool)
            q = g["queries"].to_numpy(dtype=np.int64)
            e = g["evidence_score"].to_numpy(dtype=np.float64)
            if 0 < ok.sum() < ok.size:
                mixed += 1
                q_sd.append(float(q.std()))
                e_sd.append(float(e.std()))
            if ok.sum() < 2:
                continue
            multi += 1
            q_diff += _differ(q[ok])
            e_diff += _differ(e[ok])
            full = group_rewards(g["correct"].to_numpy(dtype=bool), g["feasible"].to_numpy(dtype=bool), e, q, reward)
            r_diff += _differ(full[ok])
        out.append(GroupSpread(str(budget), n, mixed, multi, _pct(q_diff, multi), _pct(e_diff, multi),
                               _pct(r_diff, multi), float(np.mean(q_sd)) if q_sd else math.nan,
                               float(np.mean(e_sd)) if e_sd else math.nan))
    return tuple(sorted(out, key=lambda s: level_key(s.budget)))


def read_group_spread(rollouts_dir, *, updates: int | None = None) -> tuple[GroupSpread, ...]:
    """`group_spread` of the GRPO rollout logs in ``rollouts_dir`` (``<run>/<stage>/rollouts``); () when none.
    ``updates``: keep the rollouts of the stage's first ``updates`` updates only (``policy_version < updates``). A
    stage stopped during an update leaves that update's rollouts on disk, sampled for an update it never made; a
    stage that then ends earlier (or redoes the update) must not count them."""
    from pathlib import Path

    from bapsql.logs.reader import part_files, read_episodes

    if not Path(rollouts_dir).is_dir() or not part_files(rollouts_dir, "episodes"):
        return ()
    episodes = read_episodes(rollouts_dir, columns=COLUMNS + ("policy_version",))
    if updates is not None:
        episodes = episodes[episodes["policy_version"] < updates]
    return group_spread(episodes) if len(episodes) else ()
