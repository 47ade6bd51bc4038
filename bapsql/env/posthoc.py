"""The post-execution (post-hoc) controller of the ``adaptive_posthoc`` condition and its fixed variants (DESIGN §4).

Post-hoc control acts *after* a query ran: it sees the whole result's size — every row the statement produced streams
through a `ResultProfiler` while the shield admits what fits — and the remaining budget, and decides how the result
is rendered into the context:

========== ===========================================================================================================
control    what the policy sees
========== ===========================================================================================================
pass       the admitted rows (the whole result when it fitted)
truncate   the first k admitted rows (k: what the result-token and context allowance admits)
limit      the first min(``posthoc_limit``, k) rows (a fixed LIMIT)
profile    a deterministic profile of the *whole* result: its row count and, per column, NULLs, distinct values,
           min / max / mean and the most frequent values — as many columns as the allowance admits
========== ===========================================================================================================

``adaptive`` (the rule-based controller, the default of the ``adaptive_posthoc`` condition) passes a result that
fitted, profiles one that was cut (when at least the row-count line fits), and truncates one the VM-step cap stopped
(its profile would describe an unknown fraction of the rows) or whose profile does not fit. The fixed modes apply
their control to every result that was cut.

``adaptive`` may instead be decided by a `Controller` given to the environment (``BudgetedSQLEnv(controller=...)``):
it sees the result's `ResultShape` (rows, columns, tokens of the whole result and of its profile, the allowance) and
names a control; `bapsql.rollout.posthoc_engine.EngineController` prompts a model engine with that shape. What it
names is applied as the fixed mode of that name (a profile that does not fit falls back to truncation), and the
tokens it read and wrote are charged as controller tokens.

Accounting: the admitted result tokens are the tokens of what is rendered (rows or profile), never more than the
allowance; the scan is charged in full (post-hoc control cannot refund VM steps or the query); the controller's
own note is charged as controller tokens. `ResultProfiler` keeps bounded memory: exact counts for the first
`DISTINCT_CAP` distinct values of a column, lower bounds after that.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

from bapsql.db.rows import cell_text
from bapsql.env.evidence import ColumnProfile, Profile

DISTINCT_CAP = 4096
TOP_VALUES = 3
CONTROLS: tuple[str, ...] = ("pass", "truncate", "limit", "profile")


@dataclass
class _Column:
    name: str
    nulls: int = 0
    numeric: int = 0
    total: float = 0.0
    lo: object = None
    hi: object = None
    text_lo: str | None = None
    text_hi: str | None = None
    counts: dict = field(default_factory=dict)
    saturated: bool = False

    def add(self, v: object) -> None:
        if v is None:
            self.nulls += 1
            return
        if isinstance(v, (bytes, bytearray, memoryview)):
            v = bytes(v)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            self.numeric += 1
            self.total += v
            self.lo = v if self.lo is None or v < self.lo else self.lo
            self.hi = v if self.hi is None or v > self.hi else self.hi
        else:
            t = cell_text(v)
            self.text_lo = t if self.text_lo is None or t < self.text_lo else self.text_lo
            self.text_hi = t if self.text_hi is None or t > self.text_hi else self.text_hi
        if v in self.counts:
            self.counts[v] += 1
        elif len(self.counts) < DISTINCT_CAP:
            self.counts[v] = 1
        else:
            self.saturated = True

    def profile(self, rows: int) -> ColumnProfile:
        non_null = rows - self.nulls
        all_numeric = non_null > 0 and self.numeric == non_null
        if all_numeric:
            lo, hi, mean = self.lo, self.hi, self.total / self.numeric
        elif non_null:
            lo, hi, mean = self.text_lo, self.text_hi, None
            if self.numeric:  # mixed column: compare by rendering, like `Profile.of`
                texts = [cell_text(x) for x in (self.lo, self.hi, self.text_lo, self.text_hi) if x is not None]
                lo, hi = min(texts), max(texts)
        else:
            lo = hi = mean = None
        ranked = sorted(self.counts.items(), key=lambda kv: (-kv[1], cell_text(kv[0])))
        first = tuple(self.counts)[:3]
        return ColumnProfile(self.name, self.nulls, len(self.counts), lo, hi, first, mean=mean,
                             top=tuple(ranked[:TOP_VALUES]), distinct_at_least=self.saturated)


class ResultProfiler:
    """Streams every row a statement produces into a whole-result `Profile` (bounded memory)."""

    def __init__(self) -> None:
        self.rows = 0
        self._cols: list[_Column] | None = None

    def __call__(self, columns: Sequence[str], row: Sequence) -> None:
        if self._cols is None:
            self._cols = [_Column(str(c)) for c in columns]
        self.rows += 1
        for col, v in zip(self._cols, row):
            col.add(v)

    def profile(self, columns: Sequence[str], *, complete: bool) -> Profile:
        """The profile of everything seen (``complete`` False: the statement was stopped early)."""
        cols = self._cols if self._cols is not None else [_Column(str(c)) for c in columns]
        return Profile(self.rows, not complete, self.rows if complete else None,
                       tuple(c.profile(self.rows) for c in cols), whole_result=True)


@dataclass(frozen=True)
class Decision:
    """How one result is rendered: the control, the rows shown (for row controls), the profile shown (for
    ``profile``) and the controller's note (one line, charged as controller tokens)."""

    control: str
    rows: int
    profile: Profile | None
    note: str


