"""The deterministic evidence score (DESIGN §3 "Scoring", paper: Problem Formulation).

It reads an answer's cells through `bapsql.env.scoring`'s normalization (`normalize_cell`) and matching
(`cell_match`); answer correctness itself (`answers_match`) stays there.

Contract:

- `evidence_score(answer, citations, store)` is a number in [0, 1] computed only from the episode's evidence store
  (no hidden rows, no judge), and cannot be farmed: citing blocks that do not support the answer lowers it
  (citation precision), and corroboration needs a second, `independent` block (different SQL and different rows),
  so re-running or cosmetically rewriting a query adds nothing (`evidence_breakdown` has the exact rule).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from bapsql.env.scoring import NULL, Malformed, Num, _normalize_values, cell_match, normalize_cell
from bapsql.types import Answer

if TYPE_CHECKING:  # pragma: no cover
    from bapsql.env.evidence import EvidenceBlock, EvidenceStore


@dataclass(frozen=True)
class EvidenceScore:
    """The parts of the evidence score. ``valid_citations``, ``provenance``: 0 or 0.25; ``support`` and
    ``corroboration``: 0.25 × the share of answer values supported / corroborated (recall, before precision);
    ``precision``: the share of distinct cited results whose block supports some answer value. ``total`` =
    precision × (valid + provenance + support + corroboration), in [0, 1]."""

    valid_citations: float
    provenance: float
    support: float
    corroboration: float
    precision: float = 1.0

    @property
    def total(self) -> float:
        return self.precision * (self.valid_citations + self.provenance + self.support + self.corroboration)


def normalize_sql(sql: str) -> str:
    """SQL text up to layout: whitespace runs collapsed, case folded, trailing semicolons and spaces dropped."""
    return " ".join(str(sql).split()).casefold().rstrip("; ")


def _cell_key(c: object) -> tuple:
    if isinstance(c, Num):
        return ("n", float(c.value))
    if isinstance(c, tuple):
        return ("r",) + tuple(_cell_key(x) for x in c)
    return ("s", c) if isinstance(c, str) else ("null",)


def rows_signature(rows: Sequence[Sequence]) -> tuple:
    """The shown rows as a sorted multiset of normalized cell tuples (order and column names ignored)."""
    return tuple(sorted(tuple(_cell_key(_safe_norm(c)) for c in r) for r in rows))


def result_key(block: "EvidenceBlock") -> tuple[str, tuple]:
    """What makes a block the result it is: (`normalize_sql` of its SQL, `rows_signature` of its shown rows)."""
    return normalize_sql(block.sql), rows_signature(block.rows)


def independent(a: "EvidenceBlock", b: "EvidenceBlock") -> bool:
    """Whether two blocks are independent evidence: different query results, i.e. their SQL differs
    (`normalize_sql`) AND their shown rows differ (`rows_signature`). So the same SQL run twice, a truncation of
    the same query, or a cosmetic rewrite returning the same rows (``SELECT * FROM (q)``, a new alias, another
    ORDER BY) is not independent; an aggregate and the detail rows it summarizes are."""
    return _independent_keys(result_key(a), result_key(b))


def _independent_keys(a: tuple[str, tuple], b: tuple[str, tuple]) -> bool:
    return a[0] != b[0] and a[1] != b[1]


def citation_precision(cited: Sequence[object], supporting: set) -> float:
    """Share of the distinct cited results (`result_key` values, or a stand-in per unknown id) that are in
    ``supporting`` (0 for no citation). Counting results, not ids, keeps a duplicate of a supporting block from
    diluting unsupported citations."""
    keys = set(cited)
    return len(keys & supporting) / len(keys) if keys else 0.0


def _corroborated(support_set: Sequence[str], keys: dict[str, tuple[str, tuple]]) -> bool:
    return any(_independent_keys(keys[a], keys[b]) for i, a in enumerate(support_set) for b in support_set[i + 1:])


def _block_supports(value: object, block: "EvidenceBlock", rows: list[list]) -> bool:
    """A normalized answer value is supported by a visible block (``rows``: its visible rows, normalized) when it
    matches a visible cell (a tuple value: the cells of one visible row, each column used once), or — for a complete
    block — an aggregate of a visible column: the row count, or the SUM / MIN / MAX / AVG of a numeric column."""
    if block.state == "compressed":  # a post-hoc whole-result profile: what it shows is visible
        return not isinstance(value, tuple) and any(cell_match(value, _safe_norm(v)) for v in block.profile.values())
    if isinstance(value, tuple):
        return any(_row_contains(value, r) for r in rows)
    if any(cell_match(value, c) for r in rows for c in r):
        return True
    if block.truncated or not isinstance(value, Num):
        return False
    aggregates: list[float] = [float(len(rows))]
    for j in range(len(block.columns)):
        nums = [float(r[j].value) for r in rows if j < len(r) and isinstance(r[j], Num)]
        if nums:
            aggregates += [sum(nums), min(nums), max(nums), sum(nums) / len(nums)]
    return any(cell_match(value, Num(a, None)) for a in aggregates)


def _visible(block: "EvidenceBlock") -> bool:
    """Rows in context, or the post-hoc controller's whole-result profile in their place (`bapsql.env.posthoc`)."""
    return block.state == "visible" or (block.state == "compressed" and block.profile.whole_result)


