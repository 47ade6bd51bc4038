"""Answer correctness and gold answers from result rows (DESIGN §3 "Scoring", paper: Problem Formulation).

The deterministic evidence score (`evidence_score`, `evidence_breakdown`, `EvidenceScore`, `independent`,
`result_key`, `citation_precision`, ...) lives in `bapsql.env.evidence_score`; it builds on this module's cell
normalization and matching.

Contract:

- `answers_match(pred, gold)` decides correctness of a typed answer. It never raises; anything malformed is wrong.
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
from typing import Iterable, Sequence

from bapsql.types import Answer

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
