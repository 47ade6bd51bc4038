"""A tiny benchmark folder (the embedded-benchmark format) built in tmp_path for the policy, runner and CLI tests.

Two real SQLite databases — ``shop`` (train split) and ``library`` (dev split) — with a few thousand rows, so a
naive row listing overflows the XS/S result-token budgets while the gold aggregate fits. Gold answers are computed by
executing the gold SQL (stdlib sqlite3, at build time) and typed with `bapsql.data.gold.answer_from_rows`.
"""

from __future__ import annotations

import json
import random
import sqlite3
from pathlib import Path

from bapsql.data.benchmark import write_json, write_tasks
from bapsql.data.gold import answer_from_rows
from bapsql.types import Task

CITIES = ("Lakeport", "Rivertown", "Hillview", "Oakbury", "Westfield")
STATUSES = ("shipped", "pending", "returned", "cancelled")
GENRES = ("fiction", "history", "science", "poetry", "travel")


def _shop(path: Path, rng: random.Random) -> None:
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT, city TEXT, tier TEXT)")
    con.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER REFERENCES customers(id), "
                "amount REAL, status TEXT, day TEXT)")
    con.executemany("INSERT INTO customers VALUES (?,?,?,?)",
                    [(i, f"Customer {i:03d}", rng.choice(CITIES), rng.choice(("gold", "silver", "basic")))
                     for i in range(1, 201)])
    con.executemany("INSERT INTO orders VALUES (?,?,?,?,?)",
                    [(i, rng.randint(1, 200), round(rng.uniform(5, 500), 2),
                      rng.choices(STATUSES, (6, 2, 1, 1))[0], f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}")
                     for i in range(1, 3001)])
    con.execute("CREATE INDEX orders_status ON orders(status)")
    con.commit()
    con.close()


def _library(path: Path, rng: random.Random) -> None:
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE books (id INTEGER PRIMARY KEY, title TEXT, genre TEXT, year INTEGER, pages INTEGER)")
    con.execute("CREATE TABLE loans (id INTEGER PRIMARY KEY, book_id INTEGER REFERENCES books(id), member TEXT, "
                "days INTEGER)")
    con.executemany("INSERT INTO books VALUES (?,?,?,?,?)",
                    [(i, f"Book {i:04d}", rng.choice(GENRES), rng.randint(1900, 2023), rng.randint(80, 900))
                     for i in range(1, 1501)])
    con.executemany("INSERT INTO loans VALUES (?,?,?,?)",
                    [(i, rng.randint(1, 1500), f"member{rng.randint(1, 300)}", rng.randint(1, 60))
                     for i in range(1, 2501)])
    con.commit()
    con.close()


