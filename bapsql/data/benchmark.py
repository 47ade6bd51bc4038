"""A loaded benchmark and the benchmark folder format (`load_folder`); `bapsql.data.load.load_benchmark` loads
any supported layout.

Folder format (what `bapsql data build-demo` writes and every ``--benchmark DIR`` accepts):
``DIR/benchmark.json`` (name, kind, version, seed, scale, generator version), ``DIR/databases/<db_id>/<db_id>.sqlite``,
``DIR/tasks.jsonl`` (one `bapsql.types.Task` per line; ``gold`` as `Answer.to_json`; ``db_path`` relative to DIR),
``DIR/splits.json`` (``{"seed": s, "splits": {"train": [...], "validation": [...], "dev": [...]}}``) and
``DIR/manifest.json`` (database sizes and hashes, per-task measured costs, shares, file hashes).
Besides the database splits of ``splits.json``, every benchmark with a ``train`` split offers ``test``: the
in-domain held-out tasks of the train databases (`bapsql.data.splits.is_test_task`); ``train`` then excludes them.

Contract of `bapsql.data.load.load_benchmark(dir, split=None)`: detects the folder format, a BIRD layout or a
Spider layout (`bapsql.data.loaders`); returns a `Benchmark` whose ``tasks`` all have a typed gold answer and an absolute
``db_path``. Nothing is dropped silently: missing databases, unreadable files and records, gold SQL that fails, flagged
gold results and cross-split duplicate questions are listed in ``Benchmark.manifest`` (`LoadManifest`).
`empty_gold` tells the tasks whose gold query returns no rows: an answer of ``[]`` is correct there without any
evidence (RL learns to exploit it), so stats count them and GRPO leaves them out of its prompts by default.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from bapsql.data.splits import SPLIT_NAMES, TASK_SPLITS, is_test_task
from bapsql.errors import DataError
from bapsql.files import atomic_write_text
from bapsql.types import Answer, Task

BENCHMARK_FILE = "benchmark.json"
TASKS_FILE = "tasks.jsonl"
SPLITS_FILE = "splits.json"
MANIFEST_FILE = "manifest.json"
FORMAT_VERSION = 1
LAYOUTS: tuple[str, ...] = ("demo", "bird", "spider")


def empty_gold(task: Task) -> bool:
    """Whether ``task``'s gold query returns no rows (its typed gold is an empty list, or a loader flagged it
    ``flag:empty``)."""
    if "flag:empty" in task.tags:
        return True
    return task.gold is not None and task.gold.kind != "scalar" and len(task.gold.values) == 0


@dataclass(frozen=True)
class LoadManifest:
    """Everything a load found wrong or set aside, plus the database split. Lists hold ids, paths and reasons."""

    layout: str
    root: str
    question_files: tuple[str, ...] = ()
    databases: tuple[str, ...] = ()  # database ids whose file was found
    missing_databases: tuple[str, ...] = ()
    unreadable_files: tuple[tuple[str, str], ...] = ()  # (path or path#record, reason)
    tasks_missing_database: tuple[str, ...] = ()  # task ids
    failed_gold: tuple[tuple[str, str], ...] = ()  # (task id, error)
    flagged: tuple[tuple[str, str, str], ...] = ()  # (task id, flag code, reason); tasks kept, tagged flag:<code>
    duplicates: tuple[tuple[str, str], ...] = ()  # (task id, reason): dropped cross-split duplicate questions
    records: int = 0  # question records read
    split_seed: int = 0
    splits: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Benchmark:
    """Tasks (each with a gold answer and an absolute db_path), the database split and the load manifest."""

    name: str
    kind: str
    root: Path
    tasks: tuple[Task, ...]
    splits: dict[str, tuple[str, ...]]
    manifest: LoadManifest
    info: dict[str, Any] = field(default_factory=dict)  # benchmark.json of a folder, {} for BIRD/Spider

    @property
    def databases(self) -> tuple[str, ...]:
        return tuple(sorted({t.db_id for t in self.tasks}))

    def split_of(self, db_id: str) -> str | None:
        return next((name for name, dbs in self.splits.items() if db_id in dbs), None)

    def select(self, split: str) -> "Benchmark":
        """The same benchmark restricted to one split's tasks. Raises `DataError` for an unknown split name.

        ``train`` and ``test`` share the train databases and split their tasks by `is_test_task` (seeded by the
        benchmark's split seed): ``test`` holds the in-domain held-out tasks, ``train`` the rest."""
        if split in TASK_SPLITS and "train" in self.splits:
            dbs = set(self.splits["train"])
            return replace(self, tasks=tuple(t for t in self.tasks if t.db_id in dbs and self._is_test(t)))
        if split not in self.splits:
            names = sorted(self.splits) + ([*TASK_SPLITS] if "train" in self.splits else [])
            raise DataError(f"unknown split {split!r}; this benchmark has {names}")
        dbs = set(self.splits[split])
        keep = (lambda t: not self._is_test(t)) if split == "train" else (lambda t: True)
        return replace(self, tasks=tuple(t for t in self.tasks if t.db_id in dbs and keep(t)))

    def _is_test(self, task: Task) -> bool:
        return is_test_task(task.task_id, self.manifest.split_seed)

    def db_paths(self) -> dict[str, Path]:
        """Database id → absolute path of its SQLite file, for the databases that have tasks."""
        return {t.db_id: Path(t.db_path) for t in self.tasks}


# ----------------------------------------------------------------------------------------------------------------------
# folder format: writing


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def json_text(obj: Any) -> str:
    """The deterministic JSON text `write_json` writes (sorted keys, one-space indent, trailing newline)."""
    return json.dumps(obj, indent=1, sort_keys=True) + "\n"


def write_json(path: str | Path, obj: Any) -> None:
    """Deterministic JSON (`json_text`), written atomically."""
    atomic_write_text(Path(path), json_text(obj))


def write_json_text(path: str | Path, text: str) -> None:
    """Write already rendered text atomically (temp file + rename)."""
    atomic_write_text(Path(path), text)


def task_to_json(t: Task) -> dict[str, Any]:
    d = asdict(t)
    d["gold"] = t.gold.to_json() if t.gold is not None else None
    d["tags"] = list(t.tags)
    return d


def task_from_json(obj: dict[str, Any]) -> Task:
    """Build a Task from one tasks.jsonl record; raises `DataError` naming a missing or unknown field."""
    fields = {f for f in Task.__dataclass_fields__}
    unknown = sorted(set(obj) - fields)
    missing = sorted({"task_id", "db_id", "db_path", "question", "gold_sql"} - set(obj))
    if unknown or missing:
        raise DataError(f"task record has unknown fields {unknown} / lacks required fields {missing}")
    obj = dict(obj)
    try:
        obj["gold"] = Answer.from_json(obj["gold"]) if obj.get("gold") is not None else None
    except (KeyError, TypeError, ValueError) as exc:
        raise DataError(f"task {obj.get('task_id')}: malformed gold answer: {exc}") from exc
    obj["tags"] = tuple(obj.get("tags", ()))
    return Task(**obj)


def write_tasks(path: str | Path, tasks: list[Task]) -> None:
    """tasks.jsonl: one task per line, keys sorted, in the given order."""
    atomic_write_text(Path(path), "".join(json.dumps(task_to_json(t), sort_keys=True) + "\n" for t in tasks))


# ----------------------------------------------------------------------------------------------------------------------
# loading


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise DataError(f"{path}: cannot read JSON ({exc})") from exc


def load_folder(root: str | Path) -> Benchmark:
    """Load the folder format. Raises `DataError` for a malformed benchmark.json, tasks.jsonl or splits.json."""
    root = Path(root).resolve()
    info = _read_json(root / BENCHMARK_FILE)
    if not isinstance(info, dict) or info.get("version") != FORMAT_VERSION:
        raise DataError(f"{root / BENCHMARK_FILE}: expected a mapping with version {FORMAT_VERSION}")
    tasks, unreadable, missing_tasks = [], [], []
    try:
        lines = (root / TASKS_FILE).read_text().splitlines()
    except OSError as exc:
        raise DataError(f"{root / TASKS_FILE}: cannot read ({exc})") from exc
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            t = task_from_json(json.loads(line))
        except (ValueError, DataError) as exc:
            unreadable.append((f"{TASKS_FILE}#{i}", str(exc)))
            continue
        path = (root / t.db_path).resolve()
        if not path.is_file():
            missing_tasks.append(t)
            continue
        if t.gold is None:
            unreadable.append((f"{TASKS_FILE}#{i}", f"task {t.task_id} has no gold answer"))
            continue
        tasks.append(replace(t, db_path=str(path)))
    splits_obj = _read_json(root / SPLITS_FILE) if (root / SPLITS_FILE).is_file() else {"seed": 0, "splits": {}}
    try:
        raw = splits_obj["splits"]
        splits = {k: tuple(raw[k]) for k in sorted(raw, key=lambda k: (k not in SPLIT_NAMES, SPLIT_NAMES.index(k)
                                                                       if k in SPLIT_NAMES else 0, k))}
        seed = int(splits_obj.get("seed", 0))
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        raise DataError(f"{root / SPLITS_FILE}: expected {{'seed': int, 'splits': {{name: [db ids]}}}}") from exc
    manifest = LoadManifest(
        layout="demo", root=str(root), question_files=(TASKS_FILE,),
        databases=tuple(sorted({t.db_id for t in tasks})),
        missing_databases=tuple(sorted({t.db_id for t in missing_tasks})),
        unreadable_files=tuple(unreadable), tasks_missing_database=tuple(t.task_id for t in missing_tasks),
        records=len(tasks) + len(unreadable) + len(missing_tasks), split_seed=seed, splits=splits,
    )
    return Benchmark(str(info.get("name", root.name)), str(info.get("kind", "demo")), root, tuple(tasks), splits,
                     manifest, info)