def _safe_norm(v: object) -> object:
    try:
        return normalize_cell(v if not isinstance(v, (bytes, bytearray)) else f"<blob {len(v)} bytes>")
    except Malformed:
        return NULL


def _row_contains(value: tuple, row: list) -> bool:
    used: set[int] = set()

    def place(i: int) -> bool:
        if i == len(value):
            return True
        for j, c in enumerate(row):
            if j not in used and cell_match(value[i], c):
                used.add(j)
                if place(i + 1):
                    return True
                used.discard(j)
        return False

    return place(0)


def evidence_breakdown(answer: Answer | None, citations: Sequence[str], store: "EvidenceStore") -> EvidenceScore:
    """The evidence score's parts (see `EvidenceScore`; the total is in [0, 1]).

    - valid citations (0.25): at least one citation, and every cited id exists in the store and is not discarded.
    - provenance (0.25): at least one citation, and every cited block exists and came from a successful execution
      (shield status ``ok`` or ``truncated``).
    - support (recall): 0.25 × the share of the answer's values supported (see `_block_supports`) by some cited
      block that is currently visible (rows in context, or a post-hoc whole-result profile: its row count, min, max,
      mean and top values). An empty answer is supported by a cited visible complete block with no rows.
    - corroboration: 0.25 × the share of values supported by two cited visible blocks that are `independent`
      (different SQL and different rows). One block, however complete, does not corroborate itself, and an empty
      answer cannot be corroborated (two empty results are the same result).
    - precision: the share of distinct cited results (`result_key`; an unknown id counts as one) that support at
      least one value through a cited visible block. It scales the whole score, so citing blocks that do not
      support the answer lowers e, and citations that support nothing score 0.
    Properties (tested): adding a citation to a block that supports nothing never raises e; adding and citing a
    duplicate of a block (same SQL, same rows) never changes it. A missing or malformed answer scores 0
    (nothing supports it: precision 0); the parts still show citation validity and provenance.
    """
    refs = list(dict.fromkeys(str(c).strip().upper() for c in citations))
    blocks = [store.get(r) for r in refs]
    existing = [b for b in blocks if b is not None]
    valid = 0.25 if refs and len(existing) == len(refs) and all(b.state != "discarded" for b in existing) else 0.0
    ran_ok = all(b.status in ("ok", "truncated") for b in existing)
    prov = 0.25 if refs and len(existing) == len(refs) and ran_ok else 0.0
    visible = list({b.ref: b for b in existing if _visible(b)}.values())
    values = _normalize_values(answer.values) if isinstance(answer, Answer) else None
    if values is None or not visible:
        return EvidenceScore(valid, prov, 0.0, 0.0, 0.0)
    keys = {b.ref: result_key(b) for b in existing}
    cited = [keys[b.ref] if b is not None else ("missing", r) for r, b in zip(refs, blocks)]
    if not values:
        empty = {keys[b.ref] for b in visible if b.state == "visible" and not b.truncated and not b.visible_rows}
        return EvidenceScore(valid, prov, 0.25 if empty else 0.0, 0.0, citation_precision(cited, empty))
    norm = {b.ref: [[_safe_norm(c) for c in r] for r in b.visible_rows] for b in visible}
    support_sets = [[b.ref for b in visible if _block_supports(v, b, norm[b.ref])] for v in values]
    supporting = {keys[r] for s in support_sets for r in s}
    support = 0.25 * sum(1 for s in support_sets if s) / len(values)
    corroboration = 0.25 * sum(1 for s in support_sets if _corroborated(s, keys)) / len(values)
    return EvidenceScore(valid, prov, support, corroboration, citation_precision(cited, supporting))


def evidence_score(answer: Answer | None, citations: Sequence[str], store: "EvidenceStore") -> float:
    """The deterministic evidence score e in [0, 1] (sum of `evidence_breakdown`)."""
    return evidence_breakdown(answer, citations, store).total
