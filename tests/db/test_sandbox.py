"""Tests of bapsql.db.sandbox: read-only opening, the statement check, limits, and exact, capped VM steps."""

from __future__ import annotations

import hashlib
from pathlib import Path

import apsw
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bapsql.db.sandbox import ALLOWED_FUNCTIONS, QueryResult, Sandbox, SandboxLimits
from bapsql.errors import DatabaseError, SQLExecutionError, SQLRejected

N_ROWS = 3_000


def build_db(path: Path, n: int = N_ROWS) -> Path:
    """A small two-table database: t(a INTEGER PRIMARY KEY, b, c TEXT) with n rows and u(k, v) with 50 rows."""
    conn = apsw.Connection(str(path))
    conn.execute(
        f"""
        CREATE TABLE t(a INTEGER PRIMARY KEY, b INTEGER, c TEXT);
        CREATE TABLE u(k INTEGER, v TEXT);
        CREATE INDEX u_k ON u(k);
        CREATE VIEW tv AS SELECT a, upper(c) AS uc FROM t WHERE b = 1;
        BEGIN;
        WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r WHERE x < {n})
        INSERT INTO t SELECT x, x % 7, 'name' || x FROM r;
        WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r WHERE x < 50)
        INSERT INTO u SELECT x % 7, 'v' || x FROM r;
        COMMIT;
        """
    )
    conn.close()
    return path


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> Path:
    return build_db(tmp_path_factory.mktemp("sandbox") / "t.db")


@pytest.fixture()
def sb(db):
    with Sandbox(db) as s:
        yield s


QUERIES = [
    "SELECT a, b FROM t WHERE a <= 300",
    "SELECT b, count(*), max(c) FROM t GROUP BY b ORDER BY 2 DESC",
    "SELECT t.a, u.v FROM t JOIN u ON u.k = t.b WHERE t.a < 40",
    "SELECT a, row_number() OVER (PARTITION BY b ORDER BY a), sum(a) OVER (ORDER BY a ROWS 3 PRECEDING) "
    "FROM t WHERE a < 400",
    "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 500) SELECT x FROM c",
    "SELECT a FROM t WHERE a < 200 UNION SELECT k FROM u",
    "SELECT (SELECT count(*) FROM u WHERE u.k = t.b) FROM t WHERE a < 300",
    "SELECT * FROM tv LIMIT 50",
    "SELECT count(*) FROM t x, u y WHERE x.a < 100",
    "VALUES (1, 2), (3, 4)",
]


# -- opening -----------------------------------------------------------------------------------------------------------
def test_missing_file_is_a_database_error(tmp_path):
    with pytest.raises(DatabaseError, match="not found"):
        Sandbox(tmp_path / "nope.db")


def test_non_sqlite_file_is_a_database_error(tmp_path):
    bad = tmp_path / "bad.db"
    bad.write_bytes(b"this is not a database" * 100)
    with pytest.raises(DatabaseError):
        Sandbox(bad)


def test_connection_is_read_only_even_without_the_authorizer(sb):
    # The raw connection underneath is opened with mode=ro: remove the authorizer and a write still fails.
    sb._conn.authorizer = None
    with pytest.raises(apsw.ReadOnlyError):
        sb._conn.execute("INSERT INTO t VALUES (-1, 0, 'x')")


def test_path_and_repr(db, sb):
    assert sb.path == db.resolve()
    assert "t.db" in repr(sb)


# -- queries -----------------------------------------------------------------------------------------------------------
def test_query_returns_typed_result(sb):
    r = sb.query("SELECT a, c FROM t WHERE a <= 3 ORDER BY a")
    assert isinstance(r, QueryResult)
    assert r.columns == ("a", "c")
    assert r.rows == ((1, "name1"), (2, "name2"), (3, "name3"))
    assert r.rows_total == 3 and not r.interrupted and r.vm_steps > 0


def test_max_rows_keeps_a_prefix_but_counts_all(sb):
    r = sb.query("SELECT a FROM t ORDER BY a", max_rows=5)
    assert r.rows == tuple((i,) for i in range(1, 6))
    assert r.rows_total == N_ROWS


def test_empty_result_still_has_columns(sb):
    r = sb.query("SELECT a AS x, c AS y FROM t LIMIT 0")
    assert r.columns == ("x", "y") and r.rows == () and r.rows_total == 0


def test_zero_cap_prepares_only(sb):
    with sb.stream("SELECT a, b FROM t", vm_step_cap=0) as rs:
        assert rs.columns == ("a", "b")
        assert list(rs) == []
    assert rs.interrupted and rs.vm_steps == 0


def test_explain_plan_lines_are_indented_by_depth(sb):
    plan = sb.explain_plan("SELECT b, count(*) FROM t WHERE a IN (SELECT k FROM u) GROUP BY b")
    assert any(line.startswith("SEARCH t") or line.startswith("SCAN t") for line in plan)
    assert any(line.startswith("  ") for line in plan)  # the subquery is nested
    with pytest.raises(SQLRejected):
        sb.explain_plan("DELETE FROM t")


