"""The episode's evidence store (DESIGN §3 "Evidence store"; paper: Recoverable evidence).

Every successful execution becomes an `EvidenceBlock` with a reference id (``E1``, ``E2``, ...): its SQL provenance,
output columns, the rows the policy was actually shown, a truncation flag, the shield status, the result tokens it
was charged, and a deterministic `Profile`. A block is in one of four states:

- ``visible``: its rows are in the live context;
- ``archived``: the rows left the context, a one-line stub remains; ``restore`` brings them back;
- ``compressed``: the rows are replaced by the profile text; ``restore`` brings them back;
- ``discarded``: unavailable for good (restore refused, citations to it are invalid).

Transitions (anything else is refused with a reason, never an exception): archive: visible|compressed → archived;
compress: visible|archived → compressed; discard: any live state → discarded; restore: archived|compressed →
visible. The store does not charge budgets: the episode checks and charges the ledger (restore costs the block's
result tokens again). Support for answers is computed only from rows of ``visible`` blocks (`visible_rows`).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Literal, Sequence

from bapsql.db.rows import cell_text

BlockState = Literal["visible", "archived", "compressed", "discarded"]
EvidenceOpName = Literal["archive", "compress", "discard", "restore"]
EVIDENCE_OPS: tuple[str, ...] = ("archive", "compress", "discard", "restore")
_REF = re.compile(r"E[1-9]\d*")
_TRANSITIONS: dict[str, tuple[tuple[str, ...], str]] = {
    "archive": (("visible", "compressed"), "archived"),
    "compress": (("visible", "archived"), "compressed"),
    "discard": (("visible", "archived", "compressed"), "discarded"),
    "restore": (("archived", "compressed"), "visible"),
}
FIRST_VALUES = 3
MEAN_DECIMALS = 4  # a profile shows a column's mean rounded to this many decimals (and nothing finer)


@dataclass(frozen=True)
class ColumnProfile:
    """Summary of one column over the block's rows: NULL count, distinct non-NULL values, min/max of the non-NULL
    values (numbers compare numerically, text by its rendering) and the first distinct values in row order."""

    name: str
    nulls: int
    distinct: int
    min: object
    max: object
    first: tuple
    mean: float | None = None  # whole-result profiles (`bapsql.env.posthoc`) only
    top: tuple = ()  # (value, count) of the most frequent values; whole-result profiles only
    distinct_at_least: bool = False  # the distinct count is a lower bound (too many values to track)

    def values(self) -> tuple:
        """Every value this column's profile shows (what an answer may be supported by)."""
        out = [v for v in (self.min, self.max) if v is not None]
        if self.mean is not None:
            out += [self.mean, round(self.mean, 2)]
        if self.top and self.top[0][1] > 1:  # as `Profile.render` shows them
            return tuple(out) + tuple(v for v, _ in self.top)
        return tuple(out) + tuple(self.first)


@dataclass(frozen=True)
class Profile:
    """A deterministic summary of a block's rows (what ``compress`` leaves in context)."""

    rows: int
    truncated: bool
    rows_total: int | None
    columns: tuple[ColumnProfile, ...]
    whole_result: bool = False  # made by the post-hoc controller over every row the query produced
    columns_total: int | None = None  # columns of the result when only the leading ones are profiled

    @classmethod
    def of(cls, columns: Sequence[str], rows: Sequence[Sequence], *, truncated: bool,
           rows_total: int | None) -> "Profile":
        cols = []
        for j, name in enumerate(columns):
            vals = [r[j] for r in rows if j < len(r)]
            non_null = [v for v in vals if v is not None]
            distinct = list(dict.fromkeys(_hashable(v) for v in non_null))
            nums = [v for v in non_null if isinstance(v, (int, float)) and not isinstance(v, bool)]
            if non_null and len(nums) == len(non_null):
                lo, hi = min(nums), max(nums)
            elif non_null:
                texts = sorted(cell_text(v) for v in non_null)
                lo, hi = texts[0], texts[-1]
            else:
                lo = hi = None
            cols.append(ColumnProfile(str(name), len(vals) - len(non_null), len(distinct), lo, hi,
                                      tuple(distinct[:FIRST_VALUES])))
        return cls(len(rows), truncated, rows_total, tuple(cols))

    def render(self) -> str:
        """Compact one-line-per-column text, e.g. ``57 rows; name: 57 distinct, first Ann, Bo, Cy``."""
        if self.whole_result:
            head = f"profile of {'the first ' if self.truncated else ''}{self.rows} rows" + (
                " (stopped early)" if self.truncated else "")
        else:
            total = f" of {self.rows_total}" if self.truncated and self.rows_total is not None else ""
            head = f"{self.rows}{total} rows{' (truncated)' if self.truncated else ''}"
        lines = [head]
        for c in self.columns:
            parts = [f"{c.distinct}{'+' if c.distinct_at_least else ''} distinct"]
            if c.nulls:
                parts.append(f"{c.nulls} null")
            if c.min is not None:
                parts.append(f"min {cell_text(c.min)} max {cell_text(c.max)}")
            if c.mean is not None:
                parts.append(f"mean {cell_text(round(c.mean, MEAN_DECIMALS))}")
            if c.top and c.top[0][1] > 1:  # most frequent values (none when every value occurs once)
                parts.append("top " + ", ".join(f"{cell_text(v)} ({n})" for v, n in c.top))
            elif c.first:
                parts.append("first " + ", ".join(cell_text(v) for v in c.first))
            lines.append(f"{c.name}: " + "; ".join(parts))
        if self.columns_total is not None and self.columns_total > len(self.columns):
            lines.append(f"[{self.columns_total - len(self.columns)} more columns not profiled]")
        return "\n".join(lines)

    def values(self) -> tuple:
        """Every value the profile shows: the row count (of a complete profile) and each column's values."""
        head = (self.rows_total,) if self.rows_total is not None else ()
        return head + tuple(v for c in self.columns for v in c.values())


