"""Typed gold answers: kinds from the outermost ORDER BY, flags for unusable or non-deterministic results, the
disk cache, and BIRD's official EX."""

from __future__ import annotations

import sqlite3

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bapsql.data.cache import GoldCache, file_fingerprint
from bapsql.data.gold import answer_from_rows, derive_gold, order_matters
from bapsql.env.outcome import official_ex
from bapsql.db.sandbox import Sandbox
from bapsql.tokens import load_token_counter
from bapsql.types import Answer

COUNTER = load_token_counter("regex")


@pytest.fixture()
def db(tmp_path):
    path = tmp_path / "g.sqlite"
    con = sqlite3.connect(path)
    con.executescript("""
        CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT, grp TEXT, score INTEGER, pic BLOB);
        INSERT INTO t VALUES (1, 'a', 'x', 10, x'0102'), (2, 'b', 'x', 20, NULL), (3, 'c', 'y', 20, NULL),
                             (4, 'd', 'y', 30, NULL), (5, 'e', 'z', 5, NULL);
        CREATE TABLE big (n INTEGER);
        WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM c WHERE n < 150) INSERT INTO big SELECT n FROM c;
    """)
    con.commit()
    con.close()
    with Sandbox(path) as sb:
        yield sb


def _gold(sb, sql, cache=None):
    return derive_gold(sb, sql, token_counter=COUNTER, cache=cache)


def test_answer_kinds(db):
    assert _gold(db, "SELECT COUNT(*) FROM t").answer == Answer("scalar", (5,))
    assert _gold(db, "SELECT name FROM t WHERE grp = 'x'").answer == Answer("list", ("a", "b"))
    assert _gold(db, "SELECT name FROM t ORDER BY id DESC LIMIT 3").answer == Answer("ordered_list", ("e", "d", "c"))
    multi = _gold(db, "SELECT name, score FROM t WHERE grp = 'y'").answer
    assert multi == Answer("list", (("c", 20), ("d", 30)))
    # ORDER BY inside a subquery does not make order part of the answer
    sub = "SELECT name FROM (SELECT name FROM t ORDER BY score DESC LIMIT 2)"
    assert not order_matters(sub) and _gold(db, sub).answer.kind == "list"
    assert order_matters("SELECT a FROM x UNION SELECT b FROM y ORDER BY 1")
    assert _gold(db, "SELECT pic FROM t WHERE id = 1").answer == Answer("scalar", ("<blob 2 bytes>",))
    assert answer_from_rows("SELECT a, b FROM x", ["a", "b"], [(1, 2)]).kind == "list"


@pytest.mark.parametrize("sql, code", [
    ("SELECT name FROM t ORDER BY score DESC LIMIT 2", "ties_at_limit"),  # 20 and 20 straddle the cut
    ("SELECT grp FROM t GROUP BY grp ORDER BY COUNT(*) DESC LIMIT 1", "ties_at_limit"),  # x and y both twice
    ("SELECT name FROM t ORDER BY score", "order_ties"),  # b and c tie on 20
    ("SELECT name FROM t LIMIT 2", "limit_without_order"),
    ("SELECT n FROM big", "too_large"),
    ("SELECT name FROM t WHERE score > 100", "empty"),
    ("SELECT name FROM t WHERE date('now') > '2000-01-01' AND id = 1", "clock"),
])
def test_flags(db, sql, code):
    assert code in {f.code for f in _gold(db, sql).flags}


@pytest.mark.parametrize("sql", [
    "SELECT name FROM t ORDER BY score DESC LIMIT 1",  # 30 is alone at the top
    "SELECT name FROM t ORDER BY score DESC, name LIMIT 2",  # the second key breaks the tie
    "SELECT name, score AS s FROM t ORDER BY s, name",
    "SELECT name FROM t ORDER BY 1",
    "SELECT name FROM t WHERE id = 1 LIMIT 1",
    "SELECT grp, COUNT(*) AS c FROM t GROUP BY grp ORDER BY c DESC, grp",
])
def test_deterministic_queries_carry_no_flag(db, sql):
    g = _gold(db, sql)
    assert g.ok and g.flags == ()


def test_failures_are_results_not_exceptions(db):
    g = _gold(db, "SELECT nope FROM t")
    assert not g.ok and g.answer is None and "nope" in g.error
    assert not _gold(db, "DELETE FROM t").ok
    capped = derive_gold(db, "SELECT COUNT(*) FROM big a, big b, big c", token_counter=COUNTER, vm_step_cap=10_000)
    assert capped.interrupted and not capped.ok and "cap" in capped.error


def test_cache_round_trip_and_fingerprint(db, tmp_path):
    cache = GoldCache(tmp_path / "cache")
    sql = "SELECT name, score FROM t ORDER BY score DESC LIMIT 1"
    first = _gold(db, sql, cache)
    cache.flush()
    files = list((tmp_path / "cache" / "gold").glob("*.json"))
    assert len(files) == 1
    reread = GoldCache(tmp_path / "cache")
    key = reread.key(sql, token_counter=COUNTER.name, vm_step_cap=200_000_000)
    assert reread.get(db.path, key) is not None
    assert _gold(db, sql, reread) == first
    # a database with other contents has another fingerprint, so it never reuses these entries
    other = tmp_path / "other.sqlite"
    con = sqlite3.connect(other)
    con.execute("CREATE TABLE t (id INTEGER)")
    con.commit()
    con.close()
    assert file_fingerprint(other) != file_fingerprint(db.path)
    assert reread.get(other, key) is None


def test_unwritable_cache_only_loses_the_cache(db, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    cache = GoldCache(blocker)
    assert _gold(db, "SELECT COUNT(*) FROM t", cache).answer == Answer("scalar", (5,))
    cache.flush()  # must not raise


rows = st.lists(st.tuples(st.integers(-3, 3), st.sampled_from(["a", "b", None])), max_size=8)


@given(rows, st.randoms())
def test_official_ex_is_set_equality(r, rnd):
    shuffled = list(r)
    rnd.shuffle(shuffled)
    assert official_ex(shuffled + shuffled[:2], r)  # order and duplicates do not matter
    assert official_ex(r, r)
    assert not official_ex(r + [(99, "z")], r)


def test_official_ex_matches_bird_numeric_semantics():
    assert official_ex([(1,)], [(1.0,)])  # Python's 1 == 1.0, as in BIRD's script
    assert not official_ex([(1, 2)], [(2, 1)])
