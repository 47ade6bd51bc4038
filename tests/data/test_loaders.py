"""BIRD and Spider layouts built in tmp_path: detection, typed gold answers, and a manifest that accounts for every
record (missing databases, unreadable files, failing gold SQL, flags, cross-split duplicates)."""

from __future__ import annotations

import json
import sqlite3

import pytest

from bapsql.data.load import detect_layout, load_benchmark
from bapsql.errors import DataError
from bapsql.types import Answer


def make_db(path, n: int = 5) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT, price REAL)")
    con.executemany("INSERT INTO items VALUES (?, ?, ?)", [(i, f"item{i}", 1.5 * i) for i in range(1, n + 1)])
    con.commit()
    con.close()


def bird_record(qid, db, question, sql, evidence="", difficulty="simple"):
    return {"question_id": qid, "db_id": db, "question": question, "evidence": evidence, "SQL": sql,
            "difficulty": difficulty}


@pytest.fixture()
def bird(tmp_path):
    root = tmp_path / "bird"
    for db in ("shop", "school", "zoo", "bank"):
        make_db(root / "train" / "train_databases" / db / f"{db}.sqlite")
    make_db(root / "dev" / "dev_databases" / "farm" / "farm.sqlite", n=7)
    train = [bird_record(i, db, f"How many items are in {db} ({i})?", "SELECT COUNT(*) FROM items")
             for i, db in enumerate(("shop", "school", "zoo", "bank"))]
    train += [
        bird_record(10, "shop", "List the item names.", "SELECT name FROM items WHERE id <= 2"),
        bird_record(11, "ghost", "Anything?", "SELECT 1"),  # database missing
        bird_record(12, "zoo", "Broken query?", "SELECT nope FROM items"),  # gold fails
        bird_record(13, "bank", "Which item is most expensive?", "SELECT name FROM items ORDER BY price DESC LIMIT 1"),
        bird_record(14, "school", "What is the total price?", "SELECT SUM(price) FROM items", "price is in dollars"),
        bird_record(15, "zoo", "Same question in dev.", "SELECT 1"),
        {"question_id": 16, "db_id": "shop", "question": "no SQL field"},
    ]
    dev = [bird_record(100, "farm", "How many items does the farm have?", "SELECT COUNT(*) FROM items"),
           bird_record(101, "farm", "Top two prices, highest first?", "SELECT price FROM items ORDER BY price DESC "
                                                                     "LIMIT 2", difficulty="moderate"),
           bird_record(102, "farm", "Same question in dev.", "SELECT 2")]
    (root / "train" / "train.json").write_text(json.dumps(train))
    (root / "dev" / "dev.json").write_text(json.dumps(dev))
    (root / "train" / "train_tables.json").write_text("[]")
    (root / "notes.json").write_text("[{ this is not json")
    return root


@pytest.fixture()
def spider(tmp_path):
    root = tmp_path / "spider"
    for db in ("a", "b", "c", "d"):
        make_db(root / "database" / db / f"{db}.sqlite", n=3)
    (root / "tables.json").write_text(json.dumps([{"db_id": db} for db in "abcd"]))
    recs = [{"db_id": db, "question": f"How many items in {db} ?", "query": "SELECT count(*) FROM items"}
            for db in "abcd"]
    recs += [{"db_id": "a", "question": "Names  by price?", "query": "SELECT name FROM items ORDER BY price"},
             {"db_id": "b", "question": "All prices?", "query": "SELECT price FROM items"},
             {"db_id": "gone", "question": "Missing?", "query": "SELECT 1"},
             {"db_id": "c", "question": "Bad?", "query": "SELECT * FROM nowhere"}]
    (root / "train_spider.json").write_text(json.dumps(recs))
    return root


