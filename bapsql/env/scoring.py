"""Answer correctness and the deterministic evidence score (DESIGN §3 "Scoring", paper: Problem Formulation).

Contract:

- `answers_match(pred, gold)` decides correctness of a typed answer. It never raises; anything malformed is wrong.
- `evidence_score(answer, citations, store)` is a number in [0, 1] computed only from the episode's evidence store
  (no hidden rows, no judge), and cannot be farmed: citing blocks that do not support the answer lowers it
  (citation precision), and corroboration needs a second, `independent` block (different SQL and different rows),
  so re-running or cosmetically rewriting a query adds nothing (`evidence_breakdown` has the exact rule).
- Budgeted success = ``answers_match(...) and feasible`` (the ledger decides feasibility).

Cell normalization (`normalize_cell`), applied to both sides:

- ``None``, and strings that are empty after stripping or spell ``null`` / ``none`` (any case), are NULL. NULL
  matches only NULL.
- booleans are the integers 0 / 1.
- strings: surrounding whitespace stripped, inner whitespace runs collapsed to one space, compared case-insensitively.
  A string that spells a number (``"42"``, ``"-3.50"``, ``"1e3"``, ``"1,234"``) is that number.
- numbers (int or float, NaN/inf are malformed) match when ``|p - g| <= max(abs_tol, rel_tol * max(|p|, |g|))``
  (defaults rel 1e-4, abs 1e-6), or when the prediction is written with d >= 2 decimals and lies within half a unit
  of its last decimal of the gold value (``3.14`` matches ``3.14159``; ``3.1`` does not).
- a number never matches a non-numeric string; bytes, dicts, nested lists deeper than one row are malformed.
- a multi-column row is a tuple of cells compared cell by cell; a one-element tuple is its single cell.

Answer shapes: the gold's kind decides. ``scalar`` gold: the prediction must hold exactly one value (a one-element
list prediction is accepted). ``list`` gold: multiset equality (a maximum bipartite matching under the cell rule
must pair every element). ``ordered_list`` gold: equal length and element-wise match in order. A prediction of
kind ``scalar`` against a one-element list gold is accepted.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Sequence

from bapsql.types import Answer

if TYPE_CHECKING:  # pragma: no cover
    from bapsql.env.evidence import EvidenceBlock, EvidenceStore

REL_TOL = 1e-4
ABS_TOL = 1e-6
_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")
_THOUSANDS = re.compile(r"[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_NULL_WORDS = frozenset({"", "null", "none"})
# Lists longer than this are compared by sorting instead of bipartite matching (exact for strings and NULLs;
# for numbers it pairs sorted values, which is exact whenever tolerances do not overlap neighbours).
_MATCHING_LIMIT = 2_000


@dataclass(frozen=True)
class Num:
    """A normalized number; ``decimals`` is how many decimals the source text showed (None: exponent form)."""

    value: float | int
    decimals: int | None


@dataclass(frozen=True)
class Null:
    """The normalized NULL."""


NULL = Null()
Norm = "Num | str | Null | tuple"


class Malformed(ValueError):
    """Internal: a value that cannot be an answer cell."""


def _decimals(text: str) -> int | None:
    if "e" in text.lower():
        return None
    return len(text.split(".", 1)[1]) if "." in text else 0


def normalize_cell(value: object) -> "Num | str | Null | tuple":
    """Normalize one answer cell (or a row of cells) as the module docstring says; raises `Malformed`."""
    if value is None:
        return NULL
    if isinstance(value, bool):
        return Num(int(value), 0)
    if isinstance(value, int):
        return Num(value, 0)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise Malformed(f"non-finite number {value!r}")
        return Num(value, _decimals(repr(value)))
    if isinstance(value, str):
        text = " ".join(value.split())
        if text.casefold() in _NULL_WORDS:
            return NULL
        if _NUMBER.fullmatch(text) or _THOUSANDS.fullmatch(text):
            plain = text.replace(",", "")
            num: float | int = int(plain) if re.fullmatch(r"[+-]?\d+", plain) else float(plain)
            if isinstance(num, float) and not math.isfinite(num):
                raise Malformed(f"non-finite number {value!r}")
            return Num(num, _decimals(plain))
        return text.casefold()
    if isinstance(value, (tuple, list)):
        if len(value) == 0:
            raise Malformed("an empty row")
        cells = []
        for v in value:
            if isinstance(v, (tuple, list)):
                raise Malformed("rows nested deeper than one level")
            cells.append(normalize_cell(v))
        return cells[0] if len(cells) == 1 else tuple(cells)
    raise Malformed(f"unsupported answer value of type {type(value).__name__}")


def _num_match(p: Num, g: Num, rel_tol: float, abs_tol: float) -> bool:
    if isinstance(p.value, int) and isinstance(g.value, int) and p.value == g.value:
        return True
    pv, gv = float(p.value), float(g.value)
    diff = abs(pv - gv)
    if diff <= max(abs_tol, rel_tol * max(abs(pv), abs(gv))):
        return True
    if p.decimals is not None and p.decimals >= 2:
        half_unit = 0.5 * 10.0 ** (-p.decimals)
        return diff <= half_unit * (1 + 1e-9)
    return False


def cell_match(pred: object, gold: object, *, rel_tol: float = REL_TOL, abs_tol: float = ABS_TOL) -> bool:
    """True when normalized cells (or rows) match; the rounding rule reads the prediction's decimals."""
    if isinstance(pred, tuple) or isinstance(gold, tuple):
        if not (isinstance(pred, tuple) and isinstance(gold, tuple)) or len(pred) != len(gold):
            return False
        return all(cell_match(p, g, rel_tol=rel_tol, abs_tol=abs_tol) for p, g in zip(pred, gold))
    if isinstance(pred, Null) or isinstance(gold, Null):
        return isinstance(pred, Null) and isinstance(gold, Null)
    if isinstance(pred, Num) and isinstance(gold, Num):
        return _num_match(pred, gold, rel_tol, abs_tol)
    if isinstance(pred, str) and isinstance(gold, str):
        return pred == gold
    return False


