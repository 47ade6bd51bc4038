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

Contract: one open `RowStream` per sandbox at a time; `RowStream.vm_steps` is exact once the stream has ended
(exhausted, interrupted, failed or closed) and a tick-granular lower bound while rows are still being read.
Errors: `DatabaseError` (cannot open), `SQLRejected` (refused before running; ``.code`` says why),
`SQLExecutionError` (SQLite error while preparing or running).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import apsw

from bapsql.errors import DatabaseError, SQLExecutionError, SQLRejected

# Functions a query may call. Decided one by one from `SELECT name FROM pragma_function_list` of the bundled SQLite:
# core scalar, aggregate, window, date/time, math and JSON functions that are pure and bounded by the length limit.
# Denied (absent here): load_extension; random, randomblob, zeroblob (non-deterministic or blob bombs); changes,
# total_changes, last_insert_rowid (connection state); sqlite_version, sqlite_source_id, sqlite_compileoption_*,
# sqlite_log (introspection / writes to the error log); fts3_tokenizer, fts5*, bm25, highlight, snippet, offsets,
# matchinfo, match, optimize (full-text internals); rtreecheck, rtreedepth, rtreenode, geopoly_* (extension
# internals); subtype. The date/time functions accept 'now' (as do current_date/time/timestamp): benchmark gold SQL
# uses them, and their only hazard is that a result depends on the clock.
ALLOWED_FUNCTIONS: frozenset[str] = frozenset(
    """
    -> ->> abs acos acosh asin asinh atan atan2 atanh avg ceil ceiling char coalesce concat concat_ws cos cosh count
    cume_dist current_date current_time current_timestamp date datetime degrees dense_rank exp first_value floor
    format glob group_concat hex if ifnull iif instr json json_array json_array_insert json_array_length
    json_error_position json_extract json_group_array json_group_object json_insert json_object json_patch
    json_pretty json_quote json_remove json_replace json_set json_type json_valid jsonb jsonb_array
    jsonb_array_insert jsonb_extract jsonb_group_array jsonb_group_object jsonb_insert jsonb_object jsonb_patch
    jsonb_remove jsonb_replace jsonb_set julianday lag last_value lead length like likelihood likely ln log log10 log2
    lower ltrim max median min mod nth_value ntile nullif octet_length percent_rank percentile percentile_cont
    percentile_disc pi pow power printf quote radians rank replace round row_number rtrim sign sin sinh sqrt strftime
    string_agg substr substring sum tan tanh time timediff total trim trunc typeof unhex unicode unistr unistr_quote
    unixepoch unlikely upper
    """.split()
)

# Table-valued functions (eponymous virtual tables) a query may read besides the database's own tables and views.
ALLOWED_TABLE_FUNCTIONS: frozenset[str] = frozenset({"json_each", "json_tree", "jsonb_each", "jsonb_tree"})
# Eponymous virtual tables (and temp schema tables) that are never readable, even when no column is read.
DENIED_TABLE_FUNCTIONS: frozenset[str] = frozenset(
    {"dbstat", "carray", "generate_series", "sqlite_dbpage", "sqlite_stmt", "sqlite_temp_master", "sqlite_temp_schema",
     "fts3tokenize", "fts4aux", "fts5vocab"}
)
_SCHEMA_TABLES = frozenset({"sqlite_master", "sqlite_schema"})

