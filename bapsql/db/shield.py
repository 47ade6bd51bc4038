"""The runtime shield: the only enforcement of the hard budget caps (DESIGN §3).

`Shield.execute(sql, caps)` checks the SQL in the `Sandbox`, runs it under the VM-step cap and admits rows into
the visible result while rows, bytes and result tokens stay within their caps. A row that would cross a cap is not
admitted and the result becomes ``truncated`` (``truncated_by`` names the cap). Truncation never refunds the scan:
after a visible cap is hit the statement keeps stepping (VM steps charged, ``rows_total`` and
``full_result_tokens`` counted) until it completes or the VM-step cap stops it. What is charged (`Cost`) is the
admitted output plus every VM step spent; by construction no `Cost` field can exceed its cap, and ``breach`` audits
that anyway. Refusals become ``rejected`` results (with a machine ``rejection`` code) and SQLite errors ``error``
results; `execute` never raises for bad SQL. A database another program keeps locked for the whole bounded wait
(`bapsql.db.dbfile.BusyWait`) becomes a ``rejected`` result with code ``busy``: nothing is admitted, only the VM
steps already spent (if any) are charged, and it is nobody's SQL error. ``wait_s`` reports the time spent waiting
for other programs' locks in every result.

Result tokens and bytes follow the charging contract of `bapsql.db.rows` (header charged with the first admitted
row, lines counted separately). ``full_result_tokens`` is a diagnostic: exact for the first `EXACT_TOKEN_ROWS` rows
past the visible ones, then extrapolated at their mean tokens per row; None when the VM cap stopped the statement.

`Shield.preflight(estimate, caps)` rejects clearly infeasible executions before anything runs: no VM steps left,
an estimate that failed, or an estimated median VM-step count above the cap.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Literal

from bapsql.db.rows import render_header, render_row
from bapsql.db.sandbox import Sandbox
from bapsql.errors import DatabaseBusy, SQLExecutionError, SQLRejected
from bapsql.tokens import TokenCounter

if TYPE_CHECKING:
    from bapsql.db.estimator import Estimate

Status = Literal["ok", "truncated", "rejected", "error"]
EXACT_TOKEN_ROWS = 1_000  # rows past the visible cap whose tokens are counted exactly (then extrapolated)


@dataclass(frozen=True)
class Caps:
    """Hard caps for one execution: VM steps, result tokens, visible rows and visible bytes."""

    vm_steps: int
    result_tokens: int
    rows: int = 200
    bytes: int = 65_536

    def __post_init__(self) -> None:
        for name in ("vm_steps", "result_tokens", "rows", "bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"Caps.{name} must be a non-negative int, got {value!r}")


@dataclass(frozen=True)
class Cost:
    """What one execution is charged: every VM step spent and the admitted (visible) output."""

    vm_steps: int
    result_tokens: int
    rows: int
    bytes: int

    def exceeds(self, caps: Caps) -> bool:
        """True when any field is above its cap (an audit failure; the shield never produces one)."""
        return (
            self.vm_steps > caps.vm_steps
            or self.result_tokens > caps.result_tokens
            or self.rows > caps.rows
            or self.bytes > caps.bytes
        )


ZERO_COST = Cost(0, 0, 0, 0)


@dataclass(frozen=True)
class ShieldResult:
    """The typed outcome of one shielded execution (or preflight rejection)."""

    status: Status
    columns: tuple[str, ...]
    rows: tuple[tuple, ...]  # the visible (admitted) rows
    truncated_by: str | None  # "rows" | "bytes" | "result_tokens" | "vm_steps" | None
    rows_total: int | None  # rows produced in all (None if the VM cap stopped the statement)
    full_result_tokens: int | None  # tokens the whole result would have cost (None if unknown)
    cost: Cost
    message: str  # why, when not ok
    rejection: str | None  # machine code of a refusal, e.g. "write", "function:randomblob", "preflight_vm_steps"
    breach: bool  # audit: any cost above its cap (must never happen)
    wait_s: float = 0.0  # seconds spent waiting for another program's lock on the database


def _rejected(code: str, message: str, wait_s: float = 0.0) -> ShieldResult:
    return ShieldResult("rejected", (), (), None, None, None, ZERO_COST, message, code, False, wait_s)


def busy_result(exc: DatabaseBusy, cost: Cost = ZERO_COST, columns: tuple[str, ...] = ()) -> ShieldResult:
    """The ``rejected`` / ``busy`` result of a statement that could not get the database's lock in time."""
    return ShieldResult("rejected", columns, (), None, None, None, cost, str(exc), "busy", False, exc.waited_s)