def _exact_key(x: object) -> object | None:
    """A hashable key for values whose match relation is plain equality (strings, NULL); None for the rest."""
    if isinstance(x, Null):
        return ("null",)
    if isinstance(x, str):
        return ("s", x)
    return None


def _sort_key(x: object) -> tuple:
    if isinstance(x, Null):
        return (0, 0.0, "")
    if isinstance(x, Num):
        return (1, float(x.value), "")
    if isinstance(x, str):
        return (2, 0.0, x)
    return (3, 0.0, repr(x))


def multiset_match(pred: Sequence, gold: Sequence, *, rel_tol: float = REL_TOL, abs_tol: float = ABS_TOL) -> bool:
    """True when normalized ``pred`` and ``gold`` can be paired one-to-one under `cell_match` (order ignored)."""
    if len(pred) != len(gold):
        return False
    # Exact-key values (strings, NULLs) match only their equals: cancel them by counting.
    counts: dict[object, int] = {}
    rest_p, rest_g = [], []
    for g in gold:
        k = _exact_key(g)
        if k is None:
            rest_g.append(g)
        else:
            counts[k] = counts.get(k, 0) + 1
    for p in pred:
        k = _exact_key(p)
        if k is None:
            rest_p.append(p)
        elif counts.get(k, 0) > 0:
            counts[k] -= 1
        else:
            return False
    if any(counts.values()) or len(rest_p) != len(rest_g):
        return False
    if len(rest_g) > _MATCHING_LIMIT:
        return all(
            cell_match(p, g, rel_tol=rel_tol, abs_tol=abs_tol)
            for p, g in zip(sorted(rest_p, key=_sort_key), sorted(rest_g, key=_sort_key))
        )
    # Kuhn's augmenting-path maximum bipartite matching on the remaining (numeric / row) values.
    adj = [[j for j, g in enumerate(rest_g) if cell_match(p, g, rel_tol=rel_tol, abs_tol=abs_tol)] for p in rest_p]
    owner: list[int | None] = [None] * len(rest_g)

    def augment(i: int, seen: list[bool]) -> bool:
        for j in adj[i]:
            if not seen[j]:
                seen[j] = True
                if owner[j] is None or augment(owner[j], seen):
                    owner[j] = i
                    return True
        return False

    return all(augment(i, [False] * len(rest_g)) for i in range(len(rest_p)))


