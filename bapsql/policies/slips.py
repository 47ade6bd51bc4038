"""A bank of a policy's own failed first queries ("slips"), harvested from its rollout logs, for recovery SFT.

`workflow.recover_from_error` stages a first query SQLite refuses, then inspects the schema and runs the gold query.
Its synthetic slip renames a column to a word of the question (`misnamed_column_sql`); a small model's own slips are
paraphrases of real names (``publication_year`` for ``year``). `harvest_slips` reads trajectory logs (the ``turns``
Parquet of `bapsql.logs`) and keeps, per task, the first `execute_query` of each episode that SQLite refuses with
"no such column" or "no such table" (checked again by the env's sandbox: the logs keep a sample of observations);
`SlipBank` pairs those queries with their tasks (gold SQL included, for the workflow oracle) and is saved as JSON
Lines, one task per line: ``{"task": {...}, "slips": [sql, ...]}``.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from bapsql.errors import DataError
from bapsql.types import Task

# the refusals a recovery episode teaches: a name the schema lacks (SQLite's wording, as the env shows it)
SLIP_ERRORS = ("no such column", "no such table")


@dataclass(frozen=True)
class SlipBank:
    """Tasks and, for each, the distinct failed first queries a policy wrote for it (in first-seen order)."""

    tasks: tuple[Task, ...]
    slips: Mapping[str, tuple[str, ...]]  # task_id -> failed queries

    def __post_init__(self) -> None:
        missing = [t.task_id for t in self.tasks if not self.slips.get(t.task_id)]
        if missing:
            raise DataError(f"slip bank: tasks without a slip: {missing[:5]}")

    def __len__(self) -> int:
        return len(self.tasks)

    @property
    def n_slips(self) -> int:
        return sum(len(v) for v in self.slips.values())

    def save(self, path: str | Path, root: str | Path | None = None) -> Path:
        """Write the bank; with ``root`` (the benchmark folder) database paths under it are stored relative to it,
        so the bank loads on another machine that materialised the same benchmark."""
        from bapsql.data.benchmark import task_to_json
        from bapsql.files import atomic_write_text

        base = Path(root).resolve() if root is not None else None

        def record(t: Task) -> dict:
            obj, db = task_to_json(t), Path(t.db_path).resolve()
            if base is not None and db.is_relative_to(base):
                obj["db_path"] = str(db.relative_to(base))
            return {"task": obj, "slips": list(self.slips[t.task_id])}

        lines = [json.dumps(record(t), sort_keys=True) for t in self.tasks]
        path = Path(path)
        atomic_write_text(path, "".join(line + "\n" for line in lines))
        return path

    @classmethod
    def load(cls, path: str | Path, root: str | Path | None = None) -> "SlipBank":
        """Read a bank written by `save`, relative database paths resolved against ``root`` (the benchmark folder);
        `DataError` naming the file and line when a record is malformed or its database file is missing."""
        from bapsql.data.benchmark import task_from_json

        path = Path(path)
        if not path.is_file():
            raise DataError(f"slip bank {path} does not exist; write it with `python -m jobs.harvest_slips`")
        tasks: list[Task] = []
        slips: dict[str, tuple[str, ...]] = {}
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                task, sqls = task_from_json(obj["task"]), tuple(str(s) for s in obj["slips"])
                if not Path(task.db_path).is_absolute() and root is not None:
                    task = dataclasses.replace(task, db_path=str(Path(root) / task.db_path))
            except (json.JSONDecodeError, KeyError, TypeError, DataError) as exc:
                raise DataError(f"{path}:{i}: malformed slip record ({exc}); expected "
                                '{"task": {...}, "slips": [sql, ...]}') from exc
            if not Path(task.db_path).is_file():
                raise DataError(f"{path}:{i}: database {task.db_path} of task {task.task_id} does not exist; "
                                "load the bank with its benchmark's folder (relative paths) or harvest it again "
                                "on this machine (`python -m jobs.harvest_slips`)")
            tasks.append(task)
            slips[task.task_id] = sqls
        if not tasks:
            raise DataError(f"slip bank {path} holds no task")
        return cls(tuple(tasks), slips)


def is_slip(message: str) -> bool:
    """True when SQLite's error ``message`` says the query names something the schema lacks."""
    text = message.lower()
    return any(e in text for e in SLIP_ERRORS)


def prepare_error(sandbox, sql: str) -> str | None:
    """The error the environment's sandbox (`bapsql.db.sandbox.Sandbox`, as the shield opens it) gives ``sql`` at
    prepare time (compiled with EXPLAIN, never run), or None when it would run."""
    from bapsql.errors import SQLExecutionError, SQLRejected

    try:
        sandbox.check(sql)
        return None
    except (SQLExecutionError, SQLRejected) as exc:
        return str(exc)


def first_query_errors(turns: Iterable[Mapping]) -> dict[str, list[str]]:
    """task_id -> distinct SQL of the episodes' first `execute_query` turns that ended in ``status == "error"``, in
    episode-id order. ``turns``: turn-log records (``episode_id``, ``task_id``, ``turn``, ``action``, ``sql``,
    ``status``) in any order. (The logs keep observation text for a sample of episodes only, so which error it was
    is decided again on the database: `harvest_slips`.)"""
    first: dict[str, Mapping] = {}
    for r in turns:
        if r["action"] != "execute_query":
            continue
        seen = first.get(r["episode_id"])
        if seen is None or int(r["turn"]) < int(seen["turn"]):
            first[r["episode_id"]] = r
    out: dict[str, list[str]] = {}
    for r in sorted(first.values(), key=lambda r: str(r["episode_id"])):
        sql = str(r["sql"] or "").strip()
        if sql and r["status"] == "error" and sql not in out.get(r["task_id"], []):
            out.setdefault(r["task_id"], []).append(sql)
    return out


def harvest_slips(runs: Sequence[tuple[str | Path, Sequence[Task]]]) -> SlipBank:
    """The bank of the slips in training-rollout turn logs. ``runs``: (a Parquet dataset of turn logs, the tasks
    its episodes played), e.g. one GRPO run and its prompts per seed; never validation or evaluation logs. A query
    on a task not given is dropped. Slips are first queries that failed and that SQLite refuses on the task's
    database for a name it lacks (`is_slip`). With several runs a task id gets the suffix ``.r<i>`` (GRPO seeds draw
    different questions under the same ids). `DataError` when there is no slip."""
    import pyarrow.dataset as ds

    from bapsql.db.sandbox import Sandbox

    cols = ["episode_id", "task_id", "turn", "action", "sql", "status"]
    tasks: list[Task] = []
    slips: dict[str, tuple[str, ...]] = {}
    for i, (d, played) in enumerate(runs):
        if not Path(d).exists():
            raise DataError(f"turn logs {d} do not exist")
        by_id = {t.task_id: t for t in played}
        found = first_query_errors(ds.dataset(str(d), format="parquet").to_table(columns=cols).to_pylist())
        for task_id in sorted(found):
            task = by_id.get(task_id)
            if task is None:
                continue
            with Sandbox(task.db_path) as sandbox:
                kept = tuple(s for s in found[task_id] if is_slip(prepare_error(sandbox, s) or ""))
            if kept:
                task = dataclasses.replace(task, task_id=f"{task_id}.r{i}") if len(runs) > 1 else task
                tasks.append(task)
                slips[task.task_id] = kept
    if not slips:
        raise DataError(f"no slips ({' / '.join(SLIP_ERRORS)} on a first query) on the given tasks in "
                        f"{[str(d) for d, _ in runs]}")
    return SlipBank(tuple(tasks), slips)
