"""Real writer processes for the live-database tests: another program holding a lock, inserting, or crashing
mid-transaction. Each runs ``python -c`` with stdlib sqlite3 (a different SQLite library than the sandbox's apsw,
as a user's own program would be)."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

_HOLD = """
import sqlite3, sys, time
con = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)
con.execute("BEGIN EXCLUSIVE")
con.execute("INSERT INTO item(v) VALUES ('held')")
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
con.execute("COMMIT")
"""

_INSERT = """
import sqlite3, sys, time
con = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)
rate = float(sys.argv[2])
statement = sys.argv[3]  # one INSERT; :n is the row counter
print("started", flush=True)
t0 = time.monotonic()
n = 0
while True:
    con.execute(statement, {"n": n} if ":n" in statement else {})
    n += 1
    wait = t0 + n / rate - time.monotonic()
    if wait > 0:
        time.sleep(wait)
"""

_CRASH = """
import os, sqlite3, sys
con = sqlite3.connect(sys.argv[1], isolation_level=None)
con.execute("PRAGMA cache_size=2")
con.execute("BEGIN")
con.execute("UPDATE item SET v = v || 'x'")
os._exit(1)
"""


def make_db(path: Path, *, wal: bool, rows: int = 2_000) -> Path:
    """item(id INTEGER PRIMARY KEY, v TEXT) with ``rows`` rows, in WAL or rollback-journal (DELETE) mode. (A new
    file: no apsw connection of this process holds locks on it yet.)"""
    con = sqlite3.connect(path)
    con.execute(f"PRAGMA journal_mode={'WAL' if wal else 'DELETE'}")
    con.execute("CREATE TABLE item (id INTEGER PRIMARY KEY, v TEXT)")
    con.executemany("INSERT INTO item(v) VALUES (?)", [("row %d " % i + "x" * 40,) for i in range(rows)])
    con.commit()
    con.close()
    return path


def _spawn(script: str, *args: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", script, *args], stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline().strip()  # wait until the writer is in place
    assert line in ("locked", "started"), f"writer failed to start: {line!r}"
    return proc


def hold_lock(path: Path, seconds: float) -> subprocess.Popen:
    """A process that holds an EXCLUSIVE write transaction on ``path`` for ``seconds`` (returns once it holds it)."""
    return _spawn(_HOLD, str(path), str(seconds))


ITEM_INSERT = "INSERT INTO item(v) VALUES ('live')"


def inserter(path: Path, rate: float, statement: str = ITEM_INSERT) -> subprocess.Popen:
    """A process running ``statement`` (an INSERT; ``:n`` binds the row counter) ``rate`` times per second, one
    transaction each, until stopped (by default into the test databases' ``item`` table)."""
    return _spawn(_INSERT, str(path), str(rate), statement)


def crash_mid_write(path: Path) -> None:
    """Leave a hot journal: a writer that spills an UPDATE to the file and dies before committing."""
    subprocess.run([sys.executable, "-c", _CRASH, str(path)], check=False)


def stop(proc: subprocess.Popen) -> None:
    proc.kill()
    proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()
