"""Live databases at the sandbox level (bapsql/db/dbfile.py, sandbox snapshots, catalog staleness): real writer
processes in WAL and rollback-journal mode, hot journals, damaged files, schema changes. In-process writes use apsw:
a second SQLite library in one process (stdlib sqlite3) closing its file would drop apsw's POSIX locks on it."""

from __future__ import annotations

import logging

import apsw
import pytest

from bapsql.db.catalog_cache import load_or_build_catalog, staleness
from bapsql.db.dbfile import BusyWait, inspect_file, integrity_check
from bapsql.db.handle import open_database
from bapsql.db.sandbox import Sandbox
from bapsql.db.shield import Caps, Shield
from bapsql.env.handles import DatabaseHandles
from bapsql.errors import DatabaseBusy, DatabaseError
from bapsql.tokens import RegexTokenCounter
from tests.db.writers import crash_mid_write, hold_lock, inserter, make_db, stop

COUNT = "SELECT count(*) FROM item"


def test_a_long_write_lock_ends_in_busy_within_the_bound(tmp_path):
    db = make_db(tmp_path / "r.sqlite", wal=False)
    sb = Sandbox(db, busy_timeout_s=0.3)
    proc = hold_lock(db, 60)
    try:
        with pytest.raises(DatabaseBusy, match="is busy") as info:
            sb.begin_snapshot()
        assert 0 < info.value.waited_s <= sb.wait.limit_s + 0.2  # the handler never sleeps past its limit
        res = Shield(sb, RegexTokenCounter()).execute(COUNT, Caps(vm_steps=10**6, result_tokens=1000))
        assert res.status == "rejected" and res.rejection == "busy" and not res.rows and res.wait_s > 0
    finally:
        stop(proc)
        sb.close()


def test_a_short_write_is_waited_for(tmp_path):
    db = make_db(tmp_path / "r.sqlite", wal=False)
    with Sandbox(db, busy_timeout_s=30) as sb:
        proc = hold_lock(db, 0.3)
        try:
            assert sb.query(COUNT).rows == ((2_001,),)  # waited for the commit, then read it
            assert sb.last_wait_s > 0
        finally:
            stop(proc)


def test_wal_readers_neither_block_nor_wait_for_writers(tmp_path):
    db = make_db(tmp_path / "w.sqlite", wal=True)
    assert inspect_file(db).wal
    with Sandbox(db, busy_timeout_s=0.0) as sb:
        proc = hold_lock(db, 60)  # an open write transaction: invisible to WAL readers
        try:
            assert sb.query(COUNT).rows == ((2_000,),) and sb.last_wait_s == 0
            sb.begin_snapshot()
            stop(proc)
            w = apsw.Connection(str(db))  # the snapshot does not block a writer's commit either (no busy wait)
            w.execute("INSERT INTO item(v) VALUES ('after')")
            w.close()
            assert sb.query(COUNT).rows == ((2_000,),)  # still the snapshot's state
            sb.end_snapshot()
            assert sb.query(COUNT).rows == ((2_001,),)
        finally:
            stop(proc)


@pytest.mark.parametrize("wal", [True, False])
def test_a_snapshot_agrees_with_itself_while_rows_are_inserted(tmp_path, wal):
    db = make_db(tmp_path / "s.sqlite", wal=wal)
    with Sandbox(db, busy_timeout_s=30) as sb:
        proc = inserter(db, 200)
        try:
            sb.begin_snapshot()
            first = sb.query(COUNT).rows
            listed = sb.query("SELECT id FROM item").rows_total
            sb.query("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 300000) "
                     "SELECT count(*) FROM c")  # time for the writer to commit more rows
            assert sb.query(COUNT).rows == first and listed == first[0][0]
            sb.end_snapshot()
            if wal:  # the writer kept committing meanwhile
                assert sb.query(COUNT).rows[0][0] >= first[0][0]
        finally:
            stop(proc)


def test_reading_the_header_keeps_sqlite_locks(tmp_path):
    # Closing a plain file on the database drops every POSIX lock of this process on it; inspect_file must not.
    import subprocess
    import sys

    db = make_db(tmp_path / "r.sqlite", wal=False)
    probe = ("import sqlite3, sys\ncon = sqlite3.connect(sys.argv[1], timeout=0)\ntry:\n"
             "    con.execute(\"INSERT INTO item(v) VALUES ('x')\"); con.commit(); print('wrote')\n"
             "except sqlite3.OperationalError as e:\n    print(e)")
    with Sandbox(db) as sb:
        sb.begin_snapshot()  # holds a SHARED lock: another process cannot commit
        inspect_file(db)
        out = subprocess.run([sys.executable, "-c", probe, str(db)], capture_output=True, text=True).stdout
        assert "locked" in out
        sb.end_snapshot()
    out = subprocess.run([sys.executable, "-c", probe, str(db)], capture_output=True, text=True).stdout
    assert out.strip() == "wrote"


def test_a_hot_journal_is_named_at_open(tmp_path):
    db = make_db(tmp_path / "h.sqlite", wal=False, rows=20_000)
    crash_mid_write(db)
    assert inspect_file(db).journal
    for open_it in (lambda: Sandbox(db), lambda: open_database(db, token_counter=RegexTokenCounter(),
                                                                cache_dir=tmp_path / "c")):
        with pytest.raises(DatabaseError) as info:
            open_it()
        text = str(info.value)
        assert "hot rollback journal" in text and "open the file once with a writer" in text
        assert "attempt to write a readonly database" not in text
    rep = integrity_check(db)
    assert not rep.ok and "hot rollback journal" in rep.problems[0]
    apsw.Connection(str(db)).execute("SELECT count(*) FROM item").fetchall()  # a writer rolls the journal back
    assert integrity_check(db).ok and Sandbox(db).query(COUNT).rows == ((20_000,),)


