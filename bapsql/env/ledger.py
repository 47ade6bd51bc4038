"""The budget ledger of one episode: pure state, no I/O (DESIGN §3 "Channel semantics"; paper Problem Formulation).

Five channels of a `bapsql.budgets.Budget`, each with its own rule — one method per rule:

- ``context_tokens`` is a LEVEL: `set_context` records the live prompt at each turn; archiving or compressing
  evidence lowers it again. The peak is tracked.
- ``queries``, ``result_tokens``, ``vm_steps`` are CUMULATIVE and never refunded:
  `charge_execution` (a query that ran: one query, its VM steps, its admitted result tokens),
  `charge_probe` (estimate / rewrite: measured VM steps, no query),
  `record_rejection` (a preflight-rejected execution: no query, nothing charged),
  `charge_restore` (restoring evidence charges its result tokens again).
- ``turns``: `consume_turn` — every action, valid or not, consumes one turn.

Reported, never subtracted: prompt / completion / result / controller token totals (``total_tokens`` is their sum),
peak context, warnings, rewrites, rejections, invalid actions. Every charge that would take a channel above its
budget is still recorded (the ledger never hides spending) and flagged as a breach; `audit` raises `BudgetBreach`.
The episode never lets that happen: it checks `remaining()` first and runs the shield under `caps()`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from bapsql.budgets import CHANNELS, Budget
from bapsql.db.shield import Caps
from bapsql.errors import BudgetBreach


@dataclass(frozen=True)
class Usage:
    """One number per budget channel (spent, remaining or budget)."""

    context_tokens: int
    queries: int
    result_tokens: int
    vm_steps: int
    turns: int

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass(frozen=True)
class LedgerSnapshot:
    """An immutable view of the ledger; ``spent.context_tokens`` is the current live level."""

    budget: Usage
    spent: Usage
    remaining: Usage
    peak_context: int
    prompt_tokens: int
    completion_tokens: int
    controller_tokens: int
    total_tokens: int
    warnings: int
    rewrites: int
    rejections: int
    invalid_actions: int
    breaches: tuple[str, ...]

    def to_dict(self) -> dict:
        d = asdict(self)
        d["breaches"] = list(self.breaches)
        return d


class Ledger:
    """Mutable accounting for one episode under one `Budget` (see the module docstring for the rules)."""

    def __init__(self, budget: Budget) -> None:
        self.budget = budget
        self.context_tokens = 0
        self.queries = 0
        self.result_tokens = 0
        self.vm_steps = 0
        self.turns = 0
        self.peak_context = 0
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.controller_tokens = 0
        self.warnings = 0
        self.rewrites = 0
        self.rejections = 0
        self.invalid_actions = 0
        self._breaches: list[str] = []

    # -- the rules -------------------------------------------------------------------------------------------------
    def consume_turn(self) -> None:
        """Every action, valid or not, consumes one turn."""
        self.turns += 1
        self._check("turns")

    def set_context(self, tokens: int) -> None:
        """Context is a level: the live prompt now (it may go down after archive / compress)."""
        self.context_tokens = int(tokens)
        self.peak_context = max(self.peak_context, self.context_tokens)
        self._check("context_tokens")

    def charge_execution(self, *, vm_steps: int, result_tokens: int) -> None:
        """A query that ran: one query, its measured VM steps and its admitted result tokens; never refunded."""
        self.queries += 1
        self.vm_steps += int(vm_steps)
        self.result_tokens += int(result_tokens)
        for ch in ("queries", "vm_steps", "result_tokens"):
            self._check(ch)

    def charge_probe(self, *, vm_steps: int) -> None:
        """Estimate and rewrite run a probe: measured VM steps are charged, no query."""
        self.vm_steps += int(vm_steps)
        self._check("vm_steps")

    def record_rejection(self) -> None:
        """A rejected execution (the SQL never ran): no query, no VM steps, no result tokens (the turn is charged by
        `consume_turn`)."""
        self.rejections += 1

    def charge_restore(self, *, result_tokens: int) -> None:
        """Restoring evidence returns its rows to context and charges their result tokens again."""
        self.result_tokens += int(result_tokens)
        self._check("result_tokens")

    def charge_prompt(self, tokens: int) -> None:
        """Environment-authored tokens entering the transcript (reported in total tokens, not a channel)."""
        self.prompt_tokens += int(tokens)

    def charge_completion(self, tokens: int) -> None:
        """Policy completion tokens (reported in total tokens; their context cost is in `set_context`)."""
        self.completion_tokens += int(tokens)

    def charge_controller(self, tokens: int) -> None:
        """Tokens the controller generated on the policy's behalf (evidence profiles)."""
        self.controller_tokens += int(tokens)

    def record_warning(self) -> None:
        """A policy-visible estimator warning was shown."""
        self.warnings += 1

    def record_rewrite(self) -> None:
        self.rewrites += 1

    def record_invalid_action(self) -> None:
        self.invalid_actions += 1

    # -- views -----------------------------------------------------------------------------------------------------
    @property
    def total_tokens(self) -> int:
        """prompt + completion + result + controller tokens (a reported metric, never subtracted)."""
        return self.prompt_tokens + self.completion_tokens + self.result_tokens + self.controller_tokens

    def spent(self) -> Usage:
        return Usage(self.context_tokens, self.queries, self.result_tokens, self.vm_steps, self.turns)

    def remaining(self) -> Usage:
        """Budget minus spent per channel, floored at 0 (context: headroom below the level cap)."""
        b, s = self.budget, self.spent()
        return Usage(*(max(0, getattr(b, ch) - getattr(s, ch)) for ch in CHANNELS))

    def context_headroom(self, reserve: int = 0) -> int:
        """Tokens that may still enter the live context, keeping ``reserve`` tokens free."""
        return max(0, self.budget.context_tokens - self.context_tokens - reserve)

    def caps(self, *, context_reserve: int = 0, rows: int = 200, bytes: int = 65_536) -> Caps:  # noqa: A002
        """Shield caps from what remains: VM steps = remaining VM steps; result tokens = min(remaining result
        tokens, live-context headroom after ``context_reserve`` tokens of observation framing and completion room)."""
        rem = self.remaining()
        return Caps(
            vm_steps=rem.vm_steps,
            result_tokens=min(rem.result_tokens, self.context_headroom(context_reserve)),
            rows=rows,
            bytes=bytes,
        )

    @property
    def breaches(self) -> tuple[str, ...]:
        return tuple(self._breaches)

    @property
    def feasible(self) -> bool:
        """Every channel respected its level or cumulative budget so far."""
        return not self._breaches

    def snapshot(self) -> LedgerSnapshot:
        return LedgerSnapshot(
            budget=Usage(*(getattr(self.budget, ch) for ch in CHANNELS)),
            spent=self.spent(),
            remaining=self.remaining(),
            peak_context=self.peak_context,
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
            controller_tokens=self.controller_tokens,
            total_tokens=self.total_tokens,
            warnings=self.warnings,
            rewrites=self.rewrites,
            rejections=self.rejections,
            invalid_actions=self.invalid_actions,
            breaches=self.breaches,
        )

    def audit(self) -> None:
        """Raise `BudgetBreach` naming every channel that went above its budget."""
        if self._breaches:
            raise BudgetBreach("budget breached: " + "; ".join(self._breaches))

    def _check(self, channel: str) -> None:
        value, limit = getattr(self, channel), getattr(self.budget, channel)
        if value > limit:
            self._breaches.append(f"{channel} {value} > {limit}")
