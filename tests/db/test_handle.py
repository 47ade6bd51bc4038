"""open_database bundles sandbox, catalog, estimator and shield (bapsql/db/handle.py)."""

from __future__ import annotations

import pytest

from bapsql.db.calibration import Calibration, load_calibration
from bapsql.db.catalog_cache import catalog_cache_path
from bapsql.db.handle import DatabaseHandle, default_counter, open_database
from bapsql.db.shield import Caps
from bapsql.errors import DatabaseError
from bapsql.tokens import DEFAULT_TOKENIZER_DIR, HFTokenCounter, RegexTokenCounter, TokenCounter
from tests.db.shop_db import build_shop


def test_open_database_bundles_everything(tmp_path):
    db = build_shop(tmp_path / "shop.sqlite", n_orders=2_000)
    counter = RegexTokenCounter()
    h = open_database(db, token_counter=counter, cache_dir=tmp_path / "cache")
    assert isinstance(h, DatabaseHandle) and h.path == db.resolve()
    assert catalog_cache_path(db, tmp_path / "cache").is_file()
    assert h.catalog.table("orders").rows == 2_000
    assert h.estimator.calibration == load_calibration()  # the packaged default
    est = h.estimator.estimate("SELECT * FROM orders WHERE id = 3", vm_step_cap=10_000)
    assert est.error is None and est.rows.p95 <= 1
    res = h.shield.execute("SELECT * FROM orders WHERE id = 3", Caps(vm_steps=10_000, result_tokens=1_000))
    assert res.status == "ok" and len(res.rows) == 1
    h.close()
    h.close()  # idempotent


def test_custom_calibration_and_context_manager(tmp_path):
    db = build_shop(tmp_path / "shop.sqlite", n_orders=500)
    with open_database(db, token_counter=RegexTokenCounter(), calibration=Calibration.identity(),
                       cache_dir=tmp_path) as h:
        e = h.estimator.estimate("SELECT * FROM customers", vm_step_cap=100_000)
        assert e.rows.p50 == e.rows.p95 == 2_000


def test_missing_or_broken_database(tmp_path):
    with pytest.raises(DatabaseError):
        open_database(tmp_path / "nope.sqlite", token_counter=RegexTokenCounter(), cache_dir=tmp_path)
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"not sqlite" * 500)
    with pytest.raises(DatabaseError):
        open_database(junk, token_counter=RegexTokenCounter(), cache_dir=tmp_path)


def test_default_counter_prefers_the_packaged_tokenizer():
    c = default_counter()
    assert isinstance(c, TokenCounter) and c.count("SELECT 1") > 0
    expected = HFTokenCounter if (DEFAULT_TOKENIZER_DIR / "tokenizer.json").is_file() else RegexTokenCounter
    assert isinstance(c, expected)