def test_damaged_and_foreign_files_are_named(tmp_path):
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"PK\x03\x04 not a database" * 400)
    with pytest.raises(DatabaseError, match="not a SQLite database"):
        Sandbox(junk)
    db = make_db(tmp_path / "d.sqlite", wal=False, rows=5_000)
    data = bytearray(db.read_bytes())
    page = int.from_bytes(data[16:18], "big")
    for off in range(2 * page + 8, 6 * page, 7):  # scribble over the table's interior and leaf pages
        data[off] = 0xFF
    db.write_bytes(bytes(data))
    rep = integrity_check(db, full=True)
    assert not rep.ok and rep.problems


def test_immutable_only_for_a_wal_file_nobody_can_be_writing(tmp_path):
    # (Run as root here, so a read-only folder cannot be made; the decision itself is checked on FileStates.)
    from dataclasses import replace

    from bapsql.db.dbfile import readonly_uri

    state = inspect_file(make_db(tmp_path / "w.sqlite", wal=True))
    frozen = replace(state, folder_writable=False, wal_file=False)
    assert frozen.immutable and readonly_uri(frozen).endswith("?mode=ro&immutable=1")
    for live in (replace(frozen, wal_file=True), replace(frozen, folder_writable=True), replace(frozen, wal=False)):
        assert not live.immutable and readonly_uri(live).endswith("?mode=ro")


def test_busy_wait_is_cut_by_the_deadline():
    import time

    wait = BusyWait(10.0)
    wait.deadline = time.monotonic() + 0.05
    wait.arm()
    assert wait.limit_s <= 0.05
    wait.deadline = time.monotonic() - 1
    wait.arm()
    assert wait.limit_s == 0 and wait(0) is False and wait.gave_up


def test_a_schema_change_invalidates_the_catalog(tmp_path, caplog):
    db = make_db(tmp_path / "c.sqlite", wal=True)
    cache = tmp_path / "cache"
    with DatabaseHandles(RegexTokenCounter(), cache_dir=cache, check_interval_s=0) as handles:
        first = handles.get(db)
        assert first.catalog.table_names == ("item",)
        con = apsw.Connection(str(db))
        con.execute("CREATE TABLE extra (k INTEGER PRIMARY KEY, w TEXT)")
        con.close()
        with caplog.at_level(logging.INFO, logger="bapsql"):
            again = handles.get(db)
        assert again is not first and set(again.catalog.table_names) == {"item", "extra"}
        assert any("schema changed" in r.getMessage() for r in caplog.records)
        assert again.sandbox.query("SELECT count(*) FROM extra").rows == ((0,),)  # the new table is readable


def test_data_drift_rebuilds_past_the_tolerance_and_says_so(tmp_path, caplog):
    db = make_db(tmp_path / "d.sqlite", wal=False, rows=1_000)
    cache = tmp_path / "cache"
    base = load_or_build_catalog(db, cache)
    con = apsw.Connection(str(db))
    con.execute("INSERT INTO item(v) VALUES ('one more')")
    with caplog.at_level(logging.INFO, logger="bapsql"):
        kept = load_or_build_catalog(db, cache, tolerance=0.05)  # 0.1% more rows: kept, but logged
        assert kept.fingerprint == base.fingerprint
        assert any("reused" in r.getMessage() and "within" in r.getMessage() for r in caplog.records)
        strict = load_or_build_catalog(db, cache)  # tolerance 0: any change rebuilds
        assert strict.table("item").rows == 1_001
    with con:
        con.executemany("INSERT INTO item(v) VALUES (?)", [("more",)] * 500)
    con.close()
    with caplog.at_level(logging.INFO, logger="bapsql"):
        caplog.clear()
        rebuilt = load_or_build_catalog(db, cache, tolerance=0.05)
    assert rebuilt.table("item").rows == 1_501
    assert any("rebuilt" in r.getMessage() and "above" in r.getMessage() for r in caplog.records)
    v = staleness(base.fingerprint, rebuilt.fingerprint, 0.05)
    assert v.rebuild and v.drift > 0.4


def test_no_insert_burst_makes_an_open_fail(tmp_path):
    db = make_db(tmp_path / "b.sqlite", wal=False)
    proc = inserter(db, 100)  # the rate of the issue
    try:
        for _ in range(20):
            with Sandbox(db, busy_timeout_s=5) as sb:
                assert sb.query(COUNT).rows[0][0] >= 2_000
    finally:
        stop(proc)


def test_catalog_rebuilds_report_progress_per_table(tmp_path):
    db = make_db(tmp_path / "p.sqlite", wal=True)
    con = apsw.Connection(str(db))
    con.execute("CREATE TABLE other (k INTEGER PRIMARY KEY)")
    con.close()
    calls = []
    cat = load_or_build_catalog(db, tmp_path / "cache", progress=lambda done, total, table: calls.append((done, total)))
    assert set(cat.table_names) == {"item", "other"}
    assert calls == [(0, 2), (1, 2), (2, 2)]
    calls.clear()
    load_or_build_catalog(db, tmp_path / "cache", progress=lambda *a: calls.append(a))
    assert calls == []  # served from the cache: nothing built
