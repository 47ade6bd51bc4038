"""bapsql.analysis: the offline analysis of trajectory logs (DESIGN §7). It reads Parquet only.

Modules: `scan` (run dirs → running aggregates, out of core: Parquet record batches with column projection, folded
by `accumulate` with the primitives of `codes`), `from_aggregates` (every statistic from those aggregates),
`source` (the `LogSource` a summary reads; `EpisodeSource`, the per-episode reference over whole frames), `load`
(run dirs → frames, and the file/notes conventions the scan shares), `metrics` (success, Frontier Score, cost),
`statistics` (pure numpy: cluster bootstrap, t, sign tests), `comparisons` (paired effects, primary gate),
`transitions`, `diagnostics`, `plots`, `report` (the report as typed blocks), `render` (those blocks as Markdown
and HTML), `analyze` (`analyze_runs`, `Summary`), `synthetic` (planted-effect logs for tests and the benchmark).
Memory is bounded by clusters (methods × budgets × seeds × databases) and tasks, not by episodes (issue 33).
Nothing here imports bapsql layers above the log schema, so logs from any version or system can be analysed.
"""

from __future__ import annotations

from typing import Any

__all__ = ["analyze_runs", "Summary"]


def __getattr__(name: str) -> Any:  # lazy, so importing the package stays free of pandas/matplotlib
    if name in __all__:
        from bapsql.analysis import analyze

        return getattr(analyze, name)
    raise AttributeError(f"module 'bapsql.analysis' has no attribute {name!r}")
