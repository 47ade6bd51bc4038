"""Shape analysis and row estimates (bapsql/db/cardinality.py) against real executions on a small shop database."""

from __future__ import annotations

from pathlib import Path

import apsw
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bapsql.db.cardinality import INF, analyze
from bapsql.db.catalog import build_catalog
from tests.db.shop_db import build_shop

QUERIES = [
    "SELECT * FROM orders",
    "SELECT * FROM orders WHERE id = 17",
    "SELECT * FROM customers WHERE email = 'c5@shop.test'",
    "SELECT count(*) FROM orders",
    "SELECT status, count(*) FROM orders GROUP BY status",
    "SELECT customer_id, sum(amount) FROM orders GROUP BY customer_id HAVING sum(amount) > 5000",
    "SELECT * FROM orders WHERE status = 'lost'",
    "SELECT * FROM orders WHERE amount BETWEEN 100 AND 300",
    "SELECT * FROM orders WHERE amount > 950 ORDER BY amount LIMIT 10",
    "SELECT DISTINCT country FROM customers",
    "SELECT c.name, o.amount FROM customers c JOIN orders o ON o.customer_id = c.id WHERE c.country = 'FR'",
    "SELECT * FROM customers a, tags b",
    "SELECT name FROM customers WHERE country IS NULL",
    "SELECT name FROM customers WHERE id IN (1, 2, 3, 99999)",
    "SELECT name FROM customers WHERE id IN (SELECT customer_id FROM orders WHERE status = 'lost')",
    "SELECT status FROM orders UNION SELECT country FROM customers",
    "SELECT status FROM orders UNION ALL SELECT country FROM customers",
    "SELECT id FROM orders EXCEPT SELECT id FROM orders WHERE amount < 500",
    "WITH f AS (SELECT * FROM customers WHERE country = 'FR') SELECT count(*) FROM f JOIN orders o ON o.customer_id = f.id",
    "SELECT * FROM big_orders",
    "SELECT * FROM (SELECT customer_id, count(*) AS n FROM orders GROUP BY customer_id) WHERE n > 10",
    "SELECT name FROM customers WHERE name LIKE 'name1%'",
    "SELECT name FROM customers WHERE name LIKE '%9%'",
    "VALUES (1, 2), (3, 4)",
    "SELECT 1",
    "SELECT count(*) FROM orders WHERE status = \"done\"",
]


@pytest.fixture(scope="module")
def shop(tmp_path_factory) -> Path:
    return build_shop(tmp_path_factory.mktemp("card") / "shop.sqlite")


@pytest.fixture(scope="module")
def cat(shop):
    return build_catalog(shop)


@pytest.fixture(scope="module")
def conn(shop):
    c = apsw.Connection(str(shop), flags=apsw.SQLITE_OPEN_READONLY)
    yield c
    c.close()


def actual_rows(conn, sql: str) -> int:
    return len(conn.execute(sql).fetchall())


@pytest.mark.parametrize("sql", QUERIES)
def test_upper_bound_holds_and_exact_is_exact(cat, conn, sql):
    card = analyze(sql, cat).card
    n = actual_rows(conn, sql)
    assert n <= card.ub + 1e-9
    assert card.rows <= card.ub + 1e-9
    if card.exact:
        assert card.rows == pytest.approx(n)


def test_obvious_monotonicity(cat):
    assert analyze("SELECT * FROM orders WHERE id = 5", cat).card.ub == 1
    assert analyze("SELECT * FROM customers WHERE email = 'x'", cat).card.rows <= 1
    agg = analyze("SELECT count(*), avg(amount) FROM orders WHERE status = 'open'", cat).card
    assert agg.rows == 1 and agg.exact
    assert analyze("SELECT * FROM orders LIMIT 10", cat).card.rows <= 10
    cross = analyze("SELECT * FROM customers, orders", cat).card.rows
    assert cross >= 2_000 * 20_000 * 0.99
    filt = analyze("SELECT * FROM orders WHERE status = 'lost'", cat).card.rows
    assert filt == pytest.approx(1_000, rel=0.01)  # a top value: its exact frequency
    rng = analyze("SELECT * FROM orders WHERE amount < 250", cat).card.rows
    assert rng == pytest.approx(5_000, rel=0.1)  # quantile interpolation
    grp = analyze("SELECT status, count(*) FROM orders GROUP BY status", cat).card
    assert grp.rows == pytest.approx(3, rel=0.01) and grp.ub == 3


def test_join_estimate_and_fk_bound(cat, conn):
    sql = "SELECT * FROM orders o JOIN customers c ON c.id = o.customer_id"
    card = analyze(sql, cat).card
    assert card.rows == pytest.approx(20_000, rel=0.05)
    assert card.ub == 20_000  # each order matches at most one customer (unique key)


def test_double_quoted_value_is_a_string(cat):
    a = analyze('SELECT * FROM orders WHERE status = "lost"', cat).card.rows
    b = analyze("SELECT * FROM orders WHERE status = 'lost'", cat).card.rows
    assert a == b


def test_features(cat):
    f = analyze("SELECT DISTINCT c.country, count(*) FROM customers c LEFT JOIN orders o ON o.customer_id = c.id "
                "WHERE o.amount > 10 AND c.name LIKE 'a%' GROUP BY 1 HAVING count(*) > 2 ORDER BY 2 LIMIT 5 "
                "OFFSET 1", cat).features
    assert f["joins"] == 1 and f["left_joins"] == 1 and f["group_by"] == 1 and f["having"]
    assert f["distinct"] and f["order_by"] and f["limit"] == 5 and f["offset"] == 1
    assert f["like_filters"] == 1 and f["range_filters"] >= 1 and f["aggregates"] >= 1


def test_unknown_tables_and_garbage_fall_back(cat):
    a = analyze("SELECT * FROM nowhere", cat)
    assert a.card.rows > 0 and a.card.ub == INF and a.notes
    b = analyze("SELEC oops FROM (", cat)
    assert b.card.ub == INF and b.notes


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=80))
def test_analyze_never_raises(cat, text):
    a = analyze(text, cat)
    assert a.card.rows >= 0


def test_left_join_keeps_left_rows(cat, conn):
    sql = "SELECT c.id, t.tag FROM customers c LEFT JOIN tags t ON t.weight = c.id + 100"
    card = analyze(sql, cat).card
    assert actual_rows(conn, sql) == 2_000 <= card.ub
    assert card.rows >= 2_000 * 0.99
