"""The bytecode VM-step model (bapsql/db/bytecode.py): exact on straight code and simple loops, sane elsewhere."""

from __future__ import annotations

from pathlib import Path

import apsw
import pytest

from bapsql.db.bytecode import LoopHint, ProgramModel
from bapsql.db.program import Op, constraints_of, ops_from_rows, parse_plan_line


def vm_steps(conn: apsw.Connection, sql: str) -> int:
    box = {}
    conn.trace_v2(apsw.SQLITE_TRACE_PROFILE, lambda ev: box.update(s=ev["stmt_status"]["SQLITE_STMTSTATUS_VM_STEP"]))
    conn.execute(sql).fetchall()
    conn.trace_v2(0, None)
    return box["s"]


@pytest.fixture(scope="module")
def conn(tmp_path_factory):
    path = Path(tmp_path_factory.mktemp("bc")) / "t.sqlite"
    c = apsw.Connection(str(path))
    c.execute("""
        CREATE TABLE t (a INTEGER PRIMARY KEY, b INTEGER, c TEXT);
        WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n WHERE x < 500)
        INSERT INTO t SELECT x, x % 7, 'v' || x FROM n;
    """).fetchall()
    yield c
    c.close()


def model_of(conn, sql: str, n: float) -> ProgramModel:
    m = ProgramModel(ops_from_rows(conn.execute(sql, explain=1).fetchall()))
    for addr, kind, _cur in m.access_events():
        m.hints[addr] = LoopHint(n=n if kind == "loop" else min(n, 1.0))
    return m


@pytest.mark.parametrize("sql", ["SELECT count(*) FROM t", "SELECT a, c FROM t", "SELECT c FROM t ORDER BY b DESC",
                                 "SELECT 1 + 2"])
def test_exact_for_scans_sorts_and_constants(conn, sql):
    m = model_of(conn, sql, 500)
    assert m.expected_steps() == pytest.approx(vm_steps(conn, sql), rel=1e-6)


def test_filter_pass_rate_scales_body(conn):
    sql = "SELECT c FROM t WHERE b = 3"
    actual = vm_steps(conn, sql)
    m = model_of(conn, sql, 500)
    opener = m.access_events()[0][0]
    m.hints[opener] = LoopHint(n=500, pass_rate=71 / 500)  # 71 rows have b = 3
    assert m.expected_steps() == pytest.approx(actual, rel=0.02)
    m.hints[opener] = LoopHint(n=500, pass_rate=1.0)
    assert m.expected_steps() > actual  # every row passing costs more


def test_group_by_uses_sorter_counts(conn):
    sql = "SELECT b, count(*) FROM t GROUP BY b"
    m = model_of(conn, sql, 500)
    jumps = m.group_jumps()
    assert len(jumps) == 1
    m.group_ratios[jumps[0]] = 7 / 500
    assert m.expected_steps() == pytest.approx(vm_steps(conn, sql), rel=0.05)


def test_handmade_loop_program():
    # 0 Init → 6; 1 OpenRead c0; 2 Rewind c0 → 5 if empty; 3 Column; 4 Next c0 → 3; 5 Halt; 6 Transaction; 7 Goto → 1
    ops = [Op(0, "Init", 0, 6, 0, None, 0), Op(1, "OpenRead", 0, 2, 0, "1", 0), Op(2, "Rewind", 0, 5, 0, None, 0),
           Op(3, "Column", 0, 0, 1, None, 0), Op(4, "Next", 0, 3, 0, None, 0), Op(5, "Halt", 0, 0, 0, None, 0),
           Op(6, "Transaction", 0, 0, 0, None, 0), Op(7, "Goto", 0, 1, 0, None, 0)]
    m = ProgramModel(ops)
    assert m.access_events() == [(2, "loop", 0)]
    m.hints[2] = LoopHint(n=10)
    assert m.expected_steps() == pytest.approx(6 + 2 * 10)  # straight-line ops once, the 2-op body 10 times
    m.hints[2] = LoopHint(n=0.25)  # an expected quarter row: the body runs 0.25 times
    assert m.expected_steps() == pytest.approx(6 + 2 * 0.25)


def test_plan_line_parsing():
    assert parse_plan_line("SCAN t") == ("SCAN", "t", "")
    verb, alias, rest = parse_plan_line("SEARCH o USING INDEX ix (a=? AND b>?)")
    assert (verb, alias) == ("SEARCH", "o") and constraints_of(rest) == [("a", "="), ("b", ">")]
    assert constraints_of(" USING INTEGER PRIMARY KEY (rowid=?)") == [("rowid", "=")]
    assert parse_plan_line("SCAN CONSTANT ROW") is None
    assert parse_plan_line("USE TEMP B-TREE FOR ORDER BY") is None