def _normalize_values(values: Iterable) -> list | None:
    try:
        return [normalize_cell(v) for v in values]
    except Malformed:
        return None


def answers_match(
    pred: Answer | None, gold: Answer | None, *, rel_tol: float = REL_TOL, abs_tol: float = ABS_TOL
) -> bool:
    """Correctness of a typed prediction against the typed gold (rules in the module docstring). Never raises."""
    if not isinstance(pred, Answer) or not isinstance(gold, Answer):
        return False
    try:
        p = _normalize_values(pred.values)
        g = _normalize_values(gold.values)
    except Exception:  # noqa: BLE001 - a malformed answer is wrong, whatever it holds
        return False
    if p is None or g is None:
        return False
    if gold.kind == "scalar" or len(g) == 1 and pred.kind == "scalar":
        return len(p) == 1 and len(g) == 1 and cell_match(p[0], g[0], rel_tol=rel_tol, abs_tol=abs_tol)
    if len(p) != len(g):
        return False
    if gold.kind == "ordered_list":
        return all(cell_match(a, b, rel_tol=rel_tol, abs_tol=abs_tol) for a, b in zip(p, g))
    return multiset_match(p, g, rel_tol=rel_tol, abs_tol=abs_tol)


def answer_shape_ok(pred: Answer | None, gold: Answer | None) -> bool:
    """Whether the prediction has the gold's shape (value count for scalars, row arity); False means malformed."""
    if not isinstance(pred, Answer) or not isinstance(gold, Answer):
        return False
    p, g = _normalize_values(pred.values), _normalize_values(gold.values)
    if p is None or g is None:
        return False
    if gold.kind == "scalar" and len(p) != 1:
        return False
    arity = lambda x: len(x) if isinstance(x, tuple) else 1  # noqa: E731
    g_arities = {arity(x) for x in g}
    return not p or not g_arities or all(arity(x) in g_arities for x in p)


# ---------------------------------------------------------------------------------------------------------------
# Gold answers from result rows


def is_ordered_sql(sql: str) -> bool:
    """Whether the query's OUTERMOST select has an ORDER BY (then order is part of the answer). False if unparsable."""
    try:
        import sqlglot
        from sqlglot import exp

        tree = sqlglot.parse_one(sql, read="sqlite")
    except Exception:  # noqa: BLE001 - sqlglot raises several error types; unparsable means unordered
        return False
    return isinstance(tree, exp.Query) and tree.args.get("order") is not None


def answer_from_rows(rows: Sequence[Sequence], *, ordered: bool) -> Answer:
    """The typed answer a result denotes: one row of one column → scalar; else a list (ordered_list if ``ordered``).

    Multi-column rows become tuples; blobs become their ``<blob N bytes>`` text.
    """
    def cell(v: object) -> object:
        return f"<blob {len(v)} bytes>" if isinstance(v, (bytes, bytearray, memoryview)) else v

    values = tuple(cell(r[0]) if len(r) == 1 else tuple(cell(v) for v in r) for r in rows)
    if len(values) == 1 and not isinstance(values[0], tuple):
        return Answer("scalar", values)
    return Answer("ordered_list" if ordered else "list", values)


# ---------------------------------------------------------------------------------------------------------------
# Evidence score


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
