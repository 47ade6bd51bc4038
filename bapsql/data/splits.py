"""Splits: database-level train / validation / dev (no database in two), plus an in-domain task-level ``test``.

Database splits, as the real benchmarks do them: no database in two splits.

Contract: `split_databases` is a pure function of (database ids, seed, fractions, fixed assignments). Each database's
place in the order is the SHA-256 of ``"{seed}:{db_id}"``, so a database keeps its split when others are added or
removed (only the counts move), and the same seed always gives the same split. Every split with a positive fraction
gets at least one database when there are enough databases. `fixed` assigns databases up front (e.g. BIRD's official
dev databases stay ``dev``); only the rest are split by `fractions`.

In-domain test split (for learning curves on held-out tasks of the training databases): `is_test_task` puts a task
of a ``train`` database into ``test`` when the SHA-256 of ``"{seed}:test:{task_id}"``, read as a number in [0, 1),
is below `TEST_FRACTION` (0.2). Membership depends only on (task id, seed), never on the other tasks, so adding or
removing tasks moves nobody. `bapsql.data.benchmark.Benchmark.select` then serves ``train`` = train-database tasks
that are not ``test`` and ``test`` = the others: the two are task-disjoint and share databases by design;
``validation`` and ``dev`` stay database-disjoint from both.
"""

from __future__ import annotations

import hashlib
from typing import Iterable, Mapping

from bapsql.errors import ConfigError

SPLIT_NAMES: tuple[str, ...] = ("train", "validation", "dev")
TASK_SPLITS: tuple[str, ...] = ("test",)  # task-level splits carved out of the train databases
DEFAULT_FRACTIONS: tuple[float, float, float] = (0.6, 0.2, 0.2)
TEST_FRACTION = 0.2


def _order_key(seed: int, db_id: str) -> str:
    return hashlib.sha256(f"{seed}:{db_id}".encode()).hexdigest()


def split_databases(db_ids: Iterable[str], *, seed: int = 0,
                    fractions: tuple[float, float, float] = DEFAULT_FRACTIONS,
                    fixed: Mapping[str, str] | None = None) -> dict[str, tuple[str, ...]]:
    """Assign each database to one of `SPLIT_NAMES`; returns split → sorted database ids (every name present)."""
    if len(fractions) != 3 or any(f < 0 for f in fractions) or sum(fractions) <= 0:
        raise ConfigError(f"split fractions must be three non-negative numbers with a positive sum, got {fractions}")
    fixed = dict(fixed or {})
    bad = sorted(set(fixed.values()) - set(SPLIT_NAMES))
    if bad:
        raise ConfigError(f"unknown split name(s) {bad}; use {list(SPLIT_NAMES)}")
    ids = sorted(set(db_ids))
    rest = sorted((d for d in ids if d not in fixed), key=lambda d: _order_key(seed, d))
    total = sum(fractions)
    n = len(rest)
    n_val = round(n * fractions[1] / total)
    n_dev = round(n * fractions[2] / total)
    positive = sum(f > 0 for f in fractions)
    if n >= positive:
        n_val = max(n_val, 1 if fractions[1] > 0 else 0)
        n_dev = max(n_dev, 1 if fractions[2] > 0 else 0)
        while fractions[0] > 0 and n - n_val - n_dev < 1:
            if n_val >= n_dev and n_val > 1:
                n_val -= 1
            else:
                n_dev -= 1
    out: dict[str, list[str]] = {name: [] for name in SPLIT_NAMES}
    for d, s in fixed.items():
        if d in ids:
            out[s].append(d)
    out["dev"] += rest[:n_dev]
    out["validation"] += rest[n_dev:n_dev + n_val]
    out["train"] += rest[n_dev + n_val:]
    return {name: tuple(sorted(v)) for name, v in out.items()}


def split_of(splits: Mapping[str, Iterable[str]]) -> dict[str, str]:
    """Invert a split mapping: database id → split name."""
    return {d: name for name, dbs in splits.items() for d in dbs}


def is_test_task(task_id: str, seed: int = 0, fraction: float = TEST_FRACTION) -> bool:
    """Whether a task of a training database belongs to the in-domain ``test`` split (module docstring)."""
    if not 0.0 <= fraction <= 1.0:
        raise ConfigError(f"test fraction must be in [0, 1], got {fraction}")
    digest = hashlib.sha256(f"{seed}:test:{task_id}".encode()).hexdigest()
    return int(digest[:16], 16) / 16**16 < fraction