class Shield:
    """Runs policy SQL against one `Sandbox` under hard caps, charging tokens with ``token_counter``."""

    def __init__(self, sandbox: Sandbox, token_counter: TokenCounter) -> None:
        self.sandbox = sandbox
        self.token_counter = token_counter

    def preflight(self, estimate: "Estimate", caps: Caps) -> ShieldResult | None:
        """A ``rejected`` result when executing is clearly infeasible, else None. Costs nothing."""
        if caps.vm_steps == 0:
            return _rejected("no_vm_steps", "no VM steps are left in the budget; the query cannot run")
        if estimate.error is not None:
            return _rejected("estimate_error", f"the query cannot run: {estimate.error}")
        if estimate.vm_steps.p50 > caps.vm_steps:
            return _rejected(
                "preflight_vm_steps",
                f"the estimated median cost ({estimate.vm_steps.p50:,.0f} VM steps) is above the "
                f"{caps.vm_steps:,} VM steps left; the query would almost surely be stopped. Narrow it "
                "(filters, aggregation, LIMIT) or rewrite it",
            )
        return None

    def execute(self, sql: str, caps: Caps, *,
                observe: Callable[[tuple[str, ...], tuple], None] | None = None) -> ShieldResult:
        """Check, run and admit ``sql`` under ``caps`` (see the module docstring). Never raises for bad SQL.

        ``observe(columns, row)`` is called with every row the statement produces, admitted or not (the post-hoc
        controller profiles the whole result this way); it sees nothing the VM-step cap stopped."""
        if caps.vm_steps == 0:
            return _rejected("no_vm_steps", "no VM steps are left in the budget; the query cannot run")
        try:
            stream = self.sandbox.stream(sql, vm_step_cap=caps.vm_steps)
        except DatabaseBusy as exc:
            return busy_result(exc)
        except SQLRejected as exc:
            return _rejected(exc.code, str(exc), self.sandbox.last_wait_s)
        except SQLExecutionError as exc:
            return ShieldResult("error", (), (), None, None, None, ZERO_COST, str(exc), None, False,
                                self.sandbox.last_wait_s)

        count = self.token_counter.count
        admitted: list[tuple] = []
        tokens = nbytes = 0
        truncated_by: str | None = None
        rows_total = 0
        full_tokens = 0  # tokens of every row seen whose tokens were counted (header included once)
        counted_rows = 0  # rows whose tokens are in full_tokens
        extra_counted = 0  # of those, rows past the visible output
        header_tokens = header_bytes = 0
        with stream:
            columns = stream.columns
            try:
                for row in stream:
                    rows_total += 1
                    if observe is not None:
                        observe(columns, row)
                    if truncated_by is None:
                        line = render_row(row)
                        t = count(line)
                        b = len(line.encode("utf-8"))
                        if not admitted:
                            header = render_header(columns)
                            header_tokens, header_bytes = count(header), len(header.encode("utf-8"))
                            add_t, add_b = header_tokens + t, header_bytes + 1 + b
                        else:
                            add_t, add_b = t, 1 + b
                        full_tokens += t
                        counted_rows += 1
                        if len(admitted) + 1 > caps.rows:
                            truncated_by = "rows"
                        elif nbytes + add_b > caps.bytes:
                            truncated_by = "bytes"
                        elif tokens + add_t > caps.result_tokens:
                            truncated_by = "result_tokens"
                        else:
                            admitted.append(row)
                            tokens += add_t
                            nbytes += add_b
                    elif extra_counted < EXACT_TOKEN_ROWS:
                        full_tokens += count(render_row(row))
                        counted_rows += 1
                        extra_counted += 1
            except (SQLExecutionError, SQLRejected, DatabaseBusy) as exc:  # failed while running: steps are charged
                stream.close()
                cost = Cost(stream.vm_steps, 0, 0, 0)
                wait = self.sandbox.last_wait_s
                if isinstance(exc, DatabaseBusy):
                    return busy_result(exc, cost, columns)
                if isinstance(exc, SQLRejected):
                    return ShieldResult("rejected", columns, (), None, None, None, cost, str(exc), exc.code,
                                        cost.exceeds(caps), wait)
                return ShieldResult("error", columns, (), None, None, None, cost, str(exc), None, cost.exceeds(caps),
                                    wait)
        cost = Cost(stream.vm_steps, tokens, len(admitted), nbytes)
        interrupted = stream.interrupted
        if interrupted:
            total, full = None, None
        else:
            total = rows_total
            if rows_total == 0:
                full = 0
            else:  # the header was counted with the first row
                mean = full_tokens / counted_rows
                full = header_tokens + round(full_tokens + (rows_total - counted_rows) * mean)
        message = _message(truncated_by, interrupted, caps, len(admitted), total)
        if interrupted:
            status, cut = "truncated", "vm_steps"
        elif truncated_by is not None:
            status, cut = "truncated", truncated_by
        else:
            status, cut = "ok", None
        return ShieldResult(status, columns, tuple(admitted), cut, total, full, cost, message, None,
                            cost.exceeds(caps), self.sandbox.last_wait_s)


def _message(truncated_by: str | None, interrupted: bool, caps: Caps, shown: int, total: int | None) -> str:
    parts = []
    if truncated_by is not None:
        cap = {"rows": f"{caps.rows:,} rows", "bytes": f"{caps.bytes:,} bytes",
               "result_tokens": f"{caps.result_tokens:,} result tokens"}[truncated_by]
        parts.append(f"output truncated to {shown:,} rows by the cap of {cap}")
    if interrupted:
        parts.append(f"stopped by the VM-step cap ({caps.vm_steps:,} steps) before the query finished; "
                     "the result is incomplete")
    elif truncated_by is not None:
        parts.append(f"the query produced {total:,} rows in all")
    return "; ".join(parts)
