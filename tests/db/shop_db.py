"""A small shop database built in a temp folder for the catalog / estimator tests (real SQLite, no mocks).

``customers`` (2,000 rows: unique ``email``, 10% NULL ``country``), ``orders`` (``n_orders`` rows: skewed ``status``,
indexed ``customer_id`` foreign key), ``tags`` (a WITHOUT ROWID table) and a view.
"""

from __future__ import annotations

from pathlib import Path

import apsw

STATUS_SHARES = {"done": 0.80, "open": 0.15, "lost": 0.05}  # orders.status: x % 100 < 80 / < 95 / else


def build_shop(path: Path, n_orders: int = 20_000, n_customers: int = 2_000) -> Path:
    conn = apsw.Connection(str(path))
    conn.execute(
        f"""
        CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT NOT NULL, email TEXT UNIQUE, country TEXT);
        CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER NOT NULL REFERENCES customers(id),
                             status TEXT, amount REAL, created INTEGER);
        CREATE INDEX orders_customer ON orders(customer_id);
        CREATE TABLE tags (tag TEXT PRIMARY KEY, weight INTEGER) WITHOUT ROWID;
        CREATE VIEW big_orders AS SELECT * FROM orders WHERE amount > 900;
        BEGIN;
        WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < {n_customers})
        INSERT INTO customers SELECT x, 'name' || (x % 500), 'c' || x || '@shop.test',
            CASE WHEN x % 10 = 0 THEN NULL WHEN x % 10 < 4 THEN 'FR' ELSE 'US' END FROM c;
        WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < {n_orders})
        INSERT INTO orders SELECT x, 1 + (x * 7919) % {n_customers},
            CASE WHEN x % 100 < 80 THEN 'done' WHEN x % 100 < 95 THEN 'open' ELSE 'lost' END,
            (x * 37) % 1000 + 0.5, 1000 + x FROM c;
        INSERT INTO tags VALUES ('a', 1), ('b', 2), ('c', 3);
        COMMIT;
        """
    ).fetchall()
    conn.close()
    return path
