"""Selectivity primitives (bapsql/db/selectivity.py) against exact counts of a small shop database."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bapsql.db.catalog import build_catalog
from bapsql.db.selectivity import (coerce, eq_sel, join_sel, like_sel, occupancy, range_sel, ref_from_stats,
                                   value_key)
from tests.db.shop_db import build_shop


@pytest.fixture(scope="module")
def cat(tmp_path_factory):
    return build_catalog(build_shop(tmp_path_factory.mktemp("sel") / "shop.sqlite"))


def col(cat, table, name):
    t = cat.table(table)
    return ref_from_stats(t.column(name), t)


def test_equality_uses_frequencies_and_proves_absence(cat):
    status = col(cat, "orders", "status")
    assert eq_sel(status, "done") == pytest.approx(0.80)
    assert eq_sel(status, "lost") == pytest.approx(0.05)
    assert eq_sel(status, "never") == 0.0  # every value is known (exact catalog)
    assert eq_sel(status, None) == 0.0
    email = col(cat, "customers", "email")
    assert email.unique and eq_sel(email, "c1@shop.test") == pytest.approx(1 / 2_000)


def test_ranges_and_like(cat):
    amount = col(cat, "orders", "amount")  # (x * 37) % 1000 + 0.5: uniform over 0.5 .. 999.5
    assert range_sel(amount, 250, "<") == pytest.approx(0.25, abs=0.03)
    assert range_sel(amount, 250, ">=") == pytest.approx(0.75, abs=0.03)
    assert range_sel(amount, 5000, ">") == 0.0
    name = col(cat, "customers", "name")  # 'name' || (x % 500)
    assert like_sel(name, "name1%") == pytest.approx(111 / 500, abs=0.06)
    assert like_sel(name, "%zz%") < 0.1 and like_sel(name, "%am%") > 0.8


@given(st.floats(0.1, 1e6), st.floats(0, 1e7))
def test_occupancy_is_bounded(d, r):
    v = occupancy(d, r)
    assert 0 <= v <= min(d, r) + 1e-6


def test_join_sel_with_frequency_lists(cat):
    o, c = cat.table("orders"), cat.table("customers")
    fk, pk = ref_from_stats(o.column("customer_id"), o), ref_from_stats(c.column("id"), c)
    assert join_sel(fk, pk) * o.rows * c.rows == pytest.approx(20_000, rel=0.05)
    s1 = ref_from_stats(o.column("status"), o)
    assert join_sel(s1, s1) * o.rows * o.rows == pytest.approx(16_000**2 + 3_000**2 + 1_000**2, rel=0.01)


def test_affinity_coercion():
    assert coerce("12", "integer") == 12 and coerce("1.5", "real") == 1.5 and coerce("x", "integer") == "x"
    assert coerce(7, "text") == "7" and coerce(7, "blob") == 7
    assert value_key(1) == value_key(1.0) and value_key("1") != value_key(1)


@pytest.fixture(scope="module")
def skewed(tmp_path_factory):
    """13,000 prices with a long right tail (99 % within 6-30, 1 % spread over 30-53) and 400 cities written with
    stray case and spaces, 10 of them frequent: the shapes of the embedded benchmark's long-list filters."""
    import sqlite3

    path = tmp_path_factory.mktemp("skew") / "tickets.sqlite"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE tickets (id INTEGER PRIMARY KEY, price REAL, city TEXT)")
    rows = []
    for i in range(13_000):
        u = ((i * 7919) % 13_000) / 13_000  # a fixed permutation of 0 .. 1
        price = 6.0 + 24.0 * u / 0.99 if u < 0.99 else 30.0 + (u - 0.99) / 0.01 * 23.0
        c = i % 400 if i % 3 == 0 else i % 10  # ten frequent cities, 390 rare ones
        city = (f"  City{c} " if i % 2 else f"city{c}") if c % 2 else f"CITY{c}"
        rows.append((i, round(price, 2), city))
    con.executemany("INSERT INTO tickets VALUES (?, ?, ?)", rows)
    con.commit()
    return con, build_catalog(path)


@pytest.mark.parametrize("threshold", [40.0, 45.0, 50.0, 6.5, 7.0])
def test_tail_ranges_follow_the_data(skewed, threshold):
    """Quantile boundaries are finer in the tails: a filter keeping well under 5 % of a skewed column is estimated
    within a factor of 2 of its count (5 % steps put ``price > 45`` at 212 rows against 45)."""
    con, cat = skewed
    price = col(cat, "tickets", "price")
    for op in (">", "<"):
        (n,) = con.execute(f"SELECT COUNT(*) FROM tickets WHERE price {op} ?", (threshold,)).fetchone()
        est = range_sel(price, threshold, op) * 13_000
        if 10 <= n < 650:  # the tails
            assert n / 2 - 2 <= est <= 2 * n + 2, (op, threshold, n, est)


def test_a_folded_equality_reads_the_folded_frequencies(skewed):
    """`LOWER(TRIM(city)) = 'city4'` counts every spelling of city4 (frequent); a rare city's share is one distinct
    value's share of the rest, not a fixed 10 %."""
    from bapsql.db.cardinality import analyze

    con, cat = skewed
    for value in ("city4", "city5", "city101"):
        sql = f"SELECT id FROM tickets WHERE LOWER(TRIM(city)) = '{value}'"
        (n,) = con.execute(f"SELECT COUNT(*) FROM ({sql})").fetchone()
        est = analyze(sql, cat).card.rows
        assert n / 2 - 2 <= est <= 2 * n + 5, (value, n, est)
    neq = analyze("SELECT id FROM tickets WHERE UPPER(city) <> 'CITY4'", cat).card.rows
    (n,) = con.execute("SELECT COUNT(*) FROM tickets WHERE UPPER(city) <> 'CITY4'").fetchone()
    assert neq == pytest.approx(n, rel=0.1)
