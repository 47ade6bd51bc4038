"""A SQLite file that other programs may be writing: how bapsql opens it read-only, waits for writers, explains
what is wrong with it, checks its integrity and fingerprints its current contents.

Decisions (DESIGN §3, issue 17):

- **WAL databases are read through their ``-wal`` / ``-shm`` files** (``file:...?mode=ro``): a read-only connection
  then takes part in the WAL protocol, so it sees every committed transaction, never blocks a writer (a reader only
  pins the WAL frames of its snapshot; checkpoints copy the rest) and is never blocked by one. SQLite creates the
  side files when the folder is writable; when it is not and no ``-wal`` file exists, nobody can be writing the file
  in WAL mode (a writer needs that folder), so it is opened ``immutable=1`` (no locks, no side files). ``immutable``
  is never used on a file that may be changing: SQLite would read torn pages.
- **Rollback-journal databases** are read under SQLite's normal shared lock; a writer that is committing holds an
  exclusive lock, and a reader waits for it.
- **Waiting is bounded** (`BusyWait`): a busy handler that sleeps with back-off while another connection holds the
  lock, up to a limit set per call (the configured busy timeout, cut to what the request may still spend), and sums
  the time it waited. When the limit runs out the statement fails with `DatabaseBusy`, never with an SQL error.
- **Hot journals and damaged files** are recognised from SQLite's extended result codes and the file header and
  reported by `explain_error` with the cause and the fix (a read-only connection cannot roll a hot journal back,
  which SQLite reports as "attempt to write a readonly database").
- `integrity_check(path)` runs ``PRAGMA quick_check`` (or the full ``integrity_check``) on a plain read-only
  connection; `data_fingerprint(conn)` is the catalog's cheap identity of the data one read transaction sees.
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import apsw

from bapsql.errors import DatabaseBusy, DatabaseError

DEFAULT_BUSY_TIMEOUT_S = 3.0  # what other text-to-SQL harnesses wait for a writer, roughly
_BACKOFF_S = (0.001, 0.002, 0.005)  # short polls: a busy writer leaves only brief gaps between commits
_MAGIC = b"SQLite format 3\x00"


@dataclass(frozen=True)
class FileState:
    """What the file system says about a database file before it is opened."""

    path: Path
    size: int
    wal: bool  # the header's read/write versions say WAL (2)
    journal: bool  # a non-empty rollback journal (``-journal``) lies next to it: hot unless a writer is mid-commit
    wal_file: bool  # a ``-wal`` file exists
    folder_writable: bool

    @property
    def immutable(self) -> bool:
        """Open with ``immutable=1``: a WAL file nobody can be writing (read-only folder, no ``-wal`` file)."""
        return self.wal and not self.folder_writable and not self.wal_file


def inspect_file(path: str | Path) -> FileState:
    """The `FileState` of ``path``; `DatabaseError` (cause and fix) when it is missing or not a SQLite file."""
    p = Path(path).expanduser().resolve()
    if not p.is_file():
        raise DatabaseError(f"database file not found: {p}")
    try:
        size = p.stat().st_size
        head = read_header(p, min(size, 100))
    except (OSError, apsw.Error) as exc:
        raise DatabaseError(f"cannot read {p}: {exc}; check the file's permissions") from exc
    if size and (len(head) < 100 or not head.startswith(_MAGIC)):
        raise DatabaseError(f"{p} is not a SQLite database (its header is not 'SQLite format 3'); it may be "
                            "encrypted, compressed or another file format: point --db at the SQLite file itself")
    journal = p.with_name(p.name + "-journal")
    return FileState(
        path=p, size=size, wal=size >= 20 and head[18] == 2 and head[19] == 2,
        journal=journal.is_file() and journal.stat().st_size > 0,
        wal_file=p.with_name(p.name + "-wal").is_file(), folder_writable=os.access(p.parent, os.W_OK),
    )


def read_header(path: Path, n: int) -> bytes:
    """The first ``n`` bytes of a database file, read through SQLite's own file layer: closing a plain Python file
    on it would drop every POSIX lock this process's SQLite connections hold on it (SQLite's VFS defers that close)."""
    if n <= 0:
        return b""
    f = apsw.VFSFile("", str(path), [apsw.SQLITE_OPEN_MAIN_DB | apsw.SQLITE_OPEN_READONLY, 0])
    try:
        return f.xRead(n, 0)
    finally:
        f.xClose()


def readonly_uri(state: FileState) -> str:
    """The URI a read-only connection opens (see the module docstring for when ``immutable=1`` is added)."""
    return state.path.as_uri() + ("?mode=ro&immutable=1" if state.immutable else "?mode=ro")


class BusyWait:
    """A bounded busy handler: install with ``conn.set_busy_handler(wait)``, then `arm` it before each call.

    ``waited_s`` is the time slept since the last `arm`; once it reaches the armed limit the handler gives up
    (``gave_up`` is set) and SQLite returns SQLITE_BUSY."""

    def __init__(self, timeout_s: float = DEFAULT_BUSY_TIMEOUT_S) -> None:
        if not timeout_s >= 0:
            raise ValueError(f"busy timeout must be >= 0 seconds, got {timeout_s!r}")
        self.timeout_s = float(timeout_s)
        self.deadline: float | None = None  # time.monotonic() after which no waiting is allowed (the request's end)
        self.limit_s = self.timeout_s
        self.waited_s = 0.0
        self.gave_up = False

    def arm(self) -> None:
        """Start a new call: the limit is the busy timeout, cut to what is left before the deadline."""
        left = self.timeout_s if self.deadline is None else self.deadline - time.monotonic()
        self.limit_s = max(0.0, min(self.timeout_s, left))
        self.waited_s, self.gave_up = 0.0, False

    def __call__(self, count: int) -> bool:
        left = self.limit_s - self.waited_s
        if left <= 0:
            self.gave_up = True
            return False
        t0 = time.monotonic()
        time.sleep(min(_BACKOFF_S[min(count, len(_BACKOFF_S) - 1)], left))
        self.waited_s += time.monotonic() - t0
        return True

    def busy_error(self, path: Path) -> DatabaseBusy:
        return DatabaseBusy(
            f"the database {path.name} is busy: another program held a write lock for the whole wait limit "
            f"({self.limit_s:.2f} s); nothing was read. Try again later, or raise the busy timeout", self.waited_s)


_READONLY_CAUSES = {
    "SQLITE_READONLY_ROLLBACK": (
        "a hot rollback journal ({name}-journal): a program was stopped in the middle of a write transaction and its "
        "changes must be rolled back, which a read-only connection cannot do. Fix: open the file once with a "
        "writer (e.g. `sqlite3 {name} 'PRAGMA quick_check'` as its owner) so SQLite rolls the journal back, or "
        "point --db at a copy made with `sqlite3 {name} '.backup copy.sqlite'`"),
    "SQLITE_READONLY_RECOVERY": (
        "its write-ahead log needs recovery (a writer stopped without closing it), which a read-only connection "
        "cannot run. Fix: open the file once with a writer so SQLite recovers the WAL, or point --db at a copy"),
    "SQLITE_READONLY_CANTINIT": (
        "its WAL index ({name}-shm) cannot be initialised read-only. Fix: make the folder writable for this user, "
        "or open the file once with a writer, or point --db at a copy"),
    "SQLITE_READONLY_DIRECTORY": (
        "its folder is not writable, so its journal files cannot be created. Fix: make the folder writable or point "
        "--db at a copy in a writable folder"),
}


def explain_error(exc: apsw.Error, path: Path) -> str | None:
    """Cause and fix for an error that comes from the file's state rather than from the SQL, else None."""
    code = apsw.mapping_extended_result_codes.get(getattr(exc, "extendedresult", -1), "")
    name = path.name
    if code in _READONLY_CAUSES:
        return f"cannot read {path}: " + _READONLY_CAUSES[code].format(name=name)
    if isinstance(exc, apsw.ReadOnlyError):
        return (f"cannot read {path}: SQLite needed to write to it ({exc}); it usually means a hot journal or WAL "
                "left by a stopped writer. Fix: open the file once with a writer, or point --db at a copy")
    if isinstance(exc, apsw.CorruptError):
        return (f"{path} is damaged ({_plain(exc)}). Fix: run `bapsql data check --db {name}` for details, restore "
                "a backup or salvage it with `sqlite3 {name} .recover`")
    if isinstance(exc, apsw.NotADBError):
        return (f"{path} is not a SQLite database ({_plain(exc)}); it may be encrypted or another format: "
                "point --db at the SQLite file itself")
    if isinstance(exc, apsw.CantOpenError):
        return f"cannot open {path} ({_plain(exc)}): check the permissions of the file and of its folder"
    return None


