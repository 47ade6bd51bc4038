"""Typed records of an episode: environment options, step results, per-turn records and the episode summary.

`TurnRecord` and `EpisodeSummary` carry every field of the trajectory log tables (`bapsql.logs.schema`) that the
environment can know; `to_row()` gives the columns by their schema names (the runner adds run, method, seed, ...).
"""

from __future__ import annotations

import dataclasses
import operator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from bapsql.env.conditions import Condition
from bapsql.env.conditions import condition as condition_named
from bapsql.errors import ConfigError
from bapsql.logs.text import cap_text

if TYPE_CHECKING:  # pragma: no cover
    from bapsql.env.ledger import LedgerSnapshot


PROMPT_STYLES: tuple[str, ...] = ("full", "terse")


@dataclass(frozen=True)
class EnvOptions:
    """Knobs of the environment (strict: build from YAML with `bapsql.config.from_mapping`).

    ``condition``: the experimental condition (`bapsql.env.conditions`: dashboard, offered tools, estimate view,
    preflight wording, rewriter, post-hoc controller); every policy runs under one. ``completion_reserve``: context
    tokens every observation leaves free for the next completion (observations are cut to keep it; when even a
    minimal observation cannot, the episode truncates). ``row_cap`` / ``byte_cap``: the shield's visible-output caps
    per execution. ``gold_vm_step_cap``: VM-step cap for computing a task's gold answer (and the official EX of the
    final SQL) when the task carries none (never charged). ``posthoc_limit``: the rows a ``limit`` post-hoc control
    shows (a fixed LIMIT).
    ``busy_timeout_s``: how long a database action waits for another program's write lock before the turn becomes
    a 'database busy' rejection; ``request_wall_s``: the wall time one episode (e.g. a served request) may spend,
    which cuts every such wait to what is left of it (None: no limit). See `bapsql.env.live`.
    ``prompt_style``: ``full`` (the instructions and a description of every offered tool) or ``terse`` (one line of
    instructions, one signature line per offered tool; `bapsql.env.render.system_prompt`). SFT export, rollouts and
    evaluation of one policy must use the same style.
    """

    condition: Condition = Condition()
    completion_reserve: int = 64
    row_cap: int = 200
    byte_cap: int = 65_536
    gold_vm_step_cap: int = 200_000_000
    posthoc_limit: int = 20
    busy_timeout_s: float = 3.0
    request_wall_s: float | None = None
    prompt_style: str = "full"

    def __post_init__(self) -> None:
        if self.prompt_style not in PROMPT_STYLES:
            raise ConfigError(f"env.prompt_style: must be one of {list(PROMPT_STYLES)}, got {self.prompt_style!r}")
        for name in ("completion_reserve", "row_cap", "byte_cap", "gold_vm_step_cap", "posthoc_limit"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ConfigError(f"env.{name}: must be a non-negative integer, got {v!r}")
        for name in ("busy_timeout_s", "request_wall_s"):
            v = getattr(self, name)
            if (v is not None or name == "busy_timeout_s") and (
                    isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0):
                raise ConfigError(f"env.{name}: must be a non-negative number of seconds, got {v!r}")

    @property
    def show_dashboard(self) -> bool:
        return self.condition.show_dashboard

    @property
    def allowed_actions(self) -> tuple[str, ...]:
        return self.condition.actions

    def under(self, cond: "str | Condition") -> "EnvOptions":
        """These options under another condition (a preset name or a `Condition`)."""
        return dataclasses.replace(self, condition=condition_named(cond))


@dataclass(frozen=True)
class StepResult:
    """Gymnasium-style result of one `BudgetedSQLEnv.step`."""

    observation: str
    reward: float
    terminated: bool
    truncated: bool
    info: dict


@dataclass(frozen=True)
class TurnRecord:
    """One turn, with the columns of the turns log table.

    Estimates are those of the turn's SQL: the policy-visible one for estimate/rewrite turns, the shield's internal
    one (never shown) for execute turns. Actuals are set for executions that ran: ``actual_rows`` = rows the query
    produced (None when the VM cap stopped it), ``actual_result_tokens`` = what the whole result would have cost,
    ``actual_vm_steps`` = measured steps. ``prompt_tokens`` are the environment-authored tokens charged during the
    turn (its observation), so turns plus the initial prompt sum to the episode's prompt tokens; ``ctx_before`` is
    the live prompt the policy saw, ``ctx_after`` the context level after the turn (the next prompt, or the transcript
    with the final completion when the episode ended). ``completion`` is the completion text as `step` received it
    and ``observation`` the observation it returned, each capped at `bapsql.logs.text.TEXT_CAP_CHARS` characters
    (None for a record made without them); the trajectory writer keeps or drops them per the run's ``log_text``.
    """

    turn: int
    action: str
    valid: bool
    sql: str | None
    status: str | None
    warning: bool
    est_rows_p50: float | None
    est_rows_p95: float | None
    est_result_tokens_p50: float | None
    est_result_tokens_p95: float | None
    est_vm_steps_p50: float | None
    est_vm_steps_p95: float | None
    actual_rows: int | None
    actual_result_tokens: int | None
    actual_vm_steps: int | None
    ctx_before: int
    ctx_after: int
    queries_before: int
    queries_after: int
    result_tokens_before: int
    result_tokens_after: int
    vm_steps_before: int
    vm_steps_after: int
    prompt_tokens: int
    completion_tokens: int
    message: str = ""
    db_wait_s: float = 0.0  # seconds this turn waited for another program's lock on the database
    completion: str | None = None  # the policy's completion for the turn (capped)
    observation: str | None = None  # the observation the env returned for the turn (capped)

    def to_row(self) -> dict:
        """The turns-table columns this record fills (without ``message``): a shallow read, per turn logged."""
        return dict(zip(_TURN_COLUMNS, _read_turn_columns(self)))


@dataclass(frozen=True)
class EpisodeSummary:
    """Everything the episodes log table needs that the environment knows. ``answer`` / ``gold`` are JSON text."""

    task_id: str
    db_id: str
    budget: str
    answer: str | None
    gold: str | None
    correct: bool
    feasible: bool
    success: bool
    reward: float
    evidence_score: float
    queries: int
    result_tokens: int
    vm_steps: int
    turns: int
    prompt_tokens: int
    completion_tokens: int
    controller_tokens: int
    total_tokens: int
    peak_context: int
    warnings: int
    rewrites: int
    rejections: int
    invalid_actions: int
    abstained: bool
    terminated: bool
    truncated: bool
    breach: bool
    failure: str
    wall_s: float
    official_ex: bool | None = None  # BIRD's unbudgeted EX of the final SQL (False when none ran; None: no gold)
    citations: tuple[str, ...] = field(default_factory=tuple)
    breaches: tuple[str, ...] = field(default_factory=tuple)

    def to_row(self) -> dict:
        """The episodes-table columns this summary fills (all but controller_tokens, citations and breaches)."""
        return dict(zip(_EPISODE_COLUMNS, _read_episode_columns(self)))


_TURN_COLUMNS = tuple(f.name for f in dataclasses.fields(TurnRecord) if f.name != "message")
_EPISODE_COLUMNS = tuple(f.name for f in dataclasses.fields(EpisodeSummary)
                         if f.name not in ("controller_tokens", "citations", "breaches"))
_read_turn_columns = operator.attrgetter(*_TURN_COLUMNS)
_read_episode_columns = operator.attrgetter(*_EPISODE_COLUMNS)


@dataclass
class TurnDraft:
    """What one action produced, filled in by the environment's handlers; becomes ``info`` and a `TurnRecord`.

    ``estimate`` is the policy-visible estimate (estimate / rewrite turns); ``internal_estimate`` the shield's own
    estimate of an execution (never shown); ``shield`` the `ShieldResult`; ``ref`` the evidence block created or
    managed; ``rewritten`` whether earlier messages changed (evidence management).
    """

    action: str
    valid: bool = True
    sql: str | None = None
    status: str | None = None
    message: str = ""
    estimate: object = None
    internal_estimate: object = None
    shield: object = None
    warning: bool = False
    ref: str | None = None
    rewritten: bool = False
    posthoc: str | None = None  # the post-hoc control applied to an executed result (pass/truncate/limit/profile)
    profile: object = None  # the whole-result profile the controller showed instead of rows
    db_wait_s: float = 0.0  # lock waits outside the shield (joining the episode's snapshot)

    def info(self, snap: "LedgerSnapshot", *, max_completion_tokens: int, terminated: bool, truncated: bool) -> dict:
        """The step's ``info`` dict (estimate and shield results as plain dicts)."""
        return {
            "turn": snap.spent.turns, "action": self.action, "valid": self.valid, "status": self.status,
            "message": self.message, "sql": self.sql,
            "ledger": {"spent": snap.spent.as_dict(), "remaining": snap.remaining.as_dict(),
                       "budget": snap.budget.as_dict(), "total_tokens": snap.total_tokens},
            "estimate": dataclasses.asdict(self.estimate) if self.estimate is not None else None,
            "shield": dataclasses.asdict(self.shield) if self.shield is not None else None,
            "warning": self.warning, "evidence_ref": self.ref, "context_rewritten": self.rewritten,
            "posthoc": self.posthoc,
            "probe_vm_steps": getattr(self.internal_estimate, "probe_vm_steps", 0),
            "profile": dataclasses.asdict(self.profile) if self.profile is not None else None,
            "max_completion_tokens": max_completion_tokens, "terminated": terminated, "truncated": truncated,
        }

    def record(self, before: "LedgerSnapshot", after: "LedgerSnapshot", *, ctx_before: int, ctx_after: int,
               prompt_tokens: int, completion_tokens: int, completion: str | None = None,
               observation: str | None = None) -> TurnRecord:
        """The turn's log record (see `TurnRecord` for what each field means; the texts are capped here)."""
        est = self.estimate if self.estimate is not None else self.internal_estimate

        def q(name: str, p: str) -> float | None:
            return getattr(getattr(est, name), p) if est is not None and not est.error else None

        res = self.shield
        ran = res is not None and res.status in ("ok", "truncated", "error") and res.cost.vm_steps > 0
        return TurnRecord(
            turn=after.spent.turns, action=self.action, valid=self.valid, sql=self.sql, status=self.status,
            warning=self.warning, est_rows_p50=q("rows", "p50"), est_rows_p95=q("rows", "p95"),
            est_result_tokens_p50=q("result_tokens", "p50"), est_result_tokens_p95=q("result_tokens", "p95"),
            est_vm_steps_p50=q("vm_steps", "p50"), est_vm_steps_p95=q("vm_steps", "p95"),
            actual_rows=res.rows_total if ran else None,
            actual_result_tokens=res.full_result_tokens if ran else None,
            actual_vm_steps=res.cost.vm_steps if ran else None,
            ctx_before=ctx_before, ctx_after=ctx_after,
            queries_before=before.spent.queries, queries_after=after.spent.queries,
            result_tokens_before=before.spent.result_tokens, result_tokens_after=after.spent.result_tokens,
            vm_steps_before=before.spent.vm_steps, vm_steps_after=after.spent.vm_steps,
            prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, message=self.message,
            db_wait_s=round(self.db_wait_s + (getattr(res, "wait_s", 0.0) if res is not None else 0.0), 6),
            completion=cap_text(completion), observation=cap_text(observation),
        )