def test_one_open_stream_at_a_time(sb):
    rs = sb.stream("SELECT a FROM t", vm_step_cap=None)
    next(rs)
    with pytest.raises(RuntimeError, match="still open"):
        sb.stream("SELECT 1", vm_step_cap=None)
    rs.close()
    assert sb.query("SELECT 1").rows == ((1,),)


# -- statement check ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "sql, code",
    [
        ("INSERT INTO t VALUES (1, 2, 3)", "write"),
        ("  /* hi */ -- x\n uPdAtE t SET b = 1", "write"),
        ("CREATE TEMP TABLE x(a)", "ddl"),
        ("PRAGMA user_version", "pragma"),
        ("ATTACH ':memory:' AS m", "attach"),
        ("BEGIN", "transaction"),
        ("EXPLAIN SELECT 1", "explain"),
        ("SELECT 1; SELECT 2", "multiple_statements"),
        ("SELECT ';' ; DROP TABLE t", "multiple_statements"),
        ("WITH x AS (SELECT 1) DELETE FROM t", "write"),
        ("SELECT * FROM pragma_table_info('t')", "table:pragma_table_info"),
        ("SELECT random()", "function:random"),
        ("SELECT count(*) FROM dbstat", "table:dbstat"),
        ("", "empty"),
        ("-- only a comment", "empty"),
        ("SELECT 1\x00; DROP TABLE t", "nul_byte"),
    ],
)
def test_check_rejects_with_a_code(sb, sql, code):
    with pytest.raises(SQLRejected) as info:
        sb.check(sql)
    assert info.value.code == code
    assert sb.query("SELECT 1").rows == ((1,),)


@pytest.mark.parametrize(
    "sql",
    [
        "select 1",
        "  sElEcT a FROM t -- trailing comment ; with a semicolon",
        "SELECT 'a;b', \"a\", [b], `c` FROM t LIMIT 1 ;  ; /* done */",
        "WITH x AS (SELECT 1 AS y) SELECT y FROM x",
        "VALUES (1)",
        "SELECT name FROM sqlite_schema",
        "SELECT value FROM json_each('[1,2,3]')",
        "SELECT * FROM tv",
        "SELECT strftime('%Y', 'now') > '2000'",
    ],
)
def test_check_accepts_reads(sb, sql):
    sb.check(sql)
    assert sb.query(sql, vm_step_cap=100_000).rows_total >= 1


def test_check_raises_execution_error_for_bad_sql(sb):
    with pytest.raises(SQLExecutionError, match="no such column"):
        sb.check("SELECT nope FROM t")
    with pytest.raises(SQLExecutionError, match="syntax error"):
        sb.check("SELEC 1")


def test_allowlist_names_exist_in_the_bundled_sqlite():
    conn = apsw.Connection(":memory:")
    available = {r[0] for r in conn.execute("SELECT name FROM pragma_function_list")}
    assert ALLOWED_FUNCTIONS <= available
    for banned in ("load_extension", "randomblob", "zeroblob", "random", "fts3_tokenizer", "sqlite_log",
                   "sqlite_compileoption_get", "rtreenode"):
        assert banned in available and banned not in ALLOWED_FUNCTIONS


# -- limits ------------------------------------------------------------------------------------------------------------
def test_sql_length_limit(db):
    with Sandbox(db, SandboxLimits(max_sql_length=100)) as s:
        with pytest.raises(SQLRejected) as info:
            s.check("SELECT " + " + ".join(["1"] * 60))
        assert info.value.code == "sql_too_long"


def test_string_length_limit(db):
    with Sandbox(db, SandboxLimits(max_length=10_000)) as s:
        assert s.query("SELECT length(printf('%.*c', 9000, 'x'))").rows == ((9000,),)
        with pytest.raises(SQLExecutionError, match="too big"):
            s.query("SELECT printf('%.*c', 20000, 'x')")


def test_expression_depth_compound_and_variable_limits(sb):
    with pytest.raises(SQLExecutionError, match="too large"):
        sb.check("SELECT " + "abs(" * 150 + "1" + ")" * 150)
    with pytest.raises(SQLExecutionError, match="too many terms"):
        sb.check(" UNION ALL ".join(["SELECT 1"] * 60))
    with pytest.raises(SQLExecutionError, match="variables"):
        sb.check("SELECT ?")


def test_limits_validate():
    with pytest.raises(ValueError):
        SandboxLimits(max_length=-1)


# -- VM steps ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("sql", QUERIES)
def test_vm_steps_are_deterministic(db, sb, sql):
    runs = [sb.query(sql).vm_steps for _ in range(3)]
    with Sandbox(db) as fresh_a, Sandbox(db) as fresh_b:
        runs += [fresh_a.query(sql).vm_steps, fresh_b.query(sql).vm_steps]
    assert len(set(runs)) == 1 and runs[0] > 0