def _plain(exc: apsw.Error) -> str:
    text = str(exc)
    head, sep, rest = text.partition(": ")
    return rest if sep and head.endswith("Error") else text


def connect_readonly(path: str | Path, wait: BusyWait | None = None) -> apsw.Connection:
    """A read-only connection that has read the schema once (so a hot journal or damage shows now, not later),
    with ``wait`` as its busy handler. Raises `DatabaseError` (cause and fix) or `DatabaseBusy`."""
    state = inspect_file(path)
    wait = wait if wait is not None else BusyWait()
    try:
        conn = apsw.Connection(readonly_uri(state), flags=apsw.SQLITE_OPEN_READONLY | apsw.SQLITE_OPEN_URI)
    except apsw.Error as exc:
        raise DatabaseError(explain_error(exc, state.path) or f"cannot open {state.path} read-only: {exc}") from exc
    conn.set_busy_handler(wait)
    wait.arm()
    try:
        conn.execute("SELECT count(*) FROM sqlite_schema").fetchall()
    except apsw.BusyError:
        conn.close()
        raise wait.busy_error(state.path) from None
    except apsw.Error as exc:
        conn.close()
        raise DatabaseError(explain_error(exc, state.path)
                            or f"{state.path} is not a readable SQLite database: {_plain(exc)}") from exc
    return conn


