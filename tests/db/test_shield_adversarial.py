"""Adversarial SQL against the shield: runaway work, blob bombs, every write/DDL kind, ATTACH, PRAGMA, extension
loading, statement smuggling. For every case: zero breaches, the expected status, the database file byte-identical,
no file written next to it or at a target path, and the connection still answering ``SELECT 1``."""

from __future__ import annotations

import hashlib
from pathlib import Path

import apsw
import pytest

from bapsql.db.sandbox import Sandbox
from bapsql.db.shield import Caps, Shield
from bapsql.tokens import RegexTokenCounter

CAPS = Caps(vm_steps=200_000, result_tokens=500, rows=50, bytes=4_096)
OUTSIDE = "__OUTSIDE__"  # replaced by a path outside the database folder that must never be created

REJ, ERR, TRUNC, OK = "rejected", "error", "truncated", "ok"

CASES: list[tuple[str, str, set[str]]] = [
    # runaway work: the VM-step cap stops it
    ("recursive_cte", "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c) SELECT x FROM c", {TRUNC}),
    ("recursive_cte_count", "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c) SELECT count(*) FROM c",
     {TRUNC}),
    ("cartesian_x4", "SELECT * FROM big a, big b, big c, big d", {TRUNC}),
    ("cartesian_x4_count", "SELECT count(*) FROM big a, big b, big c, big d", {TRUNC}),
    ("cartesian_sorted", "SELECT a.id FROM big a, big b ORDER BY a.note DESC, b.note", {TRUNC}),
    # blob and string bombs: denied functions, the length limit, or the visible caps
    ("randomblob", "SELECT randomblob(1000000000)", {REJ}),
    ("zeroblob", "SELECT zeroblob(1000000000)", {REJ}),
    ("hex_zeroblob", "SELECT replace(hex(zeroblob(100000000)), '0', 'xx')", {REJ}),
    ("printf_width", "SELECT printf('%.*c', 2000000000, 'x')", {ERR}),
    ("format_width", "SELECT length(format('%2000000000d', 1))", {ERR}),
    ("replace_growth", "SELECT length(replace(printf('%.*c', 900000, 'x'), 'x', 'xxxx'))", {ERR}),
    ("substr_of_big", "SELECT substr(printf('%.*c', 999000, 'x'), 1, 5)", {OK}),
    ("big_cell", "SELECT printf('%.*c', 900000, 'x')", {TRUNC}),
    ("string_doubling", "WITH RECURSIVE s(x) AS (SELECT 'x' UNION ALL SELECT x || x FROM s) SELECT length(x) FROM s",
     {ERR, TRUNC}),
    ("group_concat_big_table", "SELECT group_concat(note) FROM big", {TRUNC}),
    ("group_concat_cartesian", "SELECT length(group_concat(a.note)) FROM big a, big b", {ERR, TRUNC}),
    ("json_group_array_cartesian", "SELECT json_group_array(a.note) FROM big a, big b", {ERR, TRUNC}),
    ("like_pattern_bomb", "SELECT 1 WHERE 'a' LIKE printf('%.*c', 20000, '%')", {ERR}),
    ("unistr_repeat", "SELECT length(concat_ws(printf('%.*c', 600000, 'y'), 'a', 'b', 'c'))", {ERR}),
    # every write / DDL kind
    ("insert", "INSERT INTO big VALUES (-1, 0, 'x')", {REJ}),
    ("insert_select", "INSERT INTO big SELECT * FROM big", {REJ}),
    ("update", "UPDATE big SET note = 'x'", {REJ}),
    ("delete", "DELETE FROM big", {REJ}),
    ("replace", "REPLACE INTO big VALUES (1, 0, 'x')", {REJ}),
    ("upsert", "INSERT INTO big VALUES (1, 0, 'x') ON CONFLICT(id) DO UPDATE SET note = 'y'", {REJ}),
    ("create_table", "CREATE TABLE x(a)", {REJ}),
    ("create_table_as", "CREATE TABLE x AS SELECT * FROM big", {REJ}),
    ("create_index", "CREATE INDEX big_note ON big(note)", {REJ}),
    ("create_view", "CREATE VIEW v AS SELECT 1", {REJ}),
    ("create_trigger", "CREATE TRIGGER tr AFTER INSERT ON big BEGIN DELETE FROM big; END", {REJ}),
    ("create_temp_table", "CREATE TEMP TABLE x(a)", {REJ}),
    ("create_temp_view", "CREATE TEMP VIEW v AS SELECT 1", {REJ}),
    ("create_virtual", "CREATE VIRTUAL TABLE f USING fts5(a)", {REJ}),
    ("drop_table", "DROP TABLE big", {REJ}),
    ("drop_index", "DROP INDEX IF EXISTS big_grp", {REJ}),
    ("alter_rename", "ALTER TABLE big RENAME TO small", {REJ}),
    ("alter_add", "ALTER TABLE big ADD COLUMN z", {REJ}),
    ("vacuum", "VACUUM", {REJ}),
    ("vacuum_into", f"VACUUM INTO '{OUTSIDE}'", {REJ}),
    ("reindex", "REINDEX", {REJ}),
    ("analyze", "ANALYZE", {REJ}),
    ("begin", "BEGIN IMMEDIATE", {REJ}),
    ("commit", "COMMIT", {REJ}),
    ("rollback", "ROLLBACK", {REJ}),
    ("savepoint", "SAVEPOINT s1", {REJ}),
    ("release", "RELEASE s1", {REJ}),
    # ATTACH / DETACH
    ("attach_memory", "ATTACH ':memory:' AS m", {REJ}),
    ("attach_file", f"ATTACH '{OUTSIDE}' AS f", {REJ}),
    ("attach_uri", f"ATTACH 'file:{OUTSIDE}?mode=rwc' AS f", {REJ}),
    ("detach", "DETACH m", {REJ}),
    # PRAGMA, pragma table-valued functions, introspection
    ("pragma_writable_schema", "PRAGMA writable_schema = 1", {REJ}),
    ("pragma_journal_mode", "PRAGMA journal_mode = WAL", {REJ}),
    ("pragma_user_version", "PRAGMA user_version = 7", {REJ}),
    ("pragma_read", "PRAGMA table_info(big)", {REJ}),
    ("pragma_tvf", "SELECT * FROM pragma_table_info('big')", {REJ}),
    ("pragma_tvf_count", "SELECT count(*) FROM pragma_database_list", {REJ}),
    ("pragma_tvf_journal", "SELECT * FROM pragma_journal_mode", {REJ}),
    ("pragma_tvf_schema_version", "SELECT * FROM pragma_schema_version", {REJ}),
    ("dbstat", "SELECT * FROM dbstat", {REJ}),
    ("dbstat_count", "SELECT count(*) FROM dbstat", {REJ}),
    ("dbstat_named_cte", "WITH dbstat AS (SELECT 1) SELECT count(*) FROM dbstat", {REJ}),
    ("pragma_tvf_count_only", "SELECT count(*) FROM pragma_journal_mode", {REJ}),
    ("temp_schema_qualified", "SELECT count(*) FROM temp.sqlite_master", {REJ, ERR}),
    ("carray", "SELECT count(*) FROM carray", {REJ, ERR}),
    ("count_over_cte", "WITH c AS (SELECT 1 UNION ALL SELECT 2) SELECT count(*) FROM c", {OK}),
    ("count_over_subquery", "SELECT count(*) FROM (SELECT id FROM big)", {OK}),
    ("temp_master", "SELECT * FROM sqlite_temp_master", {REJ, ERR}),
    ("sqlite_version", "SELECT sqlite_version()", {REJ}),
    ("compileoption", "SELECT sqlite_compileoption_get(0)", {REJ}),
    ("sqlite_log", "SELECT sqlite_log(1, 'x')", {REJ}),
    ("fts3_tokenizer", "SELECT fts3_tokenizer('simple')", {REJ}),
    ("changes", "SELECT changes(), total_changes(), last_insert_rowid()", {REJ}),
    ("random", "SELECT random()", {REJ}),
    # extension loading
    ("load_extension", "SELECT load_extension('/tmp/evil.so')", {REJ}),
    ("load_extension_entry", "SELECT load_extension('libc.so.6', 'system')", {REJ}),
    # several statements
    ("two_statements", "SELECT 1; DROP TABLE big", {REJ}),
    ("two_statements_no_space", "SELECT 1;DELETE FROM big", {REJ}),
    ("two_selects", "SELECT 1; SELECT 2", {REJ}),
    ("comment_then_statement", "SELECT 1 -- comment\n; DELETE FROM big", {REJ}),
    ("quoted_semicolon_then_statement", "SELECT '; DELETE' ; DELETE FROM big", {REJ}),
    ("quotes_around_comment_markers", "SELECT '/*' ; DROP TABLE big; SELECT '*/'", {REJ}),
    ("escaped_quote", "SELECT 'it''s' ; DROP TABLE big", {REJ}),
    ("identifier_quotes", 'SELECT 1 AS "x;y" ; DROP TABLE big', {REJ}),
    ("bracket_identifier", "SELECT 1 AS [x;y] ; DROP TABLE big", {REJ}),
    # comment tricks
    ("block_comment_prefix", "/* SELECT */ DELETE FROM big", {REJ}),
    ("line_comment_prefix", "-- SELECT\nDELETE FROM big", {REJ}),
    ("comment_hides_semicolon", "SELECT 1 /* ; DELETE FROM big */", {OK}),
    ("unterminated_comment", "SELECT 1 /* ; DROP TABLE big", {OK, ERR}),
    ("comment_inside_keyword", "DEL/**/ETE FROM big", {REJ, ERR}),
    ("trailing_comment_only", "SELECT 1 ; -- done", {OK}),
    # case tricks
    ("case_select", "sElEcT 1", {OK}),
    ("case_insert", "iNsErT INTO big VALUES (-2, 0, 'x')", {REJ}),
    ("case_pragma", "PrAgMa writable_schema = ON", {REJ}),
    ("case_attach", "aTtAcH ':memory:' aS m", {REJ}),
    # CTE + write, RETURNING
    ("cte_insert", "WITH x AS (SELECT 1) INSERT INTO big SELECT 1, 1, 'x' FROM x", {REJ}),
    ("cte_update", "WITH x AS (SELECT 1) UPDATE big SET grp = 1", {REJ}),
    ("cte_delete", "WITH x AS (SELECT 1) DELETE FROM big", {REJ}),
    ("cte_replace", "WITH x AS (SELECT 1) REPLACE INTO big SELECT 1, 1, 'x' FROM x", {REJ}),
    ("values_then_write", "VALUES (1); DELETE FROM big", {REJ}),
    ("returning_delete", "DELETE FROM big RETURNING *", {REJ}),
    ("returning_insert", "INSERT INTO big VALUES (-3, 0, 'x') RETURNING id", {REJ}),
    ("select_returning", "SELECT 1 RETURNING 1", {ERR}),
    # odd inputs
    ("nul_byte", "SELECT 1\x00; DROP TABLE big", {REJ}),
    ("bound_variable", "SELECT ?1", {ERR}),
    ("empty", "   ", {REJ}),
    ("generate_series", "SELECT * FROM generate_series(1, 1000000000)", {ERR}),
    ("deep_expression", "SELECT " + "abs(" * 500 + "1" + ")" * 500, {ERR}),
    ("huge_compound", " UNION ALL ".join(["SELECT 1"] * 200), {ERR}),
]


