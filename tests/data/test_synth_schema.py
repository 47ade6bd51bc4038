"""The table-spec builder: deterministic bytes, declared keys and indexes, skew, NULLs and dirty values."""

from __future__ import annotations

import hashlib
import sqlite3

import numpy as np
import pytest

from bapsql.data.synth_domains import DOMAINS, RETAIL
from bapsql.data.synth_schema import Col, Domain, Table, build_database, generate_column, zipf_weights


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_same_seed_same_bytes_other_seed_other_data(tmp_path):
    a, b, c = tmp_path / "a.sqlite", tmp_path / "b.sqlite", tmp_path / "c.sqlite"
    build_database(RETAIL, a, "small", seed=0)
    build_database(RETAIL, b, "small", seed=0)
    build_database(RETAIL, c, "small", seed=1)
    assert _sha(a) == _sha(b)
    assert _sha(a) != _sha(c)


def test_schema_keys_indexes_and_sizes(tmp_path):
    path = tmp_path / "retail.sqlite"
    sizes = build_database(RETAIL, path, "small", seed=0)
    con = sqlite3.connect(path)
    for t in RETAIL.tables:
        assert con.execute(f"SELECT COUNT(*) FROM {t.name}").fetchone()[0] == t.rows_small == sizes[t.name]
    fks = {(r[2], r[3]) for r in con.execute("PRAGMA foreign_key_list(orders)")}
    assert ("customers", "customer_id") in fks
    indexed = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    assert "idx_orders_customer_id" in indexed and "idx_order_items_product_id" not in indexed
    # every foreign key points at an existing parent row
    orphans = con.execute("SELECT COUNT(*) FROM orders o LEFT JOIN customers c ON o.customer_id = c.id "
                          "WHERE c.id IS NULL").fetchone()[0]
    assert orphans == 0
    # NULLs and dirty values are present where the spec asks for them
    assert con.execute("SELECT COUNT(*) FROM customers WHERE age IS NULL").fetchone()[0] > 0
    dirty = "SELECT COUNT(*) FROM customers WHERE city <> TRIM(city) OR city = UPPER(city)"
    assert con.execute(dirty).fetchone()[0] > 0
    assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_every_domain_has_foreign_keys_and_a_big_table_at_full_scale():
    assert len(DOMAINS) >= 8
    assert len({d.db_id for d in DOMAINS}) == len(DOMAINS)
    for d in DOMAINS:
        assert any(c.kind == "fk" for t in d.tables for c in t.cols), d.db_id
        assert max(t.rows_full for t in d.tables) >= 100_000, d.db_id
        assert max(t.rows_small for t in d.tables) <= 20_000, d.db_id
        names = [t.name for t in d.tables]
        for i, t in enumerate(d.tables):  # parents come before children
            for c in t.cols:
                if c.kind == "fk":
                    assert c.ref in names[:i], (d.db_id, t.name, c.name)


def test_zipf_skew_and_value_draws():
    w = zipf_weights(10, 1.2)
    assert w.shape == (10,) and np.isclose(w.sum(), 1.0) and np.all(np.diff(w) < 0)
    rng = np.random.default_rng(0)
    vals = generate_column(Col("c", "cat", values=tuple("abcdef"), zipf=1.5, na=0.1), 5000, rng, {})
    counts = {v: vals.count(v) for v in set(vals)}
    assert counts["a"] > counts["b"] > counts["f"]
    assert 300 < counts["N/A"] < 700
    fk = generate_column(Col("p", "fk", ref="parent", zipf=1.0), 2000, rng, {"parent": 50})
    assert min(fk) >= 1 and max(fk) <= 50


def test_unique_names_cannot_exceed_their_combinations(tmp_path):
    col = Col("name", "name", unique=True, words=(("a", "b"), ("x", "y")))
    bad = Domain("tiny", "t", (Table("t", "t", "ts", 5, 5, (Col("id", "pk"), col)),))
    with pytest.raises(ValueError, match="unique names"):
        build_database(bad, tmp_path / "t.sqlite", "small", 0)
