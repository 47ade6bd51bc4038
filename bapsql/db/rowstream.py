"""An executing sandbox statement: `RowStream` yields rows under the VM-step cap and reports the exact VM steps spent.

The cap is enforced with the progress handler (see `bapsql.db.sandbox` for why ticks bound the count); the exact
count comes from the trace_v2 profile event SQLite fires when the statement completes, fails, is interrupted or is
reset, so a statement stopped while running (cap, interrupt, an SQL error mid-run, a busy lock) still reports every
step it spent. Errors while running raise from iteration, after ``vm_steps`` is final: `SQLRejected`,
`SQLExecutionError` (with cause and fix when the file, not the SQL, is at fault) or `DatabaseBusy`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

import apsw

from bapsql.db.allowlist import scan_statement
from bapsql.db.dbfile import explain_error
from bapsql.errors import SQLExecutionError, SQLRejected

if TYPE_CHECKING:  # pragma: no cover
    from bapsql.db.sandbox import Sandbox

TICKS_PER_CAP = 1024  # progress-handler granularity: N ≈ cap / TICKS_PER_CAP


class RowStream:
    """An executing statement: iterate for row tuples; a context manager that finalizes the statement.

    ``columns`` are the output column names; ``vm_steps`` the VM steps so far (exact once the stream has ended,
    never above the cap); ``interrupted`` is True when the VM-step cap stopped the statement.
    """

    def __init__(self, sandbox: "Sandbox", sql: str, cap: int | None, program_length: int) -> None:
        self._sandbox = sandbox
        self._sql = sql
        self._cap = cap
        self._margin = 2 * program_length + 16
        self._every = 1 if cap is None else max(1, (cap - self._margin + 1) // TICKS_PER_CAP)
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
            if not scan_statement(sql)[0]:
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
            except apsw.BusyError:
                raise sb.wait.busy_error(sb.path) from None
            except apsw.Error as exc:
                raise SQLExecutionError(message_of(exc, self._sandbox.path)) from None
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
        if isinstance(exc, apsw.BusyError):
            raise self._sandbox.wait.busy_error(self._sandbox.path) from None
        if isinstance(exc, apsw.ExecTraceAbort) and self._multiple:
            raise SQLRejected("only one statement is allowed; remove everything after the first ';'",
                              "multiple_statements") from None
        if isinstance(exc, apsw.ExecTraceAbort) and self._writes:
            raise SQLRejected("the statement would write to the database: the sandbox is read-only", "write") from None
        if self._sandbox._denial is not None or isinstance(exc, apsw.AuthError):
            raise self._sandbox._rejected_from(exc) from None
        raise SQLExecutionError(message_of(exc, self._sandbox.path)) from None

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


def message_of(exc: apsw.Error, path=None) -> str:
    """SQLite's message for an apsw error, without apsw's class-name prefix; the cause and the fix instead when the
    database file (hot journal, damage), not the SQL, is at fault."""
    if path is not None:
        explained = explain_error(exc, path)
        if explained is not None:
            return explained
    text = str(exc)
    head, sep, rest = text.partition(": ")
    return rest if sep and head.endswith("Error") else text
