"""Shared fixtures of the data tests: one small embedded benchmark per session (built in a temp folder)."""

from __future__ import annotations

from pathlib import Path

import pytest

SPIDER = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "spider_train"


@pytest.fixture(scope="session")
def demo_small(tmp_path_factory) -> Path:
    """The embedded benchmark at small scale, seed 0 (built once per test session, single process)."""
    from bapsql.data.demo import build_demo

    out = tmp_path_factory.mktemp("demo_small")
    build_demo(out, scale="small", seed=0, workers=1)
    return out


@pytest.fixture(scope="session")
def demo_binding(tmp_path_factory) -> Path:
    """The embedded benchmark at small scale, seed 0, binding task mix (`bapsql.data.mixes`)."""
    from bapsql.data.demo import build_demo

    out = tmp_path_factory.mktemp("demo_binding")
    build_demo(out, scale="small", seed=0, mix="binding", workers=1)
    return out
