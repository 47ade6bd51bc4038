"""Task loading, for rollouts and training alike: which benchmark folder a spec names, and a split's tasks in order.

- `resolve_benchmark(spec)`: ``spec`` itself, or for ``"demo"`` (`DEMO`) / ``"demo:<mix>"`` the embedded benchmark
  (of that task mix, `bapsql.data.mixes`) at small scale (`DEMO_SCALE`, or ``scale``) in the cache dir, built there
  on first use (or when an older generator wrote it);
- `load_tasks(benchmark_dir, split, limit=None)`: the split's tasks database by database (then by task id), any
  layout `bapsql.data.load.load_benchmark` reads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from bapsql.types import Task

DEMO = "demo"
DEMO_SCALE = "small"


def demo_mix(spec: str | Path) -> str | None:
    """The task mix an embedded-benchmark spec names (``"demo"`` → ``"default"``, ``"demo:binding"`` →
    ``"binding"``), or None for a folder path. Raises `ConfigError` for an unknown mix."""
    from bapsql.data.mixes import DEFAULT_MIX, mix_named

    text = str(spec)
    if text == DEMO:
        return DEFAULT_MIX
    if not text.startswith(DEMO + ":"):
        return None
    return mix_named(text[len(DEMO) + 1:]).name


def resolve_benchmark(spec: str | Path, *, scale: str = DEMO_SCALE, cache_dir: str | Path | None = None,
                      announce: Callable[[str], None] | None = None) -> Path:
    """A benchmark folder: ``spec`` itself, or for ``"demo"`` / ``"demo:<mix>"`` the cached embedded benchmark of
    that mix at ``scale`` (built if missing; ``announce`` is told so)."""
    mix = demo_mix(spec)
    if mix is None:
        return Path(spec)
    from bapsql.data.cache import default_cache_dir
    from bapsql.data.demo import build_demo, demo_is_current
    from bapsql.data.mixes import DEFAULT_MIX

    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    root = root / (f"demo-{scale}" if mix == DEFAULT_MIX else f"demo-{scale}-{mix}")
    if not demo_is_current(root, mix):  # missing, or written by an older generator (other databases and splits)
        if announce:
            announce(f"building the embedded demo benchmark ({scale} scale, {mix} mix) into {root} ...")
        build_demo(root, scale=scale, seed=0, mix=mix)
    return root


def load_tasks(benchmark_dir: str | Path, split: str, *, limit: int | None = None) -> list[Task]:
    """The split's tasks ordered database by database (then by task id), the first ``limit`` of that order.
    ``test`` is the in-domain split: held-out tasks of the training databases (`bapsql.data.splits`)."""
    from bapsql.data.load import load_benchmark

    tasks = sorted(load_benchmark(benchmark_dir, split=split).tasks, key=lambda t: (t.db_id, t.task_id))
    return tasks[:limit] if limit is not None else tasks
