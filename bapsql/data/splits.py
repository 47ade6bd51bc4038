"""Database-level splits (train / validation / dev), as the real benchmarks do: no database in two splits.

Contract: `split_databases` is a pure function of (database ids, seed, fractions, fixed assignments). Each database's
place in the order is the SHA-256 of ``"{seed}:{db_id}"``, so a database keeps its split when others are added or
removed (only the counts move), and the same seed always gives the same split. Every split with a positive fraction
gets at least one database when there are enough databases. `fixed` assigns databases up front (e.g. BIRD's official
dev databases stay ``dev``); only the rest are split by `fractions`.
"""

from __future__ import annotations

import hashlib
from typing import Iterable, Mapping

from bapsql.errors import ConfigError

SPLIT_NAMES: tuple[str, ...] = ("train", "validation", "dev")
DEFAULT_FRACTIONS: tuple[float, float, float] = (0.6, 0.2, 0.2)


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


# ------------------------------------------------------------------------------------------ in-domain task holdout
# A database-level split cannot say whether a model learned its training databases: the in-domain test split holds
# out a fixed share of each training database's *tasks*. ``"<split>:fit"`` names the tasks training may use and
# ``"<split>:test"`` the held-out rest (`bapsql.rollout.runner.load_tasks` understands both).
TASK_PARTS: tuple[str, ...] = ("fit", "test")
TEST_FRACTION = 0.25


def in_test_part(task_id: str, *, fraction: float = TEST_FRACTION) -> bool:
    """Whether a task belongs to the held-out ``test`` part: the first 8 bytes of SHA-256(task id), read as a
    number in [0, 1), fall below ``fraction``. Stable when tasks are added or removed."""
    h = int.from_bytes(hashlib.sha256(f"holdout:{task_id}".encode()).digest()[:8], "big")
    return h / 2 ** 64 < fraction


def parse_task_split(split: str) -> tuple[str, str | None]:
    """``"train:test"`` → ``("train", "test")``; a plain split name → ``(name, None)``."""
    if ":" not in split:
        return split, None
    base, part = split.split(":", 1)
    if part not in TASK_PARTS:
        raise ConfigError(f"split {split!r}: the part after ':' must be one of {list(TASK_PARTS)}")
    return base, part


def select_part(task_ids: Iterable[str], part: str | None) -> set[str]:
    """The ids of ``task_ids`` that belong to ``part`` (all of them when ``part`` is None)."""
    ids = list(task_ids)
    if part is None:
        return set(ids)
    return {t for t in ids if in_test_part(t) == (part == "test")}
