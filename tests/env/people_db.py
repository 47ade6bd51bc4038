"""A small deterministic SQLite database for environment and CLI tests."""

from __future__ import annotations

import sqlite3
from pathlib import Path

CITIES = [(1, "Paris", "FR"), (2, "Lyon", "FR"), (3, "Berlin", "DE"), (4, "Hamburg", "DE"), (5, "Rome", "IT")]


def build_people_db(path: Path, n_people: int = 600) -> Path:
    """city(5 rows) and person(n_people rows, indexed on city_id) with a foreign key; deterministic values."""
    con = sqlite3.connect(path)
    con.executescript(
        """
        CREATE TABLE city (id INTEGER PRIMARY KEY, name TEXT NOT NULL, country TEXT);
        CREATE TABLE person (id INTEGER PRIMARY KEY, name TEXT, age INTEGER, city_id INTEGER REFERENCES city(id));
        CREATE INDEX ix_person_city ON person(city_id);
        """
    )
    con.executemany("INSERT INTO city VALUES (?, ?, ?)", CITIES)
    con.executemany(
        "INSERT INTO person VALUES (?, ?, ?, ?)",
        [(i, f"person number {i}", 18 + (i * 7) % 60, 1 + (i * 3) % 5) for i in range(1, n_people + 1)],
    )
    con.commit()
    con.close()
    return path
