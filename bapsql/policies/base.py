"""The `Policy` protocol and the machinery scripted policies share.

Contract (every policy — scripted workflows, the scripted drafter, model-backed policies)::

    policy.reset(task, budget, seed, options)     # task = oracle.policy_view(full task): no gold, no gold SQL
    text = policy.act(observation, info)          # the completion: exactly what a model would emit (a tool call)

A policy does not choose its interface: the condition it runs under belongs to the environment
(`bapsql.env.conditions`). ``options`` is a `PolicyOptions`: that `Condition` (so a scripted policy never calls a
tool that is not offered) and, for scripted policies only (``needs_oracle``), the task's `OracleHint`. Scripted
policies decide from the structured ``info`` the env returns (estimates, shield results, post-hoc profiles, ledger)
and never read the gold answer (they cannot: the task they get has none). When the condition hides the dashboard,
`Feedback.remaining` is None: a budget-blind policy gets no ledger numbers.

`ScriptedPolicy` runs a *script*: a generator that yields actions and receives a `Feedback` for each, so a workflow
reads as straight-line code (``fb = yield ExecuteQuery(sql)``). When a script ends without a terminal action, the
policy abstains (or, where abstention is not offered, answers from the last visible rows).
"""

from __future__ import annotations

import dataclasses
import re
import zlib
from dataclasses import dataclass
from typing import Any, Generator, Protocol, runtime_checkable

import numpy as np

from bapsql.budgets import Budget
from bapsql.env.actions import Abstain, Action, AnswerAction, render_action
from bapsql.env.conditions import Condition
from bapsql.errors import ConfigError
from bapsql.policies.oracle import OracleHint
from bapsql.types import Task

@dataclass(frozen=True)
class PolicyOptions:
    """What a policy is told at reset: the condition it runs under (the env's), and the oracle hint when it is a
    scripted policy."""

    condition: Condition = Condition()
    oracle: OracleHint | None = None


@runtime_checkable
class Policy(Protocol):
    """Anything that turns observations into completions (see the module docstring)."""

    name: str
    needs_oracle: bool

    def reset(self, task: Task, budget: Budget, seed: int, options: PolicyOptions) -> None: ...

    def act(self, observation: str, info: dict) -> str: ...


# ------------------------------------------------------------------------------------------------- feedback views
@dataclass(frozen=True)
class EstimateSeen:
    """The policy-visible estimate of one estimate/rewrite turn."""

    rows_p50: float
    rows_p95: float
    tokens_p50: float
    tokens_p95: float
    steps_p50: float
    steps_p95: float
    error: str | None


@dataclass(frozen=True)
class ResultSeen:
    """One execution as the policy saw it: the shown rows only (rows cut to fit the context are not here)."""

    ref: str | None  # evidence id, None when the execution produced no block (rejected / error)
    sql: str
    status: str  # ok | truncated | rejected | error
    columns: tuple[str, ...]
    rows: tuple[tuple, ...]
    message: str
    truncated_by: str | None = None  # rows | bytes | result_tokens | vm_steps | context (cut to fit) | None
    profile: dict | None = None  # the whole-result profile a post-hoc controller showed instead of the rows
    rows_total: int | None = None  # the result's row count as shown: a cut listing's "k of N rows shown", else None

    @property
    def complete(self) -> bool:
        return self.status == "ok" and self.ref is not None


_HEADER = re.compile(r"^(E\d+) \((\w+)\): (\d+) rows x (\d+) columns", re.MULTILINE)
_CUT_NOTE = re.compile(r"^\[truncated by the \w+ cap: (\d+) of (\d+) rows shown\]", re.MULTILINE)  # render.py


@dataclass(frozen=True)
class Feedback:
    """What the last step returned, as a scripted policy may use it."""

    observation: str
    action: str
    status: str | None
    warning: bool
    estimate: EstimateSeen | None
    result: ResultSeen | None
    remaining: dict[str, int] | None  # None when the dashboard is hidden
    done: bool

    @classmethod
    def from_step(cls, observation: str, info: dict, *, show_dashboard: bool) -> "Feedback":
        est = info.get("estimate")
        seen_est = None
        if est is not None:
            seen_est = EstimateSeen(est["rows"]["p50"], est["rows"]["p95"], est["result_tokens"]["p50"],
                                    est["result_tokens"]["p95"], est["vm_steps"]["p50"], est["vm_steps"]["p95"],
                                    est.get("error"))
        result = None
        if info.get("action") == "execute_query":
            sh = info.get("shield") or {}
            ref = info.get("evidence_ref")
            rows: tuple[tuple, ...] = ()
            status = info.get("status") or sh.get("status") or "rejected"
            cut_by = sh.get("truncated_by")
            profile = info.get("profile")
            total = None
            if ref is not None and profile is None:
                admitted = sh.get("rows") or ()
                shown = len(admitted)
                m = _HEADER.search(observation)
                if m and m.group(1) == ref:
                    shown, status = int(m.group(3)), m.group(2)
                if shown < len(admitted) and cut_by is None:
                    cut_by = "context"
                rows = tuple(tuple(r) for r in admitted[:shown])
                note = _CUT_NOTE.search(observation)
                total = int(note.group(2)) if note else None
            result = ResultSeen(ref, info.get("sql") or "", status, tuple(sh.get("columns") or ()), rows,
                                info.get("message") or "", cut_by, profile, total)
        led = info.get("ledger")
        remaining = dict(led["remaining"]) if (show_dashboard and led) else None
        return cls(observation, info.get("action", ""), info.get("status"), bool(info.get("warning")), seen_est,
                   result, remaining, bool(info.get("terminated") or info.get("truncated")))


