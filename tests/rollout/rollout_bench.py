"""A small benchmark for the rollout tests: the policy tests' mini benchmark with both databases in every split,
so episodes shard over two env workers."""

from __future__ import annotations

from pathlib import Path

from bapsql.data.benchmark import write_json
from tests.policies.minibench import build_minibench


def build_rollout_bench(root: Path) -> Path:
    """The mini benchmark (``shop`` and ``library``, 12 tasks) with splits dev = train = both databases."""
    build_minibench(root)
    write_json(root / "splits.json", {"seed": 0, "splits": {"train": ["library", "shop"], "validation": [],
                                                            "dev": ["library", "shop"]}})
    return root
