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
