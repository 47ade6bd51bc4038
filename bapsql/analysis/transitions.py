"""One-shot transition analysis (paper Figure 3): where a method's successes come from relative to a reference.

The reference's Budgeted Success over the ladder partitions tasks into
- ``always_correct``: correct at every level;
- ``budget_sensitive``: correct at the loosest level (L) but not at some tighter one;
- ``persistent``: wrong at L ("persistent under L").

Per level, for another method: ``rescued`` = budget-sensitive tasks the reference got wrong and the method got right;
``regressed`` = tasks the reference got right and the method got wrong; ``additional`` = persistent tasks the
reference got wrong and the method got right. Hence ``net = rescued + additional − regressed`` = method successes −
reference successes. The analysis runs per seed (a task's success within a seed is the majority over its samples;
a single-seed reference is compared with every seed of the method) and reports the median seed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pandas as pd

from bapsql.analysis.metrics import LADDER

GROUPS: tuple[str, ...] = ("always_correct", "budget_sensitive", "persistent")


def partition_tasks(reference: np.ndarray) -> np.ndarray:
    """Group code per task from the reference's success ``(T, L) bool`` (levels tight → loose, last is L):
    0 always-correct, 1 budget-sensitive, 2 persistent → int64 ``(T,)``."""
    ref = np.asarray(reference, dtype=bool)
    codes = np.full(ref.shape[0], 2, dtype=np.int64)
    codes[ref[:, -1]] = 1
    codes[ref.all(axis=1)] = 0
    return codes


def transition_counts(reference: np.ndarray, other: np.ndarray) -> dict[str, np.ndarray]:
    """Per-level counts for ``(T, L) bool`` successes of the reference and the other method → ``(L,)`` int arrays
    ``rescued``, ``regressed``, ``additional`` and ``net``."""
    ref = np.asarray(reference, dtype=bool)
    oth = np.asarray(other, dtype=bool)
    groups = partition_tasks(ref)[:, None]
    gained = ~ref & oth
    rescued = (gained & (groups == 1)).sum(axis=0)
    additional = (gained & (groups == 2)).sum(axis=0)
    regressed = (ref & ~oth).sum(axis=0)
    net = rescued + additional - regressed
    return {"rescued": rescued, "regressed": regressed, "additional": additional, "net": net}


@dataclass(frozen=True)
class TransitionRow:
    budget: str
    rescued: int
    regressed: int
    additional: int
    net: int


@dataclass(frozen=True)
class TransitionAnalysis:
    """Transitions of ``method`` against ``reference`` within one seed (``reference_seed`` may differ when the
    reference has a single seed). ``tasks`` is how many tasks both have at every ladder level."""

    method: str
    reference: str
    seed: int
    reference_seed: int
    tasks: int
    always_correct: int
    budget_sensitive: int
    persistent: int
    rows: tuple[TransitionRow, ...]


def _success_matrix(episodes: pd.DataFrame, method: str, seed: int) -> pd.DataFrame:
    sub = episodes[(episodes["method"] == method) & (episodes["seed"] == seed)]
    wide = sub.assign(_s=sub["success"].astype(np.float64)).pivot_table(
        index="task_id", columns="budget", values="_s", aggfunc="mean"
    )
    return wide.reindex(columns=list(LADDER))


def transition_analysis(episodes: pd.DataFrame, method: str, reference: str) -> tuple[TransitionAnalysis, ...]:
    """One `TransitionAnalysis` per seed of ``method`` (empty when a ladder level or the reference is missing)."""
    ref_seeds = sorted(int(s) for s in episodes.loc[episodes["method"] == reference, "seed"].unique())
    seeds = sorted(int(s) for s in episodes.loc[episodes["method"] == method, "seed"].unique())
    out = []
    for seed in seeds:
        ref_seed = seed if seed in ref_seeds else (ref_seeds[0] if len(ref_seeds) == 1 else None)
        if ref_seed is None:
            continue
        ref = _success_matrix(episodes, reference, ref_seed)
        oth = _success_matrix(episodes, method, seed)
        both = ref.add_suffix("_r").join(oth, how="inner").dropna()
        if both.empty:
            continue
        ref_ok = both[[f"{lv}_r" for lv in LADDER]].to_numpy() > 0.5
        oth_ok = both[list(LADDER)].to_numpy() > 0.5
        groups = np.bincount(partition_tasks(ref_ok), minlength=3)
        counts = transition_counts(ref_ok, oth_ok)
        rows = tuple(
            TransitionRow(lv, *(int(counts[k][i]) for k in ("rescued", "regressed", "additional", "net")))
            for i, lv in enumerate(LADDER)
        )
        out.append(TransitionAnalysis(method, reference, seed, ref_seed, len(both), *map(int, groups), rows))
    return tuple(out)


def median_seed(analyses: Sequence[TransitionAnalysis], budget: str = "XS") -> TransitionAnalysis:
    """The analysis whose net at ``budget`` is the (lower) median across seeds."""
    if not analyses:
        raise ValueError("no transition analyses to choose from")
    i = LADDER.index(budget)
    ranked = sorted(analyses, key=lambda a: (a.rows[i].net, a.seed))
    return ranked[(len(ranked) - 1) // 2]