def test_detection(bird, spider, demo_small, tmp_path):
    assert detect_layout(bird) == "bird"
    assert detect_layout(spider) == "spider"
    assert detect_layout(demo_small) == "demo"
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="no known benchmark layout"):
        detect_layout(tmp_path / "empty")
    with pytest.raises(DataError, match="not found"):
        load_benchmark(tmp_path / "missing")


def test_bird_layout(bird, tmp_path):
    b = load_benchmark(bird, cache_dir=tmp_path / "cache")
    m = b.manifest
    assert b.kind == "bird" and m.layout == "bird"
    assert m.records == 13  # every well-formed record, whatever became of it
    assert m.missing_databases == ("ghost",) and m.tasks_missing_database == ("bird-train-11",)
    assert [f[0] for f in m.failed_gold] == ["bird-train-12"] and "nope" in m.failed_gold[0][1]
    unreadable = dict(m.unreadable_files)
    assert "notes.json" in unreadable and any(k.startswith("train/train.json#") for k in unreadable)
    assert m.duplicates == (("bird-train-15", "the same question appears in the dev split"),)
    by_id = {t.task_id: t for t in b.tasks}
    assert set(by_id) == {"bird-train-0", "bird-train-1", "bird-train-2", "bird-train-3", "bird-train-10",
                          "bird-train-13", "bird-train-14", "bird-dev-100", "bird-dev-101", "bird-dev-102"}
    assert by_id["bird-train-10"].gold == Answer("list", ("item1", "item2"))
    assert by_id["bird-dev-101"].gold == Answer("ordered_list", (10.5, 9.0))
    assert by_id["bird-train-14"].evidence == "price is in dollars"
    assert by_id["bird-dev-101"].difficulty == "moderate"
    assert "answer:scalar" in by_id["bird-dev-100"].tags
    # the official dev databases stay dev; the training databases are split into train / validation
    assert b.splits["dev"] == ("farm",)
    assert set(b.splits["train"]) | set(b.splits["validation"]) == {"shop", "school", "zoo", "bank"}
    assert b.splits["validation"] and b.splits["train"]
    assert {t.task_id for t in b.select("dev").tasks} == {"bird-dev-100", "bird-dev-101", "bird-dev-102"}
    assert all(t.db_path.endswith(".sqlite") and t.db_path.startswith("/") for t in b.tasks)


def test_spider_layout_and_cache(spider, tmp_path):
    b = load_benchmark(spider, cache_dir=tmp_path / "cache")
    m = b.manifest
    assert b.kind == "spider" and m.records == 8
    assert m.missing_databases == ("gone",) and len(m.failed_gold) == 1
    assert m.flagged == ()  # distinct prices: the ordered answer is determined
    t = next(t for t in b.tasks if t.question == "Names by price?")  # whitespace normalized
    assert t.gold == Answer("ordered_list", ("item1", "item2", "item3"))
    assert sorted(d for v in b.splits.values() for d in v) == ["a", "b", "c", "d"]
    assert all(b.splits[name] for name in ("train", "validation", "dev"))
    assert list((tmp_path / "cache" / "gold").glob("*.json"))  # gold results cached per database
    again = load_benchmark(spider, cache_dir=tmp_path / "cache")
    assert again.tasks == b.tasks and again.splits == b.splits


def test_split_argument_and_unknown_split(spider, tmp_path):
    b = load_benchmark(spider, split="dev", cache_dir=tmp_path / "cache")
    dev = set(b.splits["dev"])
    assert b.tasks and all(t.db_id in dev for t in b.tasks)
    with pytest.raises(DataError, match="unknown split"):
        load_benchmark(spider, split="holdout", cache_dir=tmp_path / "cache")
    test = load_benchmark(spider, split="test", cache_dir=tmp_path / "cache")  # in-domain held-out train tasks
    train = load_benchmark(spider, split="train", cache_dir=tmp_path / "cache")
    assert {t.db_id for t in test.tasks} <= set(b.splits["train"])
    assert {t.task_id for t in test.tasks}.isdisjoint(t.task_id for t in train.tasks)
