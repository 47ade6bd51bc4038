"""The warm database-handle cache (bapsql/env/handles.py)."""

from __future__ import annotations

import pytest

from bapsql.env.handles import DatabaseHandles
from bapsql.errors import DatabaseError
from bapsql.tokens import RegexTokenCounter
from tests.env.people_db import build_people_db


def test_handles_are_cached_and_lru_closed(tmp_path):
    dbs = [build_people_db(tmp_path / f"p{i}.sqlite", n_people=10) for i in range(3)]
    with DatabaseHandles(RegexTokenCounter(), cache_dir=tmp_path / "cache", max_open=2) as hs:
        a = hs.get(dbs[0])
        assert hs.get(str(dbs[0])) is a and len(hs) == 1
        hs.get(dbs[1])
        hs.get(dbs[2])  # evicts dbs[0], the least recently used
        assert len(hs) == 2 and hs.get(dbs[0]) is not a
        assert hs.get(dbs[0]).sandbox.query("SELECT count(*) FROM city").rows == ((5,),)
    assert len(hs) == 0


def test_missing_database_raises_database_error(tmp_path):
    with pytest.raises(DatabaseError, match="not found"):
        DatabaseHandles(RegexTokenCounter(), cache_dir=tmp_path).get(tmp_path / "missing.sqlite")