def _hashable(v: object) -> object:
    return bytes(v) if isinstance(v, (bytearray, memoryview)) else v


@dataclass(frozen=True)
class EvidenceBlock:
    """One executed result as the policy saw it. ``rows`` are the shown rows (never hidden ones)."""

    ref: str
    sql: str
    columns: tuple[str, ...]
    rows: tuple[tuple, ...]
    truncated: bool
    truncated_by: str | None
    rows_total: int | None
    status: str  # shield status of the execution: ok | truncated
    result_tokens: int  # charged when the rows were admitted; restore charges it again
    profile: Profile
    state: BlockState
    turn: int

    @property
    def visible_rows(self) -> tuple[tuple, ...]:
        """The rows currently in context: all shown rows when visible, none otherwise."""
        return self.rows if self.state == "visible" else ()


@dataclass(frozen=True)
class EvidenceOp:
    """Outcome of one evidence-management request. ``ok`` False means refused (``message`` says why)."""

    op: str
    ref: str
    ok: bool
    before: BlockState | None
    after: BlockState | None
    message: str


def normalize_ref(ref: object) -> str | None:
    """``"e3"`` / ``" E3 "`` → ``"E3"``; anything that is not ``E<positive int>`` → None."""
    if not isinstance(ref, str):
        return None
    r = ref.strip().upper()
    return r if _REF.fullmatch(r) else None


class EvidenceStore:
    """The blocks of one episode, in creation order; ids are ``E1``, ``E2``, ... and never reused."""

    def __init__(self) -> None:
        self._blocks: dict[str, EvidenceBlock] = {}

    def __len__(self) -> int:
        return len(self._blocks)

    @property
    def blocks(self) -> tuple[EvidenceBlock, ...]:
        return tuple(self._blocks.values())

    def get(self, ref: str) -> EvidenceBlock | None:
        r = normalize_ref(ref)
        return self._blocks.get(r) if r else None

    def add(
        self,
        *,
        sql: str,
        columns: Sequence[str],
        rows: Sequence[Sequence],
        status: str,
        truncated: bool,
        truncated_by: str | None,
        rows_total: int | None,
        result_tokens: int,
        turn: int,
        state: BlockState = "visible",
        profile: Profile | None = None,
    ) -> EvidenceBlock:
        """Store a new block (visible, or compressed to ``profile`` by the post-hoc controller) and return it."""
        ref = f"E{len(self._blocks) + 1}"
        rows_t = tuple(tuple(r) for r in rows)
        block = EvidenceBlock(
            ref=ref, sql=sql, columns=tuple(columns), rows=rows_t, truncated=truncated, truncated_by=truncated_by,
            rows_total=rows_total, status=status, result_tokens=result_tokens,
            profile=profile or Profile.of(columns, rows_t, truncated=truncated, rows_total=rows_total),
            state=state, turn=turn,
        )
        self._blocks[ref] = block
        return block

    def check(self, op: str, ref: str) -> EvidenceOp:
        """What `apply` would do, without changing anything (``ok`` False with the reason when refused)."""
        r = normalize_ref(ref)
        if op not in _TRANSITIONS:
            why = f"unknown operation {op!r}; use one of {list(EVIDENCE_OPS)}"
            return EvidenceOp(op, str(ref), False, None, None, why)
        block = self._blocks.get(r) if r else None
        if block is None:
            known = ", ".join(self._blocks) or "none yet"
            return EvidenceOp(op, str(ref), False, None, None, f"no evidence block {ref!r} (blocks: {known})")
        sources, target = _TRANSITIONS[op]
        if block.state not in sources:
            why = "it is discarded for good" if block.state == "discarded" else f"it is already {block.state}"
            return EvidenceOp(op, block.ref, False, block.state, block.state, f"cannot {op} {block.ref}: {why}")
        return EvidenceOp(op, block.ref, True, block.state, target, f"{block.ref} {block.state} → {target}")

    def apply(self, op: str, ref: str) -> EvidenceOp:
        """Perform one transition (see the module docstring); refusals change nothing."""
        res = self.check(op, ref)
        if res.ok:
            self._blocks[res.ref] = dataclasses.replace(self._blocks[res.ref], state=res.after)
        return res
