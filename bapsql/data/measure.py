"""What a query costs when run unshielded: rows, result tokens and exact VM steps (for task tags and statistics).

Contract: `measure` runs SQL read-only through `bapsql.db.sandbox.Sandbox` under a VM-step cap (one above a
budget's VM steps decides "exceeds that budget" at the least cost) and counts result tokens exactly as the shield
charges them (`bapsql.db.rows`: header + each row line, counted separately). Results of more than `TOKEN_ROWS`
rows are tokenized on their first `TOKEN_ROWS` rows and extrapolated linearly (``partial``); a ``token_limit``
stops reading early. `measurement_token_counter` defers to `bapsql.db.handle.default_counter`, the one place that
decides which counter tools use.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from bapsql.budgets import Budget
from bapsql.tokens import RegexTokenCounter, TokenCounter

TOKEN_ROWS = 200


@dataclass(frozen=True)
class QueryCost:
    """Unshielded cost of one query. ``interrupted``: stopped at the VM cap (so exceeds every budget)."""

    rows: int
    result_tokens: int
    vm_steps: int
    interrupted: bool
    partial: bool  # result_tokens extrapolated from the first TOKEN_ROWS rows

    def fits(self, budget: Budget) -> bool:
        """True when one run of the query fits the budget's result-token and VM-step channels."""
        return (not self.interrupted and self.vm_steps <= budget.vm_steps
                and self.result_tokens <= budget.result_tokens)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, obj: dict) -> "QueryCost":
        return cls(**obj)


def measurement_token_counter() -> tuple[str, TokenCounter]:
    """(spec, counter) of `bapsql.db.handle.default_counter` (the packaged tokenizer when installed, else the regex
    approximation); the spec ("default" or "regex") is what benchmark.json records."""
    from bapsql.db.handle import default_counter

    counter = default_counter()
    return ("regex" if isinstance(counter, RegexTokenCounter) else "default"), counter


def measure(sandbox, sql: str, counter: TokenCounter, *, vm_step_cap: int, token_limit: int | None = None) -> QueryCost:
    """Run ``sql`` on ``sandbox`` (read-only) under ``vm_step_cap`` and measure it (``interrupted`` when the cap
    stopped it: then ``rows`` and ``result_tokens`` count only what came before). With ``token_limit``, reading stops
    as soon as the result tokens exceed it (``partial``: rows, tokens and VM steps are lower bounds that already
    decide "exceeds"). Raises the sandbox's errors for bad SQL."""
    from bapsql.db.rows import render_header, render_row

    rows = counted = tokens = header = 0
    stopped = False
    with sandbox.stream(sql, vm_step_cap=vm_step_cap) as rs:
        for row in rs:
            rows += 1
            if rows == 1:
                header = tokens = counter.count(render_header(rs.columns))
            if rows <= TOKEN_ROWS:
                tokens += counter.count(render_row(row))
                counted = rows
            if token_limit is not None and tokens > token_limit:
                stopped = True
                break
    if counted < rows and not stopped:  # tokenized a prefix only: extrapolate the body linearly
        tokens = header + round((tokens - header) * rows / counted)
    return QueryCost(rows, tokens, rs.vm_steps, rs.interrupted, stopped or counted < rows)
