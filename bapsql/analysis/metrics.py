"""Descriptive metrics per method × budget: Budgeted Success, Frontier Score, Official EX and cost.

Every episode row counts once (seeds and samples pool). Success and Official EX are percentages; cost columns are
means per episode. `cell_metrics(episodes, by=...)` also breaks cells down per database or per seed.
The Frontier Score is the trapezoidal mean over the four equally spaced ladder levels,
``(XS/2 + S + M + L/2) / 3`` in percentage points; it exists only when all four levels are present.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Mapping

import numpy as np
import pandas as pd

from bapsql.analysis.statistics import bootstrap_counts, percentile_interval, ratio, resampled_sums, trapezoid_mean

LADDER: tuple[str, ...] = ("XS", "S", "M", "L")
COST_COLUMNS: tuple[str, ...] = ("total_tokens", "peak_context", "queries", "result_tokens", "vm_steps", "turns")


def level_key(level: str) -> tuple[int, int, str]:
    """Sort key: ladder levels in ladder order first, then any other (probe) level alphabetically."""
    return (0, LADDER.index(level), "") if level in LADDER else (1, 0, level)


def order_levels(levels: Iterable[str]) -> tuple[str, ...]:
    """The distinct levels sorted by `level_key`."""
    return tuple(sorted(set(levels), key=level_key))


def frontier_score(success: Mapping[str, float]) -> float | None:
    """Frontier Score (pp) from success percentages by level; None unless XS, S, M and L are all present and finite."""
    values = [success.get(lv) for lv in LADDER]
    if any(v is None or not math.isfinite(v) for v in values):
        return None
    return trapezoid_mean(np.asarray(values, dtype=np.float64))


@dataclass(frozen=True)
class CellMetrics:
    """One method × budget cell (``group`` None), or one of its per-database / per-seed slices (``group`` set).

    ``success``, ``official_ex`` and ``abstained`` are percentages; ``official_ex`` is over the ``official_ex_n``
    episodes that carry it (None when none do): BIRD's count, where an episode whose final SQL errors, exceeds the
    cap or that ran no SQL at all is logged wrong (`bapsql.env.outcome.official_ex`), so only episodes the
    environment could not judge (no runnable gold SQL) or logs of other systems leave it out. Cost fields are means
    per episode; ``breaches`` counts audit-flagged episodes.
    """

    method: str
    budget: str
    group: str | None
    episodes: int
    tasks: int
    databases: int
    seeds: int
    success: float
    official_ex: float | None
    total_tokens: float
    peak_context: float
    queries: float
    result_tokens: float
    vm_steps: float
    turns: float
    abstained: float
    breaches: int
    official_ex_n: int = 0  # the Official EX denominator: episodes that record official_ex


def cell_metrics(episodes: pd.DataFrame, by: str | None = None) -> tuple[CellMetrics, ...]:
    """Metrics per (method, budget) or, with ``by`` = ``"db_id"`` / ``"seed"``, per (method, budget, by)."""
    keys = ["method", "budget"] + ([by] if by else [])
    df = episodes.assign(
        _success=episodes["success"].astype(np.float64),
        _ex=episodes["official_ex"].astype("float64"),
        _abst=episodes["abstained"].astype(np.float64),
        _breach=episodes["breach"].astype(np.int64),
    )
    grouped = df.groupby(keys, sort=True)
    agg = grouped.agg(
        episodes=("_success", "size"),
        tasks=("task_id", "nunique"),
        databases=("db_id", "nunique"),
        seeds=("seed", "nunique"),
        success=("_success", "mean"),
        official_ex=("_ex", "mean"),
        ex_n=("_ex", "count"),
        abstained=("_abst", "mean"),
        breaches=("_breach", "sum"),
        **{c: (c, "mean") for c in COST_COLUMNS},
    )
    cells = []
    for key, row in agg.iterrows():
        key = key if isinstance(key, tuple) else (key,)
        cells.append(
            CellMetrics(
                method=str(key[0]),
                budget=str(key[1]),
                group=str(key[2]) if by else None,
                episodes=int(row["episodes"]),
                tasks=int(row["tasks"]),
                databases=int(row["databases"]),
                seeds=int(row["seeds"]),
                success=100.0 * float(row["success"]),
                official_ex=100.0 * float(row["official_ex"]) if row["ex_n"] > 0 else None,
                abstained=100.0 * float(row["abstained"]),
                breaches=int(row["breaches"]),
                official_ex_n=int(row["ex_n"]),
                **{c: float(row[c]) for c in COST_COLUMNS},
            )
        )
    return tuple(sorted(cells, key=lambda c: (c.method, level_key(c.budget), c.group or "")))


def frontier_scores(cells: Iterable[CellMetrics]) -> dict[tuple[str, str | None], float | None]:
    """Frontier Score per (method, group) from cells (pooled cells have group None)."""
    table: dict[tuple[str, str | None], dict[str, float]] = {}
    for c in cells:
        table.setdefault((c.method, c.group), {})[c.budget] = c.success
    return {key: frontier_score(by_level) for key, by_level in table.items()}


def success_intervals(
    episodes: pd.DataFrame, *, replicates: int, seed: int, level: float = 0.95
) -> dict[tuple[str, str], tuple[float, float]]:
    """Database-cluster bootstrap interval (percent) of Budgeted Success for every (method, budget).

    Each replicate resamples the cell's databases with replacement and keeps all their task-seed rows; the
    replicate success is ``counts @ successes_per_db / counts @ episodes_per_db``.
    """
    per_db = (
        episodes.assign(_s=episodes["success"].astype(np.float64))
        .groupby(["method", "budget", "db_id"], sort=True)["_s"]
        .agg(["sum", "size"])
    )
    out: dict[tuple[str, str], tuple[float, float]] = {}
    counts_by_k: dict[int, np.ndarray] = {}
    for (method, budget), block in per_db.groupby(level=[0, 1], sort=True):
        k = len(block)
        if k not in counts_by_k:
            counts_by_k[k] = bootstrap_counts(k, replicates, seed)
        sums = resampled_sums(counts_by_k[k], block[["sum", "size"]].to_numpy(np.float64))
        out[(str(method), str(budget))] = percentile_interval(100.0 * ratio(sums[:, 0], sums[:, 1]), level)
    return out
