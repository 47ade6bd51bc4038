"""A real sweep's Parquet logs for the benchmark scripts' tests: a workflow at XS and L and the drafter under raw."""

from __future__ import annotations

import pytest

from bapsql.rollout.runner import evaluate
from tests.policies.minibench import build_minibench


@pytest.fixture(scope="session")
def runs(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("BAPSQL_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
    bench = build_minibench(tmp_path_factory.mktemp("bench"))
    root = tmp_path_factory.mktemp("runs")
    evaluate(bench, "dev", "workflow.estimate_rewrite", ["XS", "L"], [0], root / "er", limit=4)
    evaluate(bench, "dev", "scripted.drafter@raw", ["XS"], [0], root / "raw", limit=4)
    yield [str(root / "er"), str(root / "raw")]
    mp.undo()