# (db, question, gold SQL, naive SQL)
QUESTIONS: tuple[tuple[str, str, str, str], ...] = (
    ("shop", "How many orders were shipped?",
     "SELECT COUNT(*) FROM orders WHERE status = 'shipped'", "SELECT * FROM orders WHERE status = 'shipped'"),
    ("shop", "What is the average amount of returned orders? Round to 2 decimals.",
     "SELECT ROUND(AVG(amount), 2) FROM orders WHERE status = 'returned'",
     "SELECT amount FROM orders WHERE status = 'returned'"),
    ("shop", "Which 3 customers placed the most orders (ties by name)?",
     "SELECT c.name FROM orders o JOIN customers c ON o.customer_id = c.id GROUP BY c.id "
     "ORDER BY COUNT(*) DESC, c.name LIMIT 3",
     "SELECT c.name, o.id FROM orders o JOIN customers c ON o.customer_id = c.id"),
    ("shop", "Which cities have gold-tier customers?",
     "SELECT DISTINCT city FROM customers WHERE tier = 'gold'", "SELECT * FROM customers WHERE tier = 'gold'"),
    ("shop", "What is the largest order amount?", "SELECT MAX(amount) FROM orders", "SELECT amount FROM orders"),
    ("shop", "How many customers live in Lakeport?",
     "SELECT COUNT(*) FROM customers WHERE city = 'Lakeport'", "SELECT * FROM customers WHERE city = 'Lakeport'"),
    ("library", "How many books are poetry?",
     "SELECT COUNT(*) FROM books WHERE genre = 'poetry'", "SELECT * FROM books WHERE genre = 'poetry'"),
    ("library", "What is the average number of pages of history books? Round to 2 decimals.",
     "SELECT ROUND(AVG(pages), 2) FROM books WHERE genre = 'history'",
     "SELECT pages FROM books WHERE genre = 'history'"),
    ("library", "List the genres by number of books, most first.",
     "SELECT genre FROM books GROUP BY genre ORDER BY COUNT(*) DESC, genre", "SELECT genre FROM books"),
    ("library", "What is the longest loan in days?", "SELECT MAX(days) FROM loans", "SELECT days FROM loans"),
    ("library", "How many loans lasted more than 50 days?",
     "SELECT COUNT(*) FROM loans WHERE days > 50", "SELECT * FROM loans WHERE days > 50"),
    ("library", "Which books published from 1950 to 1955 have more than 800 pages?",
     "SELECT title FROM books WHERE year BETWEEN 1950 AND 1955 AND pages > 800",
     "SELECT * FROM books WHERE year BETWEEN 1950 AND 1955"),
)


def build_minibench(root: Path, seed: int = 0) -> Path:
    """Write the benchmark folder under ``root`` (created) and return it."""
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    paths = {}
    for db, build in (("shop", _shop), ("library", _library)):
        folder = root / "databases" / db
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{db}.sqlite"
        if path.exists():
            path.unlink()
        build(path, rng)
        paths[db] = path
    tasks = []
    for i, (db, question, gold_sql, naive_sql) in enumerate(QUESTIONS):
        con = sqlite3.connect(paths[db])
        cur = con.execute(gold_sql)
        cols, rows = [d[0] for d in cur.description], cur.fetchall()
        con.close()
        tasks.append(Task(task_id=f"{db}-{i:02d}", db_id=db, db_path=f"databases/{db}/{db}.sqlite",
                          question=question, gold_sql=gold_sql, gold=answer_from_rows(gold_sql, cols, rows),
                          naive_sql=naive_sql, source="minibench"))
    write_tasks(root / "tasks.jsonl", tasks)
    write_json(root / "benchmark.json", {"name": "minibench", "kind": "demo", "version": 1, "seed": seed,
                                         "scale": "mini", "generator_version": "test"})
    write_json(root / "splits.json", {"seed": seed, "splits": {"train": ["shop"], "validation": [],
                                                               "dev": ["library"]}})
    (root / "manifest.json").write_text(json.dumps({"databases": sorted(paths)}) + "\n")
    return root


def build_minibench_with_empty_gold(root: Path) -> Path:
    """The mini benchmark plus two tasks whose gold query returns no rows: ``shop-empty`` (train databases) and
    ``library-empty`` (dev). Returns ``root``."""
    import dataclasses

    from bapsql.data.load import load_benchmark
    from bapsql.types import Answer

    build_minibench(root)
    tasks = list(load_benchmark(root).tasks)
    shop = next(t for t in tasks if t.db_id == "shop")
    lib = next(t for t in tasks if t.db_id == "library")
    extra = [dataclasses.replace(shop, task_id="shop-empty", question="Which orders cost more than 10000?",
                                 gold_sql="SELECT id FROM orders WHERE amount > 10000", gold=Answer("list", ())),
             dataclasses.replace(lib, task_id="library-empty", question="Which books have 0 pages?",
                                 gold_sql="SELECT title FROM books WHERE pages = 0", gold=Answer("list", ()))]
    write_tasks(root / "tasks.jsonl", [dataclasses.replace(t, db_path=f"databases/{t.db_id}/{t.db_id}.sqlite")
                                       for t in tasks + extra])
    return root