@dataclass(frozen=True)
class CheckReport:
    """The outcome of `integrity_check`: ``ok`` when SQLite found no problem; ``problems`` its messages."""

    path: Path
    ok: bool
    mode: str  # "quick_check" | "integrity_check"
    journal_mode: str  # "wal" | "rollback"
    problems: tuple[str, ...]
    seconds: float


def integrity_check(path: str | Path, *, full: bool = False, max_errors: int = 100,
                    wait: BusyWait | None = None) -> CheckReport:
    """``PRAGMA quick_check`` (``full``: ``integrity_check``, which also checks index contents) of ``path`` on a
    plain read-only connection. A file that cannot be opened is reported as a problem, not raised (except busy)."""
    t0 = time.perf_counter()
    mode = "integrity_check" if full else "quick_check"
    try:
        state = inspect_file(path)
        conn = connect_readonly(state.path, wait)
    except DatabaseError as exc:
        return CheckReport(Path(path), False, mode, "unknown", (str(exc),), time.perf_counter() - t0)
    try:
        rows = conn.execute(f"PRAGMA {mode}({int(max_errors)})").fetchall()
        problems = tuple(str(r[0]) for r in rows if str(r[0]) != "ok")
    except apsw.BusyError:
        raise (wait or BusyWait()).busy_error(state.path) from None
    except apsw.Error as exc:
        problems = (explain_error(exc, state.path) or _plain(exc),)
    finally:
        conn.close()
    return CheckReport(state.path, not problems, mode, "wal" if state.wal else "rollback", problems,
                       time.perf_counter() - t0)


# ----------------------------------------------------------------------------------------------------------------------
# the data one read transaction sees


def data_fingerprint(conn: apsw.Connection) -> dict[str, Any]:
    """A cheap identity of the data ``conn`` sees (call inside one read transaction on a connection without the
    sandbox's authorizer): a SHA-256 of the schema, the page and free-page counts, and per table its largest rowid
    (a B-tree descent, not a scan; inserts move it) or, for WITHOUT ROWID tables, its row count (a scan of that
    table). An in-place update that changes neither pages nor rowids goes unnoticed: the fingerprint guards
    statistics, which such updates barely move. (The header's change counter is not used: it is not kept in WAL
    mode, and reading the file beside SQLite would drop SQLite's POSIX locks on it.)"""
    schema = conn.execute("SELECT type, name, tbl_name, sql FROM sqlite_schema ORDER BY type, name").fetchall()
    rows: dict[str, int | None] = {}
    for typ, name, _tbl, sql in schema:
        text = " ".join((sql or "").upper().split())
        if typ != "table" or name.startswith("sqlite_") or text.startswith("CREATE VIRTUAL"):
            continue
        quoted = '"' + name.replace('"', '""') + '"'
        probe = "count(*)" if "WITHOUT ROWID" in text else "max(_rowid_)"
        rows[name] = conn.execute(f"SELECT {probe} FROM {quoted}").fetchall()[0][0]
    return {
        "schema_sha256": hashlib.sha256(repr(schema).encode()).hexdigest(),
        "page_count": conn.execute("PRAGMA page_count").fetchall()[0][0],
        "freelist_count": conn.execute("PRAGMA freelist_count").fetchall()[0][0],
        "max_rowid": rows,
    }


def file_stamp(path: str | Path) -> tuple:
    """(size, mtime) of the file and of its ``-wal`` file: unchanged stamps mean unchanged data (a cheap test done
    before the fingerprint)."""
    p = Path(path)
    out: list = []
    for f in (p, p.with_name(p.name + "-wal")):
        try:
            st = f.stat()
            out.append((st.st_size, st.st_mtime_ns))
        except OSError:
            out.append(None)
    return tuple(out)
