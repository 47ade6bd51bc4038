"""Summary statistics of a loaded benchmark (what `bapsql data stats` prints).

Contract: `benchmark_stats` is pure over a `Benchmark` (plus the folder's manifest.json for the embedded benchmark's
measured shares). Its JSON always has ``databases`` (database files found), ``tasks``, ``missing_databases`` (list),
``failed_gold`` (count) and ``answer_types`` (counts of ``scalar``, ``list``, ``ordered_list``), plus sizes, flags,
tag shares, ``empty_gold`` (tasks whose gold query returns no rows, `bapsql.data.benchmark.empty_gold`: an answer of
``[]`` is correct there without evidence) and the same counts per split.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable

from bapsql.data.benchmark import MANIFEST_FILE, Benchmark, empty_gold
from bapsql.data.splits import TASK_SPLITS
from bapsql.types import ANSWER_KINDS, Task

SHARE_TAGS: tuple[str, ...] = ("budget_sensitive", "unanswerable_xs")


@dataclass(frozen=True)
class SplitStats:
    databases: int
    tasks: int
    answer_types: dict[str, int]
    shares: dict[str, float]  # share of tasks carrying each of SHARE_TAGS, and with an evidence hint
    empty_gold: int = 0  # tasks whose gold query returns no rows


@dataclass(frozen=True)
class BenchmarkStats:
    name: str
    kind: str
    root: str
    databases: int
    tasks: int
    missing_databases: list[str]
    failed_gold: int
    answer_types: dict[str, int]
    tasks_missing_database: int = 0
    unreadable_files: int = 0
    duplicates_dropped: int = 0
    flags: dict[str, int] = field(default_factory=dict)  # flag code → tasks
    difficulty: dict[str, int] = field(default_factory=dict)
    shares: dict[str, float] = field(default_factory=dict)
    database_bytes: int = 0
    largest_table_rows: int | None = None  # embedded benchmark only (from its manifest)
    measured: dict[str, float] = field(default_factory=dict)  # embedded benchmark: gold/naive over XS/S shares
    splits: dict[str, SplitStats] = field(default_factory=dict)
    empty_gold: int = 0  # tasks whose gold query returns no rows (`[]` is correct there without evidence)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _answer_types(tasks: Iterable[Task]) -> dict[str, int]:
    c = Counter(t.gold.kind for t in tasks if t.gold is not None)
    return {k: c.get(k, 0) for k in ANSWER_KINDS}


def _shares(tasks: list[Task]) -> dict[str, float]:
    n = max(1, len(tasks))
    out = {tag: round(sum(tag in t.tags for t in tasks) / n, 4) for tag in SHARE_TAGS}
    out["evidence"] = round(sum(bool(t.evidence) for t in tasks) / n, 4)
    return out


def benchmark_stats(bench: Benchmark) -> BenchmarkStats:
    """Counts, sizes, flags and shares of ``bench``, overall and per split."""
    m = bench.manifest
    tasks = list(bench.tasks)
    paths = {t.db_id: Path(t.db_path) for t in tasks}
    db_bytes = sum(p.stat().st_size for p in paths.values() if p.is_file())
    largest, measured = None, {}
    manifest_file = bench.root / MANIFEST_FILE
    if m.layout == "demo" and manifest_file.is_file():
        try:
            obj = json.loads(manifest_file.read_text())
            largest = max((n for d in obj["databases"].values() for n in d["tables"].values()), default=None)
            measured = {k: v for k, v in obj.get("shares", {}).items() if k not in SHARE_TAGS}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            pass  # stats still work from the tasks alone
    splits = {}
    names = list(bench.splits) + ([*TASK_SPLITS] if "train" in bench.splits else [])
    for name in names:
        st = list(bench.select(name).tasks)
        dbs = bench.splits["train" if name in TASK_SPLITS else name]
        splits[name] = SplitStats(len(dbs), len(st), _answer_types(st), _shares(st), sum(map(empty_gold, st)))
    flags = Counter(tag[5:] for t in tasks for tag in t.tags if tag.startswith("flag:"))
    return BenchmarkStats(
        name=bench.name, kind=bench.kind, root=str(bench.root), databases=len(m.databases), tasks=len(tasks),
        missing_databases=list(m.missing_databases), failed_gold=len(m.failed_gold), answer_types=_answer_types(tasks),
        tasks_missing_database=len(m.tasks_missing_database), unreadable_files=len(m.unreadable_files),
        duplicates_dropped=len(m.duplicates), flags=dict(sorted(flags.items())),
        difficulty=dict(sorted(Counter(t.difficulty or "unknown" for t in tasks).items())), shares=_shares(tasks),
        database_bytes=db_bytes, largest_table_rows=largest, measured=measured, splits=splits,
        empty_gold=sum(map(empty_gold, tasks)),
    )
