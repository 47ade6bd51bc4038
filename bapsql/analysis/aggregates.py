"""A success gain split by the aggregate a question asks for (issue 30: how much of "adaptive post-hoc beats
dashboard" comes from COUNT questions, AVG, MIN/MAX, the mode, list questions, the rest).

`gain_by_aggregate(episodes, kinds, method, reference)`: ``kinds`` maps a task id to its class
(`bapsql.data.aggregates.aggregate_kind` of the task's gold SQL and answer kind: ``count``, ``min/max``, ``avg``,
``mode``, ``list``, ``other``); for each class, Budgeted Success (%) of both methods on its episodes and its
*contribution* to the overall gain in percentage points, ``100 · (successes_m,k / N_m − successes_r,k / N_r)`` with
``N`` each method's episodes in all, so the contributions sum exactly to the overall gain (method − reference).
Episodes whose task has no class count as ``other``. Pure (pandas in, dataclasses out). `gain_table` renders the
rows as Markdown. `task_kinds(tasks)` builds ``kinds`` from loaded tasks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

import pandas as pd

from bapsql.data.aggregates import AGGREGATE_KINDS, aggregate_kind


@dataclass(frozen=True)
class AggregateGain:
    """One aggregate class (``kind``; ``"all"`` for the total row) of a method − reference comparison."""

    kind: str
    episodes: int  # the method's episodes of this class
    reference_episodes: int
    success: float  # percent, NaN without episodes
    reference_success: float
    gain_pp: float  # success − reference success within the class
    contribution_pp: float  # its share of the overall gain (the contributions sum to the "all" row's gain)


def task_kinds(tasks: Iterable) -> dict[str, str]:
    """Task id → aggregate class, from `bapsql.types.Task` s (gold SQL and typed gold kind)."""
    return {t.task_id: aggregate_kind(t.gold_sql, t.gold.kind if t.gold is not None else None) for t in tasks}


def _pct(num: float, den: int) -> float:
    return 100.0 * num / den if den else math.nan


def gain_by_aggregate(episodes: pd.DataFrame, kinds: Mapping[str, str], method: str, reference: str, *,
                      budgets: Sequence[str] | None = None) -> tuple[AggregateGain, ...]:
    """Rows per aggregate class (in `AGGREGATE_KINDS` order, classes neither method has left out) and a last
    ``"all"`` row, over the episodes at ``budgets`` (None: every budget) — see the module docstring."""
    ep = episodes if budgets is None else episodes[episodes["budget"].isin(list(budgets))]
    ep = ep.assign(_kind=ep["task_id"].map(lambda t: kinds.get(str(t), "other")),
                   _s=ep["success"].astype(float))
    mine, ref = ep[ep["method"] == method], ep[ep["method"] == reference]
    n_m, n_r = len(mine), len(ref)
    rows = []
    for kind in AGGREGATE_KINDS:
        a, b = mine[mine["_kind"] == kind], ref[ref["_kind"] == kind]
        if a.empty and b.empty:
            continue
        sa, sb = float(a["_s"].sum()), float(b["_s"].sum())
        rows.append(AggregateGain(kind, len(a), len(b), _pct(sa, len(a)), _pct(sb, len(b)),
                                  _pct(sa, len(a)) - _pct(sb, len(b)), _pct(sa, n_m) - _pct(sb, n_r)))
    sa, sb = float(mine["_s"].sum()), float(ref["_s"].sum())
    total = _pct(sa, n_m) - _pct(sb, n_r)
    rows.append(AggregateGain("all", n_m, n_r, _pct(sa, n_m), _pct(sb, n_r), total, total))
    return tuple(rows)


def gain_table(rows: Sequence[AggregateGain], method: str, reference: str) -> str:
    """The rows as a Markdown table."""
    def f(x: float) -> str:
        return "—" if not math.isfinite(x) else f"{x:+.1f}" if x else "0.0"

    lines = [f"| aggregate | episodes | {method} (%) | {reference} (%) | gain (pp) | contribution (pp) |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        s = "—" if not math.isfinite(r.success) else f"{r.success:.1f}"
        rs = "—" if not math.isfinite(r.reference_success) else f"{r.reference_success:.1f}"
        lines.append(f"| {r.kind} | {r.episodes} | {s} | {rs} | {f(r.gain_pp)} | {f(r.contribution_pp)} |")
    return "\n".join(lines)