# Authorizer action → rejection code, for everything that is not a plain read.
_DENIED_ACTIONS: dict[int, str] = {
    **{getattr(apsw, f"SQLITE_{n}"): "write" for n in ("INSERT", "UPDATE", "DELETE", "COPY")},
    **{
        getattr(apsw, f"SQLITE_{n}"): "ddl"
        for n in (
            "CREATE_INDEX", "CREATE_TABLE", "CREATE_TEMP_INDEX", "CREATE_TEMP_TABLE", "CREATE_TEMP_TRIGGER",
            "CREATE_TEMP_VIEW", "CREATE_TRIGGER", "CREATE_VIEW", "DROP_INDEX", "DROP_TABLE", "DROP_TEMP_INDEX",
            "DROP_TEMP_TABLE", "DROP_TEMP_TRIGGER", "DROP_TEMP_VIEW", "DROP_TRIGGER", "DROP_VIEW", "ALTER_TABLE",
            "CREATE_VTABLE", "DROP_VTABLE",
        )
    },
    apsw.SQLITE_PRAGMA: "pragma",
    apsw.SQLITE_ATTACH: "attach",
    apsw.SQLITE_DETACH: "detach",
    apsw.SQLITE_TRANSACTION: "transaction",
    apsw.SQLITE_SAVEPOINT: "transaction",
    apsw.SQLITE_ANALYZE: "analyze",
    apsw.SQLITE_REINDEX: "reindex",
}

# First keyword of a refused statement → rejection code (a friendlier message than the authorizer's).
_KEYWORD_CODES: dict[str, str] = {
    "insert": "write", "update": "write", "delete": "write", "replace": "write", "upsert": "write",
    "create": "ddl", "drop": "ddl", "alter": "ddl", "pragma": "pragma", "attach": "attach", "detach": "detach",
    "begin": "transaction", "commit": "transaction", "end": "transaction", "rollback": "transaction",
    "savepoint": "transaction", "release": "transaction", "vacuum": "vacuum", "analyze": "analyze",
    "reindex": "reindex", "explain": "explain",
}
_READ_KEYWORDS = frozenset({"select", "with", "values"})
_TICKS_PER_CAP = 1024  # progress-handler granularity: N ≈ cap / _TICKS_PER_CAP


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


def _scan(sql: str) -> tuple[str, bool]:
    """Lex ``sql`` the way SQLite does for statement boundaries: skip ``--`` and ``/* */`` comments, '...' strings
    and "..."/`...`/[...] identifiers. Return (lowercased first keyword, whether non-trivial text follows the first
    top-level semicolon)."""
    i, n = 0, len(sql)
    first = ""
    seen_token = False
    after_semicolon = False
    while i < n:
        ch = sql[i]
        if ch in " \t\n\r\f\v":
            i += 1
            continue
        if sql.startswith("--", i):
            j = sql.find("\n", i)
            i = n if j < 0 else j + 1
            continue
        if sql.startswith("/*", i):
            j = sql.find("*/", i + 2)
            i = n if j < 0 else j + 2
            continue
        if ch == ";":
            after_semicolon = seen_token or after_semicolon
            i += 1
            continue
        if after_semicolon:
            return first, True
        seen_token = True
        if ch in "'\"`":
            while True:  # quoted string / identifier; a doubled quote is an escaped quote
                j = sql.find(ch, i + 1)
                if j < 0:
                    i = n
                    break
                if j + 1 < n and sql[j + 1] == ch:
                    i = j + 1
                    continue
                i = j + 1
                break
            continue
        if ch == "[":
            j = sql.find("]", i + 1)
            i = n if j < 0 else j + 1
            continue
        if not first and (ch.isalpha() or ch == "_"):
            j = i
            while j < n and (sql[j].isalnum() or sql[j] == "_"):
                j += 1
            first = sql[i:j].lower()
            i = j
            continue
        if not first:
            first = ch
        i += 1
    return first, False


