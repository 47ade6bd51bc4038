"""The benchmark folder format: round trip, malformed records listed (not dropped silently), split selection."""

from __future__ import annotations

import json
import sqlite3

import pytest

from bapsql.data.benchmark import (BENCHMARK_FILE, SPLITS_FILE, TASKS_FILE, task_from_json, task_to_json, write_json,
                                   write_tasks)
from bapsql.data.load import load_benchmark
from bapsql.errors import DataError
from bapsql.types import Answer, Task


def _folder(root, tasks, splits):
    (root / "databases" / "one").mkdir(parents=True)
    con = sqlite3.connect(root / "databases" / "one" / "one.sqlite")
    con.execute("CREATE TABLE t (x INTEGER)")
    con.commit()
    con.close()
    write_json(root / BENCHMARK_FILE, {"name": "mini", "kind": "demo", "version": 1, "seed": 0, "scale": "small",
                                       "generator_version": "test"})
    write_tasks(root / TASKS_FILE, tasks)
    write_json(root / SPLITS_FILE, {"seed": 0, "splits": splits})


def _task(i, db="one", gold=Answer("scalar", (1,))):
    return Task(task_id=f"t{i}", db_id=db, db_path=f"databases/{db}/{db}.sqlite", question=f"q{i}?",
                gold_sql="SELECT 1", gold=gold, evidence="e", tags=("a", "b"), naive_sql="SELECT x FROM t")


def test_task_json_round_trip():
    t = _task(1, gold=Answer("ordered_list", (("a", 1), ("b", 2))))
    assert task_from_json(json.loads(json.dumps(task_to_json(t)))) == t
    with pytest.raises(DataError, match="unknown fields"):
        task_from_json({**task_to_json(t), "extra": 1})
    with pytest.raises(DataError, match="lacks required"):
        task_from_json({"task_id": "x"})


def test_folder_load_lists_every_problem(tmp_path):
    _folder(tmp_path, [_task(1), _task(2), _task(3, db="missing"), _task(4, gold=None)],
            {"train": ["one"], "validation": [], "dev": ["missing"]})
    with open(tmp_path / TASKS_FILE, "a") as f:
        f.write("{not json\n")
    b = load_benchmark(tmp_path)
    assert [t.task_id for t in b.tasks] == ["t1", "t2"]
    assert b.tasks[0].db_path == str((tmp_path / "databases/one/one.sqlite").resolve())
    m = b.manifest
    assert m.missing_databases == ("missing",) and m.tasks_missing_database == ("t3",)
    reasons = dict(m.unreadable_files)
    assert set(reasons) == {f"{TASKS_FILE}#4", f"{TASKS_FILE}#5"} and "no gold" in reasons[f"{TASKS_FILE}#4"]
    assert m.records == 5
    assert list(b.splits) == ["train", "validation", "dev"]
    assert b.select("dev").tasks == () and len(b.select("train").tasks) == 2
    assert b.info["name"] == "mini"


def test_bad_benchmark_json_is_a_data_error(tmp_path):
    _folder(tmp_path, [_task(1)], {"train": ["one"]})
    (tmp_path / BENCHMARK_FILE).write_text('{"version": 99}')
    with pytest.raises(DataError, match="version"):
        load_benchmark(tmp_path)
    (tmp_path / BENCHMARK_FILE).write_text("{broken")
    with pytest.raises(DataError, match="cannot read JSON"):
        load_benchmark(tmp_path)