@pytest.mark.parametrize("cap", [1_000, 7_919, 54_321])
def test_interrupted_counts_do_not_depend_on_history(db, cap):
    runaway = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT x FROM c"
    counts = []
    for earlier in (None, 333, 99_999):
        with Sandbox(db) as s:
            if earlier is not None:
                s.query(runaway, vm_step_cap=earlier)
            counts.append(s.query(runaway, vm_step_cap=cap).vm_steps)
            counts.append(s.query(runaway, vm_step_cap=cap).vm_steps)
    assert len(set(counts)) == 1 and counts[0] <= cap


def test_bare_count_is_constant_in_table_size(tmp_path):
    small, large = build_db(tmp_path / "s.db", 10), build_db(tmp_path / "l.db", 5_000)
    with Sandbox(small) as s, Sandbox(large) as l:
        assert s.query("SELECT count(*) FROM t").vm_steps == l.query("SELECT count(*) FROM t").vm_steps
        assert l.query("SELECT count(*) FROM t WHERE b >= 0").vm_steps > 5_000


def test_runtime_error_keeps_the_steps_spent(db):
    with Sandbox(db, SandboxLimits(max_length=1_000)) as tight:
        rs = tight.stream("SELECT length(group_concat(c)) FROM t", vm_step_cap=None)
        with pytest.raises(SQLExecutionError, match="too big"):
            list(rs)
        assert rs.done and rs.vm_steps > 500  # ~130 rows were scanned before the string grew too big
        assert tight.query("SELECT 1").rows == ((1,),)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(q=st.sampled_from(QUERIES + ["WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT x FROM c"]),
       cap=st.one_of(st.integers(0, 300), st.integers(0, 60_000)))
def test_vm_cap_is_never_exceeded(sb, q, cap):
    capped = sb.query(q, vm_step_cap=cap)
    assert capped.vm_steps <= cap
    if not capped.interrupted:  # finished under the cap: the count is the uncapped count
        assert capped.vm_steps == sb.query(q, vm_step_cap=10**7).vm_steps


@pytest.mark.parametrize("sql", QUERIES)
def test_progress_ticks_equal_exact_count_over_n(sb, sql):
    # The cap's soundness rests on SQLite calling the progress handler once per N opcodes crossed, up to date at
    # every return from sqlite3_step: after a completed statement, ticks == exact count // N.
    full = sb.query(sql).vm_steps
    for cap in (2 * full + 100, 3 * full + 1_000):
        with sb.stream(sql, vm_step_cap=cap) as rs:
            list(rs)
        assert not rs.interrupted and rs.vm_steps == full
        assert rs._ticks == full // rs._every


def test_cap_is_used_nearly_fully(sb):
    runaway = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT x FROM c"
    for cap in (1_000, 50_000, 400_000):
        r = sb.query(runaway, vm_step_cap=cap)
        assert r.interrupted and cap * 0.95 - 100 <= r.vm_steps <= cap


def test_interrupted_rows_are_a_prefix(sb):
    full = sb.query("SELECT a FROM t ORDER BY a")
    part = sb.query("SELECT a FROM t ORDER BY a", vm_step_cap=2_000)
    assert part.interrupted and 0 < part.rows_total < full.rows_total
    assert part.rows == full.rows[: part.rows_total]


def test_database_file_is_unchanged(db):
    before = sha256(db)
    with Sandbox(db) as s:
        for q in QUERIES:
            s.query(q, vm_step_cap=100_000)
        for bad in ("DELETE FROM t", "WITH x AS (SELECT 1) INSERT INTO t SELECT 1, 2, 3 FROM x",
                    "SELECT 1; DROP TABLE t"):
            with pytest.raises(SQLRejected):
                s.query(bad)
    assert sha256(db) == before


@pytest.mark.parametrize(
    "sql",
    [
        "INSERT INTO t VALUES (-1, 0, 'x')",
        "CREATE TEMP TABLE x(a)",
        "PRAGMA writable_schema = 1",
        "ATTACH ':memory:' AS m",
        "BEGIN",
        "VACUUM INTO '/nonexistent-dir/x.db'",
        "ANALYZE",
        "REINDEX",
        "REINDEX u",
        "SELECT 1; DELETE FROM t",
        "SELECT 1; SELECT 2",
    ],
)
def test_the_authorizer_and_tracer_hold_without_the_statement_check(db, monkeypatch, sql):
    # Blind the lexer: it now says every text is one SELECT. The authorizer / exec tracer must still refuse.
    import bapsql.db.sandbox as sandbox_mod

    monkeypatch.setattr(sandbox_mod, "scan_statement", lambda text: ("select", False))
    before = sha256(db)
    with Sandbox(db) as s:
        with pytest.raises((SQLRejected, SQLExecutionError)):
            s.query(sql, vm_step_cap=10_000)
        assert s.query("SELECT count(*) FROM t").rows == ((N_ROWS,),)
    assert sha256(db) == before