def fit_profile(profile: Profile, allowance: int, count: Callable[[str], int]) -> Profile | None:
    """The profile with as many leading columns as fit in ``allowance`` tokens (None when not even the row-count
    line fits)."""
    best = None
    for n in range(len(profile.columns) + 1):
        candidate = Profile(profile.rows, profile.truncated, profile.rows_total, profile.columns[:n],
                            whole_result=profile.whole_result, columns_total=len(profile.columns))
        if count(candidate.render()) > allowance:
            break
        best = candidate
    return best


def decide(mode: str, *, status: str, truncated_by: str | None, admitted: int, rows_fit: int, limit: int,
           profile: Profile | None, allowance: int, count: Callable[[str], int]) -> Decision:
    """The control for one executed result (see the module docstring).

    ``status`` / ``truncated_by``: the shield's outcome; ``admitted``: rows the shield admitted; ``rows_fit``: of
    those, how many the context can show; ``profile``: the whole-result profile; ``allowance``: result tokens the
    rendering may use (the shield's result-token cap for this execution)."""
    cut = status == "truncated" or rows_fit < admitted
    if mode == "none" or not cut:
        return Decision("pass", rows_fit, None, "")
    stopped = truncated_by == "vm_steps"
    if mode in ("profile", "adaptive") and not stopped and profile is not None:
        fitted = fit_profile(profile, allowance, count)
        if fitted is not None:
            return Decision("profile", 0, fitted,
                            f"[post-hoc control: the result ({profile.rows} rows) was replaced by its profile]")
        if mode == "profile":
            return Decision("truncate", rows_fit, None, "[post-hoc control: the profile does not fit; truncated]")
    if mode == "limit":
        k = min(limit, rows_fit)
        return Decision("limit", k, None, f"[post-hoc control: fixed LIMIT {limit}]")
    return Decision("truncate", rows_fit, None, "[post-hoc control: truncated to the rows that fit]")


@dataclass(frozen=True)
class ResultShape:
    """What a post-hoc controller is told about one executed result (never its rows)."""

    rows_total: int | None  # None: the VM-step cap stopped the statement
    columns: tuple[str, ...]
    rows_admitted: int
    rows_fit: int
    full_result_tokens: int | None
    profile_tokens: int | None  # tokens of the whole-result profile (None: none could be made)
    allowance: int  # result tokens the rendering may use
    truncated_by: str | None


@dataclass(frozen=True)
class ControllerChoice:
    """A controller's decision and what it cost: the control (one of `CONTROLS`) and its prompt / completion
    tokens (charged as controller tokens)."""

    control: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    note: str = ""


class Controller(Protocol):
    """Decides the control of the ``adaptive`` post-hoc condition for one result."""

    def choose(self, shape: ResultShape) -> ControllerChoice: ...


def shape_of(*, rows_total: int | None, columns: Sequence[str], admitted: int, rows_fit: int,
             full_result_tokens: int | None, profile: Profile | None, allowance: int, truncated_by: str | None,
             count: Callable[[str], int]) -> ResultShape:
    """The `ResultShape` a controller sees."""
    return ResultShape(rows_total, tuple(columns), admitted, rows_fit, full_result_tokens,
                       count(profile.render()) if profile is not None else None, allowance, truncated_by)
