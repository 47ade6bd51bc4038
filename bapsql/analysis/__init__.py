"""bapsql.analysis: the offline analysis of trajectory logs (DESIGN §7). It reads Parquet only.

Modules: `load` (run dirs → frames), `metrics` (success, Frontier Score, cost), `statistics` (pure numpy: cluster
bootstrap, t, sign tests), `comparisons` (paired effects, primary gate), `transitions`, `diagnostics`, `plots`,
`report` (Markdown/HTML), `analyze` (`analyze_runs`, `Summary`), `synthetic` (planted-effect logs for tests).
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
