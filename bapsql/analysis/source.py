"""What the summary reads from logs (`LogSource`), and its per-episode reference implementation (`EpisodeSource`).

`bapsql.analysis.analyze.summarize_source` assembles a `Summary` from any `LogSource`. Two implementations:

- `bapsql.analysis.from_aggregates.AggregateSource`: running aggregates from the out-of-core scan
  (`bapsql.analysis.scan`); what `analyze_runs` and `summarize` use, with memory bounded by clusters and tasks;
- `EpisodeSource`: the per-episode functions over frames loaded whole by `load_runs` (`metrics.cell_metrics`,
  `comparisons.paired_comparisons`, `transitions.transition_analysis`, `diagnostics.*`) — the analysis as it was
  before the scan, kept as the slow reference the tests and `benchmarks/bench_analysis.py --path old` compare
  against. Its memory grows with the episodes.
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence

from bapsql.analysis.comparisons import PairedComparison, paired_comparisons
from bapsql.analysis.diagnostics import (
    Coverage,
    FailureCounts,
    WarningFlow,
    empty_gold_summary,
    estimator_coverage,
    failure_taxonomy,
    warning_flow,
)
from bapsql.analysis.load import RunLogs
from bapsql.analysis.metrics import CellMetrics, cell_metrics, order_levels, success_intervals
from bapsql.analysis.transitions import TransitionAnalysis, transition_analysis


class LogSource(Protocol):
    """Everything `summarize_source` needs. ``methods`` sorted, ``levels`` in `metrics.order_levels` order,
    ``databases`` the number of distinct database ids, ``episodes`` the number of episode rows."""

    run_dirs: tuple[str, ...]
    notes: tuple[str, ...]
    episodes: int
    methods: tuple[str, ...]
    levels: tuple[str, ...]
    databases: int

    def cells(self, by: str | None = None) -> tuple[CellMetrics, ...]: ...

    def success_intervals(self, *, replicates: int, seed: int) -> dict[tuple[str, str], tuple[float, float]]: ...

    def paired_comparisons(self, pairs: Sequence[tuple[str, str]], *, budgets: Sequence[str], replicates: int,
                           seed: int) -> tuple[PairedComparison, ...]: ...

    def transitions(self, method: str, reference: str) -> tuple[TransitionAnalysis, ...]: ...

    def coverage(self) -> tuple[Coverage, ...]: ...

    def warning_flow(self) -> tuple[WarningFlow, ...]: ...

    def failures(self) -> tuple[FailureCounts, ...]: ...

    def empty_gold(self) -> dict[str, Any]: ...


class EpisodeSource:
    """`LogSource` over whole frames (module docstring)."""

    def __init__(self, logs: RunLogs) -> None:
        ep = logs.episodes
        self.logs = logs
        self.frame = ep if "condition" in ep else ep.assign(condition=None)
        self.run_dirs, self.notes = logs.run_dirs, logs.notes
        self.episodes = len(ep)
        self.methods = tuple(sorted(ep["method"].unique()))
        self.levels = order_levels(ep["budget"].unique())
        self.databases = int(ep["db_id"].nunique())

    def cells(self, by: str | None = None) -> tuple[CellMetrics, ...]:
        return cell_metrics(self.frame, by=by)

    def success_intervals(self, *, replicates: int, seed: int) -> dict[tuple[str, str], tuple[float, float]]:
        return success_intervals(self.frame, replicates=replicates, seed=seed)

    def paired_comparisons(self, pairs: Sequence[tuple[str, str]], *, budgets: Sequence[str], replicates: int,
                           seed: int) -> tuple[PairedComparison, ...]:
        return paired_comparisons(self.frame, pairs, budgets=budgets, replicates=replicates, seed=seed)

    def transitions(self, method: str, reference: str) -> tuple[TransitionAnalysis, ...]:
        return transition_analysis(self.frame, method, reference)

    def coverage(self) -> tuple[Coverage, ...]:
        return estimator_coverage(self.logs.turns) if len(self.logs.turns) else ()

    def warning_flow(self) -> tuple[WarningFlow, ...]:
        return warning_flow(self.frame)

    def failures(self) -> tuple[FailureCounts, ...]:
        return failure_taxonomy(self.frame)

    def empty_gold(self) -> dict[str, Any]:
        return empty_gold_summary(self.frame)