def build_db(path: Path) -> Path:
    conn = apsw.Connection(str(path))
    conn.execute(
        """
        CREATE TABLE big(id INTEGER PRIMARY KEY, grp INTEGER, note TEXT);
        CREATE INDEX big_grp ON big(grp);
        BEGIN;
        WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r WHERE x < 10000)
        INSERT INTO big SELECT x, x % 13, 'note number ' || x FROM r;
        COMMIT;
        """
    )
    conn.close()
    return path


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    folder = tmp_path_factory.mktemp("adversarial")
    db = build_db(folder / "big.db")
    outside = tmp_path_factory.mktemp("outside") / "written.db"
    digest = hashlib.sha256(db.read_bytes()).hexdigest()
    with Sandbox(db) as sb:
        yield Shield(sb, RegexTokenCounter()), db, digest, outside


@pytest.mark.parametrize("name, sql, expected", CASES, ids=[c[0] for c in CASES])
def test_adversarial(setup, name, sql, expected):
    shield, db, digest, outside = setup
    r = shield.execute(sql.replace(OUTSIDE, str(outside)), CAPS)
    assert r.status in expected, (r.status, r.rejection, r.message)
    assert not r.breach and not r.cost.exceeds(CAPS)
    if r.status == "rejected":
        assert r.rejection and r.message
    if r.status == "error":
        assert r.message
    assert hashlib.sha256(db.read_bytes()).hexdigest() == digest
    assert sorted(p.name for p in db.parent.iterdir()) == ["big.db"]
    assert not outside.exists()
    assert shield.execute("SELECT 1", CAPS).rows == ((1,),)
    assert shield.sandbox.query("SELECT count(*) FROM big").rows == ((10000,),)