class Sandbox:
    """One read-only apsw connection to one SQLite file (see the module docstring for the rules it enforces)."""

    def __init__(self, db_path: str | Path, limits: SandboxLimits = SandboxLimits()) -> None:
        path = Path(db_path).expanduser().resolve()
        if not path.is_file():
            raise DatabaseError(f"database file not found: {path}")
        self.path: Path = path
        self.limits = limits
        try:
            conn = apsw.Connection(
                path.as_uri() + "?mode=ro", flags=apsw.SQLITE_OPEN_READONLY | apsw.SQLITE_OPEN_URI
            )
        except apsw.Error as exc:
            raise DatabaseError(f"cannot open {path} read-only: {exc}") from exc
        try:
            names = conn.execute("SELECT name FROM sqlite_schema WHERE type IN ('table', 'view')").fetchall()
        except apsw.Error as exc:
            conn.close()
            raise DatabaseError(f"{path} is not a readable SQLite database: {exc}") from exc
        self._conn = conn
        self._readable = frozenset(str(r[0]).lower() for r in names) | _SCHEMA_TABLES | ALLOWED_TABLE_FUNCTIONS
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
        code = _DENIED_ACTIONS.get(action, "denied")
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
        first, more = _scan(sql)
        if not first:
            raise SQLRejected("empty SQL: write one SELECT statement", "empty")
        if first in _KEYWORD_CODES:
            raise SQLRejected(
                f"only one read-only SELECT / WITH / VALUES statement is allowed, got {first.upper()!r}",
                _KEYWORD_CODES[first],
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
        except apsw.Error as exc:
            if self._denial is not None or isinstance(exc, apsw.AuthError):
                raise self._rejected_from(exc) from None
            raise SQLExecutionError(_message(exc)) from None
        finally:
            cursor.close()
        if not all(readonly):  # sqlite3_stmt_readonly: a backstop for writes the authorizer is not asked about
            raise SQLRejected("the statement would write to the database: the sandbox is read-only", "write")
        if first not in _READ_KEYWORDS:
            raise SQLRejected(
                f"only one read-only SELECT / WITH / VALUES statement is allowed, got {first.upper()!r}", "not_select"
            )
        return length

    # -- public API --------------------------------------------------------------------------------------------------
    def check(self, sql: str) -> None:
        """Raise `SQLRejected` unless ``sql`` is exactly one read-only SELECT/WITH/VALUES statement that passes the
        authorizer (prepared, never run); `SQLExecutionError` if SQLite cannot prepare it (syntax, unknown name)."""
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
        self._program_length(sql)
        cursor = self._conn.cursor()
        try:
            rows = cursor.execute(sql, can_cache=False, explain=2).fetchall()
        except apsw.Error as exc:
            raise SQLExecutionError(_message(exc)) from None
        finally:
            cursor.close()
        depth: dict[int, int] = {}
        lines = []
        for node_id, parent, _unused, detail in rows:
            depth[node_id] = depth.get(parent, -1) + 1
            lines.append("  " * depth[node_id] + str(detail))
        return tuple(lines)

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


class RowStream:
    """An executing statement: iterate for row tuples; a context manager that finalizes the statement.

    ``columns`` are the output column names; ``vm_steps`` the VM steps so far (exact once the stream has ended,
    never above the cap); ``interrupted`` is True when the VM-step cap stopped the statement.
    """

    def __init__(self, sandbox: Sandbox, sql: str, cap: int | None, program_length: int) -> None:
        self._sandbox = sandbox
        self._sql = sql
        self._cap = cap
        self._margin = 2 * program_length + 16
        self._every = 1 if cap is None else max(1, (cap - self._margin + 1) // _TICKS_PER_CAP)
        self._ticks = 0
        self._armed = False
        self._statements = 0
        self._cursor: apsw.Cursor | None = None
        self._multiple = False
        self._writes = False
        self.columns: tuple[str, ...] = ()
        self.interrupted = False
        self.done = False
        self._final_steps: int | None = None
        self._pending: apsw.Error | None = None  # an error of the first step, raised by the first next()

    @property
    def vm_steps(self) -> int:
        if self._final_steps is not None:
            return self._final_steps
        return self._ticks * self._every if self._cap is not None else 0

    def _on_exec(self, cursor: apsw.Cursor, sql: str, bindings) -> bool:
        self._statements += 1
        if self._statements > 1:
            if not _scan(sql)[0]:
                return True  # apsw hands a comment-only tail over as a statement of its own: a no-op
            self._multiple = True
            return False
        if not cursor.is_readonly:
            self._writes = True
            return False
        self.columns = tuple(d[0] for d in cursor.description)
        self._ticks = 0
        self._armed = True
        return True

    def _on_progress(self) -> bool:
        if not self._armed:
            return False  # ticks while preparing are not VM steps
        self._ticks += 1
        if (self._ticks + 1) * self._every + self._margin - 1 > self._cap:
            self.interrupted = True
            return True
        return False

    def _start(self) -> None:
        sb = self._sandbox
        conn = sb._conn
        cursor = conn.cursor()
        cursor.exec_trace = self._on_exec
        self._cursor = cursor
        if self._cap is not None and self._cap < self._margin:
            # Too small to guarantee the cap: prepare only (for the column names) and stop before the first opcode.
            cursor.exec_trace = lambda c, s, b: (setattr(self, "columns", tuple(d[0] for d in c.description)), False)[1]
            try:
                cursor.execute(self._sql, can_cache=False)
            except apsw.ExecTraceAbort:
                pass
            except apsw.Error as exc:
                raise SQLExecutionError(_message(exc)) from None
            self.interrupted = True
            self._finish(steps=0)
            return
        if self._cap is not None:
            conn.set_progress_handler(self._on_progress, self._every)
        sb._profile_steps = None
        sb._denial = None
        try:
            cursor.execute(self._sql, can_cache=False)  # fresh program: see the module docstring
        except apsw.Error as exc:
            self._pending = exc  # raised by the first next(), once vm_steps is known to the caller's stream

    def _fail(self, exc: apsw.Error) -> None:
        """Translate an apsw error raised while running: interruption ends the stream quietly, others raise."""
        if isinstance(exc, apsw.InterruptError) and self.interrupted:
            self._finish()
            return
        self._finish()
        if isinstance(exc, apsw.ExecTraceAbort) and self._multiple:
            raise SQLRejected("only one statement is allowed; remove everything after the first ';'",
                              "multiple_statements") from None
        if isinstance(exc, apsw.ExecTraceAbort) and self._writes:
            raise SQLRejected("the statement would write to the database: the sandbox is read-only", "write") from None
        if self._sandbox._denial is not None or isinstance(exc, apsw.AuthError):
            raise self._sandbox._rejected_from(exc) from None
        raise SQLExecutionError(_message(exc)) from None

    def _finish(self, steps: int | None = None) -> None:
        if self.done:
            return
        self.done = True
        sb = self._sandbox
        if self._cursor is not None:
            try:
                self._cursor.close()  # resets the statement: the profile event reports its exact VM steps
            except apsw.Error:
                pass
        if sb._conn is not None:
            sb._conn.set_progress_handler(None)
        if steps is None:
            steps = sb._profile_steps if sb._profile_steps is not None else self._ticks * self._every
        self._final_steps = steps
        if sb._active is self:
            sb._active = None

    def __iter__(self) -> Iterator[tuple]:
        return self

    def __next__(self) -> tuple:
        if self._pending is not None:
            exc, self._pending = self._pending, None
            self._fail(exc)
            raise StopIteration
        if self.done:
            raise StopIteration
        try:
            return next(self._cursor)
        except StopIteration:
            self._finish()
            raise
        except apsw.Error as exc:
            self._fail(exc)
            raise StopIteration from None

    def close(self) -> None:
        """Finalize the statement (idempotent); ``vm_steps`` is exact afterwards."""
        self._pending = None
        self._finish()

    def __enter__(self) -> "RowStream":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _message(exc: apsw.Error) -> str:
    """SQLite's message for an apsw error, without apsw's class-name prefix."""
    text = str(exc)
    head, sep, rest = text.partition(": ")
    return rest if sep and head.endswith("Error") else text
