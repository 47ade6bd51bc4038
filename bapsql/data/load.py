"""Loading a benchmark: `detect_layout` tells the folder format from a BIRD or Spider layout, `load_benchmark`
loads whichever it is (contract in `bapsql.data.benchmark`). It sits above the folder format
(`bapsql.data.benchmark`) and the BIRD/Spider loaders (`bapsql.data.loaders`), so neither imports the other.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from bapsql.data.benchmark import BENCHMARK_FILE, TASKS_FILE, Benchmark, load_folder
from bapsql.data.loaders import load_real, looks_like_bird, looks_like_spider
from bapsql.errors import DataError


def detect_layout(root: str | Path) -> str:
    """'demo' (the folder format), 'bird' or 'spider'; raises `DataError` saying what each layout needs."""
    root = Path(root)
    if not root.is_dir():
        raise DataError(f"benchmark folder not found: {root}")
    if (root / BENCHMARK_FILE).is_file() and (root / TASKS_FILE).is_file():
        return "demo"
    if looks_like_bird(root):
        return "bird"
    if looks_like_spider(root):
        return "spider"
    raise DataError(
        f"{root}: no known benchmark layout. Expected a benchmark folder ({BENCHMARK_FILE} + {TASKS_FILE}, e.g. from "
        "`bapsql data build-demo`), a BIRD layout (question JSON with 'SQL' fields + *_databases/<db>/<db>.sqlite) or "
        "a Spider layout (question JSON with 'query' fields + database/<db>/<db>.sqlite)"
    )


def load_benchmark(root: str | Path, split: str | None = None, *, seed: int = 0, cache_dir: str | Path | None = None,
                   progress: Callable[[int, int], None] | None = None) -> Benchmark:
    """Load any supported benchmark from ``root`` (see the module docstring); ``split`` keeps one split's tasks.

    For BIRD/Spider the gold SQL is executed once (read-only, cached under ``cache_dir``) to type the answers and
    ``seed`` fixes the database split; ``progress(done, total)`` reports gold execution. Raises `DataError` when
    the folder matches no layout or a split name is unknown.
    """
    layout = detect_layout(root)
    if layout == "demo":
        bench = load_folder(root)
    else:
        bench = load_real(Path(root), layout, seed=seed, cache_dir=cache_dir, progress=progress)
    return bench.select(split) if split is not None else bench