def shown_value(value: Any) -> Any:
    """A cell as the policy saw it in the rendered table (`bapsql.db.rows.cell_text`): numbers at the precision
    shown (typed back to int / float), strings as the text they denote (the table's escapes undone), NULL as None.
    Answers are built from these, never from hidden precision."""
    from bapsql.db.rows import cell_text

    if value is None or isinstance(value, str):
        return value
    text = cell_text(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return text
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            return text


def answer_from_result(result: ResultSeen, kind: str) -> AnswerAction:
    """The typed answer a result's shown rows denote, citing its evidence id (scalar: the first cell)."""
    rows = [tuple(shown_value(v) for v in r) for r in result.rows]
    cites = (result.ref,) if result.ref else ()
    if kind == "scalar":
        value = rows[0][0] if rows and rows[0] else None
        return AnswerAction("scalar", (value,), cites)
    values = tuple(r[0] if len(r) == 1 else r for r in rows)
    return AnswerAction(kind, values, cites)


# ------------------------------------------------------------------------------------------------ scripted policies
def episode_rng(seed: int, task_id: str, salt: str = "") -> np.random.Generator:
    """A generator fixed by (seed, task, salt): the same choices whatever order episodes run in."""
    return np.random.default_rng([int(seed) & 0xFFFFFFFF, zlib.crc32(f"{task_id}|{salt}".encode())])


@dataclass
class Context:
    """Per-episode state a script reads: the task view, budget, hint, condition, rng and what it has seen."""

    task: Task
    budget: Budget
    seed: int
    hint: OracleHint
    condition: Condition
    rng: np.random.Generator
    last: Feedback | None = None
    results: list[ResultSeen] = dataclasses.field(default_factory=list)
    turn: int = 0  # the turn being decided (1-based; set by `ScriptedPolicy.act`)
    # turns the script plays only to set up a situation (a deliberately wrong query): SFT keeps them out of the loss
    staged: set[int] = dataclasses.field(default_factory=set)
    estimated: set[str] = dataclasses.field(default_factory=set)  # SQL texts the script has estimated or rewritten to

    def can(self, tool: str) -> bool:
        return self.condition.offers(tool)

    @property
    def remaining(self) -> dict[str, int] | None:
        return self.last.remaining if self.last is not None else None

    def best_result(self) -> ResultSeen | None:
        """The most recent execution that produced shown rows."""
        return next((r for r in reversed(self.results) if r.ref is not None), None)


Script = Generator[Action, Feedback, None]


class ScriptedPolicy:
    """Base of programmatic policies: subclasses set ``name`` and implement `script`."""

    name = "scripted"
    needs_oracle = True
    has_branch = False  # whether it has a budget-aware branch (`took_branch`); ``sft.branch_tries`` holds its slot

    def took_branch(self, summary: Any) -> bool:
        """Whether an episode (its `EpisodeSummary`) took the budget-aware branch this workflow exists to show
        (``sft.branch_tries``): a rewrite after a warning, an abstention. Workflows without one: never."""
        return False

    def script(self, ctx: Context) -> Script:  # pragma: no cover - abstract
        raise NotImplementedError
        yield

    def reset(self, task: Task, budget: Budget, seed: int, options: PolicyOptions) -> None:
        if options.oracle is None:
            raise ConfigError(f"{self.name} is a scripted policy and needs the oracle hint in its options")
        self.ctx = Context(task, budget, seed, options.oracle, options.condition, episode_rng(seed, task.task_id))
        self._gen = self.script(self.ctx)
        self._started = False

    def act(self, observation: str, info: dict) -> str:
        ctx = self.ctx
        ctx.turn += 1
        fb = Feedback.from_step(observation, info, show_dashboard=ctx.condition.show_dashboard)
        ctx.last = fb
        if fb.result is not None:
            ctx.results.append(fb.result)
        try:
            action = next(self._gen) if not self._started else self._gen.send(fb)
        except StopIteration:
            action = self.fallback(ctx)
        self._started = True
        return render_action(action)

    @property
    def staged_turns(self) -> frozenset[int]:
        """Turns (1-based) of the current episode the script played only to set up a situation; not to imitate."""
        return frozenset(self.ctx.staged) if hasattr(self, "ctx") else frozenset()

    def fallback(self, ctx: Context) -> Action:
        """What to do once the script has nothing left: abstain, or answer from the last shown rows."""
        best = ctx.best_result()
        if best is not None:
            return answer_from_result(best, ctx.hint.answer_kind)
        if ctx.can("abstain"):
            return Abstain("no evidence could be obtained within the budget")
        return answer_from_result(ResultSeen(None, "", "rejected", (), (), ""), ctx.hint.answer_kind)
