"""A read-only, sandboxed SQLite connection with exact, capped VM-step accounting.

`Sandbox` wraps one `apsw` connection to one database file. It is the lowest enforcement layer of the shield:

- **Read-only.** The file is opened with a ``file:...?mode=ro`` URI (``SQLITE_OPEN_READONLY | SQLITE_OPEN_URI``);
  extension loading, ATTACH-created/written files and FTS3 tokenizers are disabled through ``sqlite3_db_config``;
  the schema is untrusted (``TRUSTED_SCHEMA=0``) and the connection is ``DEFENSIVE``.
- **Authorizer (the real gate).** Only ``SQLITE_SELECT``, ``SQLITE_READ`` (of the database's own tables and views,
  ``sqlite_schema``, the JSON table-valued functions, and CTEs referenced without reading a column),
  ``SQLITE_FUNCTION`` (for the vetted `ALLOWED_FUNCTIONS`) and ``SQLITE_RECURSIVE`` are allowed. Every write and
  DDL (TEMP objects included), ATTACH/DETACH, PRAGMA (also the ``pragma_*`` table-valued functions), transactions
  and savepoints, ANALYZE, REINDEX, virtual tables and every other function are denied at prepare time, whatever
  the SQL text looks like.
- **Statement check (the clean error message).** A comment-, string- and identifier-aware lexer requires exactly one
  statement starting with SELECT, WITH or VALUES; as backstops, an exec tracer refuses any second statement and
  any statement that ``sqlite3_stmt_readonly`` says would write (e.g. REINDEX, which the authorizer never sees).
- **Limits** (`SandboxLimits`): SQL length, string/blob length, expression depth, compound SELECTs, bound
  variables, function arguments, LIKE pattern length, program size; no attached databases.
- **VM steps.** The exact per-statement ``SQLITE_STMTSTATUS_VM_STEP`` count comes from apsw's ``trace_v2`` profile
  event (fired when the statement completes, fails, is interrupted or is reset), so counts are exact and
  deterministic (apsw bundles a pinned SQLite). The *cap* is enforced with the progress handler, which SQLite runs
  at loop bottoms and before returning from each ``sqlite3_step`` and calls once per ``N`` opcodes crossed, so at
  those points ``ticks == count // N`` (verified in the tests). Between two such points the VM runs a straight
  stretch of fewer than ``margin = 2 * program_length + 16`` opcodes (every loop goes back through a checked jump).
  Tick ``t`` therefore lets the statement continue only while ``(t + 1) * N + margin - 1 <= cap``, which keeps the
  count at or below the cap at every moment; a cap below ``margin`` stops the statement before its first opcode.
  ``N`` is about ``cap / 1024`` (so at most ~1,000 Python callbacks per statement and < 0.2% of the cap unused).
  Every run prepares a fresh program (no statement cache): SQLite phases the handler by the statement's previous
  step count, so a reused statement would tick one early and stop at a count that depends on its history.

- **Live files** (`bapsql.db.dbfile`): WAL files are read through their ``-wal``/``-shm`` files (never blocking
  writers), a writer's lock is waited for with a bounded busy handler (``wait``: `BusyWait`, armed once per public
  call; ``last_wait_s`` is what the last call waited), and a hot journal or a damaged file is a `DatabaseError`
  naming the cause and the fix at open.
- **Snapshots.** `begin_snapshot` opens one read transaction that every later statement reads from, until
  `end_snapshot`: an episode's queries all see one committed state. Episodes that overlap on one sandbox (model
  rollouts interleave episodes on a worker) share that snapshot; it ends with the last of them. In WAL mode writers
  keep committing meanwhile; in rollback-journal mode the shared lock makes a writer's commit wait until the
  snapshot ends (SQLite cannot give a rollback-journal reader a stable view any other way), so keep WAL for
  databases that are written live.

Contract: one open `RowStream` per sandbox at a time; `RowStream.vm_steps` is exact once the stream has ended
(exhausted, interrupted, failed or closed) and a tick-granular lower bound while rows are still being read.
Errors: `DatabaseError` (cannot open), `SQLRejected` (refused before running; ``.code`` says why),
`SQLExecutionError` (SQLite error while preparing or running), `DatabaseBusy` (a writer held its lock for the
whole bounded wait).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import apsw

from bapsql.db.allowlist import (
    ALLOWED_FUNCTIONS, ALLOWED_TABLE_FUNCTIONS, DENIED_ACTIONS, DENIED_TABLE_FUNCTIONS, KEYWORD_CODES, READ_KEYWORDS,
    SCHEMA_TABLES, scan_statement,
)
from bapsql.db.dbfile import DEFAULT_BUSY_TIMEOUT_S, BusyWait, connect_readonly, data_fingerprint
from bapsql.db.rowstream import RowStream, message_of
from bapsql.errors import DatabaseError, SQLExecutionError, SQLRejected

__all__ = ["ALLOWED_FUNCTIONS", "QueryResult", "RowStream", "Sandbox", "SandboxLimits"]

@dataclass(frozen=True)
class SandboxLimits:
    """SQLite limits applied to every sandbox connection (``sqlite3_limit``); attached databases are always 0."""

    max_sql_length: int = 20_000  # SQLITE_LIMIT_SQL_LENGTH, bytes of SQL text
    max_length: int = 1_000_000  # SQLITE_LIMIT_LENGTH: largest string or blob a query can build
    max_expr_depth: int = 100  # SQLITE_LIMIT_EXPR_DEPTH
    max_compound_select: int = 50  # SQLITE_LIMIT_COMPOUND_SELECT
    max_variable_number: int = 0  # SQLITE_LIMIT_VARIABLE_NUMBER: policy SQL is self-contained, never bound
    max_function_arg: int = 100  # SQLITE_LIMIT_FUNCTION_ARG
    max_like_pattern_length: int = 10_000  # SQLITE_LIMIT_LIKE_PATTERN_LENGTH
    max_vdbe_op: int = 100_000  # SQLITE_LIMIT_VDBE_OP: opcodes in one prepared program

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"SandboxLimits.{name} must be a non-negative int, got {value!r}")


@dataclass(frozen=True)
class QueryResult:
    """A fully read result: ``rows`` are the rows kept (at most ``max_rows``), ``rows_total`` all rows produced
    before the statement ended (completion or VM-step cap)."""

    columns: tuple[str, ...]
    rows: tuple[tuple, ...]
    vm_steps: int
    interrupted: bool
    rows_total: int


class Sandbox:
    """One read-only apsw connection to one SQLite file (see the module docstring for the rules it enforces)."""

    def __init__(self, db_path: str | Path, limits: SandboxLimits = SandboxLimits(), *,
                 busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S) -> None:
        self.limits = limits
        self.wait = BusyWait(busy_timeout_s)
        conn = connect_readonly(db_path, self.wait)  # DatabaseError (cause and fix) or DatabaseBusy
        self.path: Path = Path(conn.filename)
        self._trusted = False  # the sandbox's own BEGIN / COMMIT / PRAGMA pass the authorizer
        self._holders = 0  # episodes sharing the open snapshot (begin_snapshot / end_snapshot)
        try:
            names = conn.execute("SELECT name FROM sqlite_schema WHERE type IN ('table', 'view')").fetchall()
        except apsw.Error as exc:
            conn.close()
            raise DatabaseError(f"{self.path} is not a readable SQLite database: {exc}") from exc
        self._conn = conn
        self._readable = frozenset(str(r[0]).lower() for r in names) | SCHEMA_TABLES | ALLOWED_TABLE_FUNCTIONS
        for op, value in (
            (apsw.SQLITE_DBCONFIG_ENABLE_LOAD_EXTENSION, 0),
            (apsw.SQLITE_DBCONFIG_DEFENSIVE, 1),
            (apsw.SQLITE_DBCONFIG_TRUSTED_SCHEMA, 0),
            (apsw.SQLITE_DBCONFIG_ENABLE_ATTACH_CREATE, 0),
            (apsw.SQLITE_DBCONFIG_ENABLE_ATTACH_WRITE, 0),
            (apsw.SQLITE_DBCONFIG_ENABLE_FTS3_TOKENIZER, 0),
            (apsw.SQLITE_DBCONFIG_ENABLE_TRIGGER, 0),
        ):
            conn.config(op, value)
        conn.enable_load_extension(False)
        for limit, value in (
            (apsw.SQLITE_LIMIT_SQL_LENGTH, limits.max_sql_length),
            (apsw.SQLITE_LIMIT_LENGTH, limits.max_length),
            (apsw.SQLITE_LIMIT_EXPR_DEPTH, limits.max_expr_depth),
            (apsw.SQLITE_LIMIT_COMPOUND_SELECT, limits.max_compound_select),
            (apsw.SQLITE_LIMIT_VARIABLE_NUMBER, limits.max_variable_number),
            (apsw.SQLITE_LIMIT_FUNCTION_ARG, limits.max_function_arg),
            (apsw.SQLITE_LIMIT_LIKE_PATTERN_LENGTH, limits.max_like_pattern_length),
            (apsw.SQLITE_LIMIT_VDBE_OP, limits.max_vdbe_op),
            (apsw.SQLITE_LIMIT_ATTACHED, 0),
            (apsw.SQLITE_LIMIT_WORKER_THREADS, 0),
        ):
            conn.limit(limit, value)
        self._denial: tuple[str, str] | None = None  # (code, message) of the last authorizer refusal
        self._profile_steps: int | None = None  # VM steps of the last statement that ended (trace_v2 profile)
        self._active: RowStream | None = None
        conn.trace_v2(apsw.SQLITE_TRACE_PROFILE, self._on_profile, id="bapsql.sandbox")
        conn.authorizer = self._authorize

    # -- gatekeeping -----------------------------------------------------------------------------------------------
    def _authorize(self, action: int, arg1: str | None, arg2: str | None, dbname: str | None, source: str | None):
        if self._trusted:
            return apsw.SQLITE_OK
        if action in (apsw.SQLITE_SELECT, apsw.SQLITE_RECURSIVE):
            return apsw.SQLITE_OK
        if action == apsw.SQLITE_READ:
            table = (arg1 or "").lower()
            if dbname in (None, "main") and (
                table in self._readable
                # A FROM item none of whose columns is read (count(*) over a CTE, say) is authorized by name only:
                # CTE names cannot be known here, so any name passes except the eponymous virtual tables.
                or (arg2 == "" and table not in DENIED_TABLE_FUNCTIONS and not table.startswith("pragma_"))
            ):
                return apsw.SQLITE_OK
            return self._deny(f"table:{table}", f"reading {arg1!r} is not allowed (pragma, temp or internal table)")
        if action == apsw.SQLITE_FUNCTION:
            name = (arg2 or "").lower()
            if name in ALLOWED_FUNCTIONS:
                return apsw.SQLITE_OK
            return self._deny(f"function:{name}", f"function {name}() is not allowed in the sandbox")
        code = DENIED_ACTIONS.get(action, "denied")
        return self._deny(code, f"{code} operations are not allowed: the sandbox is read-only (SELECT only)")

    def _deny(self, code: str, message: str) -> int:
        if self._denial is None:
            self._denial = (code, message)
        return apsw.SQLITE_DENY

    def _on_profile(self, event: dict) -> None:
        self._profile_steps = int(event["stmt_status"]["SQLITE_STMTSTATUS_VM_STEP"])

    def _rejected_from(self, exc: apsw.Error) -> SQLRejected:
        code, message = self._denial or ("denied", str(exc))
        self._denial = None
        return SQLRejected(f"{message} ({exc})", code)

    def _program_length(self, sql: str) -> int:
        """Check ``sql`` and return the number of opcodes of its prepared program (via EXPLAIN, never run)."""
        if "\x00" in sql:
            raise SQLRejected("the SQL contains a NUL byte", "nul_byte")
        if len(sql.encode("utf-8")) > self.limits.max_sql_length:
            raise SQLRejected(
                f"the SQL is longer than {self.limits.max_sql_length:,} bytes; shorten the query", "sql_too_long"
            )
        first, more = scan_statement(sql)
        if not first:
            raise SQLRejected("empty SQL: write one SELECT statement", "empty")
        if first in KEYWORD_CODES:
            raise SQLRejected(
                f"only one read-only SELECT / WITH / VALUES statement is allowed, got {first.upper()!r}",
                KEYWORD_CODES[first],
            )
        if more:
            raise SQLRejected("only one statement is allowed; remove everything after the first ';'",
                              "multiple_statements")
        self._denial = None
        cursor = self._conn.cursor()
        readonly: list[bool] = []
        cursor.exec_trace = lambda c, text, bindings: readonly.append(c.is_readonly) or True
        try:  # an unknown first word is left to SQLite, whose syntax error is the better message
            length = len(cursor.execute(sql, can_cache=False, explain=1).fetchall())
        except apsw.BusyError:
            raise self.wait.busy_error(self.path) from None
        except apsw.Error as exc:
            if self._denial is not None or isinstance(exc, apsw.AuthError):
                raise self._rejected_from(exc) from None
            raise SQLExecutionError(message_of(exc, self.path)) from None
        finally:
            cursor.close()
        if not all(readonly):  # sqlite3_stmt_readonly: a backstop for writes the authorizer is not asked about
            raise SQLRejected("the statement would write to the database: the sandbox is read-only", "write")
        if first not in READ_KEYWORDS:
            raise SQLRejected(
                f"only one read-only SELECT / WITH / VALUES statement is allowed, got {first.upper()!r}", "not_select"
            )
        return length

    # -- public API --------------------------------------------------------------------------------------------------
    def check(self, sql: str) -> None:
        """Raise `SQLRejected` unless ``sql`` is exactly one read-only SELECT/WITH/VALUES statement that passes the
        authorizer (prepared, never run); `SQLExecutionError` if SQLite cannot prepare it (syntax, unknown name)."""
        self.wait.arm()
        self._program_length(sql)

    def stream(self, sql: str, *, vm_step_cap: int | None) -> "RowStream":
        """`check` ``sql`` then start executing it under the VM-step cap (``None``: uncapped). The returned
        `RowStream` yields row tuples; close it (or use ``with``) before starting another statement. Errors of the
        check raise here; errors while running (even in the first step) raise from iteration, after which
        ``vm_steps`` holds the steps spent."""
        if vm_step_cap is not None and vm_step_cap < 0:
            raise ValueError(f"vm_step_cap must be >= 0 or None, got {vm_step_cap}")
        if self._active is not None:
            raise RuntimeError("a RowStream is still open on this Sandbox; close it before starting another")
        self.wait.arm()
        program_length = self._program_length(sql)
        stream = RowStream(self, sql, vm_step_cap, program_length)
        self._active = stream
        try:
            stream._start()
        except BaseException:
            stream.close()
            raise
        return stream

    def query(self, sql: str, *, vm_step_cap: int | None = None, max_rows: int | None = None) -> QueryResult:
        """Run ``sql`` to completion (or the VM-step cap), keeping at most ``max_rows`` rows but counting all."""
        kept: list[tuple] = []
        total = 0
        with self.stream(sql, vm_step_cap=vm_step_cap) as rs:
            for row in rs:
                total += 1
                if max_rows is None or len(kept) < max_rows:
                    kept.append(row)
        return QueryResult(rs.columns, tuple(kept), rs.vm_steps, rs.interrupted, total)

    def explain_plan(self, sql: str) -> tuple[str, ...]:
        """``EXPLAIN QUERY PLAN`` detail lines of ``sql`` (checked first, never run), indented two spaces per
        level of nesting."""
        rows = self._explain(sql, 2)
        depth: dict[int, int] = {}
        lines = []
        for node_id, parent, _unused, detail in rows:
            depth[node_id] = depth.get(parent, -1) + 1
            lines.append("  " * depth[node_id] + str(detail))
        return tuple(lines)

    def program(self, sql: str) -> list[tuple]:
        """The ``EXPLAIN`` rows of ``sql`` (checked first, never run): the bytecode the estimator models. Prepared on
        this connection, so inside a snapshot it describes the snapshot's schema and takes no lock of its own."""
        return self._explain(sql, 1)

    def _explain(self, sql: str, mode: int) -> list[tuple]:
        """The rows of ``EXPLAIN`` (``mode`` 1) or ``EXPLAIN QUERY PLAN`` (2) of ``sql``: checked first, never run;
        a writer's lock past the bounded wait raises `DatabaseBusy`."""
        self.wait.arm()
        self._program_length(sql)
        cursor = self._conn.cursor()
        try:
            return cursor.execute(sql, can_cache=False, explain=mode).fetchall()
        except apsw.BusyError:
            raise self.wait.busy_error(self.path) from None
        except apsw.Error as exc:
            raise SQLExecutionError(message_of(exc, self.path)) from None
        finally:
            cursor.close()

    @property
    def last_wait_s(self) -> float:
        """Seconds the last public call (check, stream and its rows, snapshot, ...) waited for another program's
        lock."""
        return self.wait.waited_s

    @property
    def in_snapshot(self) -> bool:
        return self._conn is not None and not self._conn.get_autocommit()

    def _trusted_rows(self, sql: str) -> list[tuple]:
        """Run the sandbox's own fixed SQL (BEGIN, COMMIT, fingerprint PRAGMAs) past the authorizer."""
        self._trusted = True
        try:
            return self._conn.execute(sql).fetchall()
        finally:
            self._trusted = False

    def begin_snapshot(self, *, deadline: float | None = None) -> float:
        """Join (or open) the read transaction every later statement reads from, and return the seconds waited for
        a writer's lock. Holders are counted: episodes that overlap on one sandbox share its snapshot, which ends
        when the last of them calls `end_snapshot`. ``deadline`` (``time.monotonic()``) cuts the busy timeout to
        what the request may still spend. Raises `DatabaseBusy` when the lock stayed held for the whole wait (the
        caller holds nothing then)."""
        if self._active is not None:
            raise RuntimeError("a RowStream is still open on this Sandbox; close it before starting a snapshot")
        if self._holders > 0 and self.in_snapshot:
            self._holders += 1
            return 0.0
        self.wait.deadline = deadline
        self.wait.arm()
        try:
            self._trusted_rows("BEGIN DEFERRED")
            self._trusted_rows("SELECT count(*) FROM sqlite_schema")  # the first read fixes the snapshot
        except apsw.BusyError:
            self._end()
            raise self.wait.busy_error(self.path) from None
        except apsw.Error as exc:
            self._end()
            raise SQLExecutionError(message_of(exc, self.path)) from None
        finally:
            self.wait.deadline = None
        self._holders = 1
        return self.wait.waited_s

    def end_snapshot(self) -> None:
        """Leave the snapshot; the last holder ends its read transaction, after which statements each read the
        newest committed state. Call once per successful `begin_snapshot`."""
        self._holders = max(0, self._holders - 1)
        if self._holders == 0:
            if self._active is not None:
                self._active.close()
            self._end()

    def _end(self) -> None:
        if self.in_snapshot:
            try:
                self._trusted_rows("COMMIT")
            except apsw.Error:  # a read transaction has nothing to commit; rolling back is as good
                self._trusted_rows("ROLLBACK")

    def fingerprint(self) -> dict:
        """`bapsql.db.dbfile.data_fingerprint` of the data this connection sees now (the snapshot's, inside one).
        Raises `DatabaseBusy` when a writer held its lock for the whole wait."""
        self.wait.arm()
        self._trusted = True
        try:
            return data_fingerprint(self._conn)
        except apsw.BusyError:
            raise self.wait.busy_error(self.path) from None
        finally:
            self._trusted = False

    def close(self) -> None:
        """Close the connection (idempotent)."""
        if self._active is not None:
            self._active.close()
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Sandbox({str(self.path)!r})"


