"""Catalog contents, sampling, JSON round trip (bapsql/db/catalog.py) and the fingerprinted cache
(bapsql/db/catalog_cache.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import apsw
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bapsql.db import catalog as catalog_mod
from bapsql.db import catalog_cache
from bapsql.db.catalog import Catalog, build_catalog, distinct_duj1
from bapsql.db.catalog_cache import catalog_cache_path, fingerprint, load_or_build_catalog
from bapsql.db.rows import cell_text
from bapsql.errors import DatabaseError
from tests.db.shop_db import STATUS_SHARES, build_shop


@pytest.fixture(scope="module")
def shop(tmp_path_factory) -> Path:
    return build_shop(tmp_path_factory.mktemp("cat") / "shop.sqlite")


@pytest.fixture(scope="module")
def cat(shop) -> Catalog:
    return build_catalog(shop)


def test_tables_rows_and_columns(cat):
    assert set(cat.table_names) == {"customers", "orders", "tags"}
    orders = cat.table("ORDERS")  # case-insensitive
    assert orders.rows == 20_000 and not orders.sampled and orders.sample_rows == 20_000
    assert [c.name for c in orders.columns] == ["id", "customer_id", "status", "amount", "created"]
    idc = orders.column("id")
    assert idc.pk == 1 and idc.type == "INTEGER" and idc.distinct == 20_000 and idc.nulls == 0
    assert orders.column("customer_id").notnull
    assert orders.column("status").distinct == 3
    assert cat.table("customers").column("country").nulls == 200
    assert cat.table("customers").column("email").distinct == 2_000


def test_widths_match_cell_text(cat, shop):
    conn = apsw.Connection(str(shop), flags=apsw.SQLITE_OPEN_READONLY)
    amounts = [r[0] for r in conn.execute("SELECT amount FROM orders")]
    expected = sum(len(cell_text(v)) for v in amounts) / len(amounts)
    got = cat.table("orders").column("amount").avg_width
    assert abs(got - expected) / expected < 0.05  # measured on a 2,000-value subsample
    country = cat.table("customers").column("country")  # 10% NULL (4 chars), else FR / US (2 chars)
    assert abs(country.avg_width - 2.2) < 0.01


def test_top_values_of_skewed_column(cat):
    status = cat.table("orders").column("status")
    top = dict(status.top)
    for value, share in STATUS_SHARES.items():
        assert top[value] == round(share * 20_000)
    assert status.quantiles and isinstance(status.quantiles[0], str)
    amount = cat.table("orders").column("amount")
    assert amount.numeric and amount.quantiles[0] == 0.5 and amount.quantiles[-1] == 999.5


def test_indexes_foreign_keys_views(cat):
    orders = cat.table("orders")
    ix = {i.name: i for i in orders.indexes}
    assert ix["orders_customer"].columns == ("customer_id",) and not ix["orders_customer"].unique
    email_ix = [i for i in cat.table("customers").indexes if i.columns == ("email",)]
    assert email_ix and email_ix[0].unique
    assert orders.foreign_keys[0].columns == ("customer_id",)
    assert orders.foreign_keys[0].ref_table == "customers" and orders.foreign_keys[0].ref_columns == ("id",)
    assert cat.table("tags").without_rowid and cat.table("tags").rows == 3
    assert "amount > 900" in cat.view_sql("big_orders")
    name, index = cat.by_rootpage(ix["orders_customer"].rootpage)
    assert (name, index) == ("orders", "orders_customer")


def test_json_round_trip(cat):
    again = Catalog.from_json(json.loads(json.dumps(cat.to_json())))
    assert again == cat
    assert again.table("orders").column("status").top == cat.table("orders").column("status").top


def test_sampled_statistics(tmp_path, monkeypatch):
    db = build_shop(tmp_path / "big.sqlite", n_orders=60_000)
    monkeypatch.setattr(catalog_mod, "EXACT_ROWS", 10_000)
    monkeypatch.setattr(catalog_mod, "SAMPLE_ROWS", 6_000)
    orders = build_catalog(db).table("orders")
    assert orders.sampled and orders.rows == 60_000  # row counts stay exact
    assert 3_000 < orders.sample_rows < 12_000
    assert abs(orders.column("id").distinct - 60_000) / 60_000 < 0.1  # all distinct: Duj1 recovers N
    assert orders.column("status").distinct == 3
    assert abs(dict(orders.column("status").top)["done"] / 60_000 - 0.8) < 0.05
    tags = build_catalog(db).table("tags")
    assert not tags.sampled


@given(st.integers(1, 10_000), st.data())
def test_duj1_is_bounded_and_exact_on_full_scans(n, data):
    total = data.draw(st.integers(n, 100_000))
    d = data.draw(st.integers(1, n))
    f1 = data.draw(st.integers(0, d))
    est = distinct_duj1(n, d, f1, total)
    assert d <= est <= total
    assert distinct_duj1(n, d, f1, n) == d


def test_cache_reuse_and_invalidation(shop, tmp_path):
    db = tmp_path / "copy.sqlite"
    db.write_bytes(shop.read_bytes())
    first = load_or_build_catalog(db, tmp_path / "cache")
    path = catalog_cache_path(db, tmp_path / "cache")
    assert path.is_file() and json.loads(path.read_text())["fingerprint"] == fingerprint(db)
    stamp = path.stat().st_mtime_ns
    again = load_or_build_catalog(db, tmp_path / "cache")
    assert again == first and path.stat().st_mtime_ns == stamp  # served from the cache
    conn = apsw.Connection(str(db))
    conn.execute("INSERT INTO tags VALUES ('zz', 9)")
    conn.close()
    os.utime(db, ns=(stamp + 10**9, stamp + 10**9))
    changed = load_or_build_catalog(db, tmp_path / "cache")
    assert changed.table("tags").rows == 4 and changed.fingerprint != first.fingerprint


def test_unwritable_cache_still_returns_catalog(shop, tmp_path):
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("x")
    cat = load_or_build_catalog(shop, blocker)
    assert cat.table("orders").rows == 20_000


def test_corrupt_cache_entry_is_rebuilt(shop, tmp_path):
    path = catalog_cache_path(shop, tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    assert load_or_build_catalog(shop, tmp_path).table("customers").rows == 2_000
    assert json.loads(path.read_text())["tables"]


def test_unreadable_files_raise_database_error(tmp_path):
    with pytest.raises(DatabaseError):
        load_or_build_catalog(tmp_path / "missing.sqlite", tmp_path)
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"this is not a database" * 100)
    with pytest.raises(DatabaseError):
        build_catalog(junk)


def test_default_cache_dir_honours_env(monkeypatch, tmp_path):
    monkeypatch.setenv("BAPSQL_CACHE_DIR", str(tmp_path / "c"))
    assert catalog_cache.default_cache_dir() == tmp_path / "c"
    assert catalog_cache_path("x.sqlite").parent == tmp_path / "c" / "catalogs"


def test_a_catalog_of_another_format_is_refused_so_the_cache_rebuilds_it(tmp_path):
    """Quantile boundaries mean other levels in another catalog version: `Catalog.from_json` refuses it, and
    `load_or_build_catalog` rebuilds a cache entry written by one."""
    import json

    from bapsql.db.catalog import CATALOG_VERSION, QUANTILE_LEVELS, Catalog
    from bapsql.db.catalog_cache import catalog_cache_path, load_or_build_catalog
    from tests.db.shop_db import build_shop

    db = build_shop(tmp_path / "shop.sqlite")
    cat = load_or_build_catalog(db, tmp_path / "cache")
    amount = cat.table("orders").column("amount")
    assert len(amount.quantiles) == len(QUANTILE_LEVELS) and list(amount.quantiles) == sorted(amount.quantiles)
    old = {**cat.to_json(), "version": CATALOG_VERSION - 1}
    with pytest.raises(ValueError, match="catalog format"):
        Catalog.from_json(old)
    cache = catalog_cache_path(db, tmp_path / "cache")
    cache.write_text(json.dumps(old))
    assert load_or_build_catalog(db, tmp_path / "cache").version == CATALOG_VERSION
