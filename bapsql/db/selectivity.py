"""Statistical primitives of the row estimator: a column as the estimator sees it (`ColRef`) and the selectivity of
one predicate on it, from catalog statistics.

- ``col = v``: the value's frequency when it is a stored top value, else the remaining rows spread over the
  remaining distinct values (0 when the column's values are all known and v is not among them, exact catalogs
  only; a sampled catalog says "too rare to be sampled": half a sample row); ``LOWER(TRIM(col)) = v`` and other
  text folds: the same over the folded top values;
- ranges and ``LIKE 'p%'``: interpolation in the column's quantiles (of its majority kind); other ``LIKE`` patterns:
  the share of the catalog's sample values that match, smoothed towards `SEL_LIKE`;
- equi-joins: frequent values joined value by value, the rest under the containment assumption;
- `occupancy`: expected distinct values among r draws from d (GROUP BY / DISTINCT sizes).
Values are compared the way SQLite does after column affinity (`coerce`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Callable

from bapsql.db.catalog import QUANTILE_LEVELS, ColumnStats, TableStats

SEL_RANGE = 1 / 3
SEL_LIKE = 0.1
NUMBER_RE = re.compile(r"^\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\s*$")


@dataclass
class ColRef:
    """One column of an (estimated) relation."""

    name: str
    distinct: float  # distinct non-null values
    width: float  # mean characters of cell_text
    nullfrac: float = 0.0
    stats: ColumnStats | None = None
    unique: bool = False  # unique among the base table's rows
    exact_distinct: bool = False  # distinct is an exact (catalog) count: usable in upper bounds
    samples: tuple[str, ...] = ()
    affinity: str = "blob"  # integer | real | numeric | text | blob (SQLite affinity of the declared type)
    base_rows: float = 0.0  # rows of the table the statistics describe (0 when not a base column)
    sample_rows: float = 0.0  # rows the statistics were computed on (== base_rows when exact)


def affinity_of(decl: str) -> str:
    """SQLite's column affinity rules (https://sqlite.org/datatype3.html §3.1)."""
    d = (decl or "").upper()
    if "INT" in d:
        return "integer"
    if any(k in d for k in ("CHAR", "CLOB", "TEXT")):
        return "text"
    if "BLOB" in d or not d:
        return "blob"
    if any(k in d for k in ("REAL", "FLOA", "DOUB")):
        return "real"
    return "numeric"


def coerce(value: Any, affinity: str) -> Any:
    """A literal as SQLite compares it with a column of ``affinity``."""
    if affinity in ("integer", "real", "numeric") and isinstance(value, str) and NUMBER_RE.match(value):
        f = float(value)
        return int(f) if f.is_integer() and abs(f) < 2**53 else f
    if affinity == "text" and isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return value


def value_key(v: Any) -> Any:
    """Hashable comparison key: numbers as floats (SQLite compares 1 and 1.0 equal)."""
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v


def occupancy(d: float, r: float) -> float:
    """Expected distinct values seen among r draws over d equally likely values: d·(1 − exp(−r/d))."""
    if d <= 0 or r <= 0:
        return 0.0
    return d * -math.expm1(-r / d)


def ref_from_stats(c: ColumnStats, t: TableStats) -> ColRef:
    unique = (c.pk == 1 and sum(1 for x in t.columns if x.pk) == 1) or any(
        ix.unique and ix.columns == (c.name,) for ix in t.indexes
    )
    if c.pk == 1 and c.type.upper() == "INTEGER" and sum(1 for x in t.columns if x.pk) == 1:
        unique = True
    n = max(t.rows, 1)
    return ColRef(
        name=c.name,
        distinct=float(max(c.distinct, 0)),
        width=c.avg_width,
        nullfrac=c.nulls / n,
        stats=c,
        unique=unique,
        exact_distinct=not t.sampled,
        samples=c.samples,
        affinity=affinity_of(c.type),
        base_rows=float(t.rows),
        sample_rows=float(t.sample_rows),
    )


def eq_sel(col: ColRef, val: Any) -> float:
    """Share of rows with ``col = val``."""
    if val is None:
        return 0.0
    st = col.stats
    if st is None or not st.top or col.base_rows <= 0:
        return _uniform_share(col)
    key = value_key(coerce(val, col.affinity))
    for v, c in st.top:
        if value_key(v) == key:
            return c / col.base_rows
    return _untopped_share(col)


def folded_eq_sel(col: ColRef, val: Any, fold: Callable[[str], str]) -> float:
    """Share of rows with ``fold(col) = val`` for a text fold (``LOWER``, ``UPPER``, ``TRIM`` and compositions of
    them, `bapsql.db.predicates`): the top values whose folded text is ``val``, else one distinct value's share of
    the rest, as `eq_sel` (values the fold merges are few enough to be one distinct value)."""
    if val is None:
        return 0.0
    st = col.stats
    if st is None or not st.top or col.base_rows <= 0:
        return _uniform_share(col)
    hits = sum(c for v, c in st.top if isinstance(v, str) and fold(v) == val)
    return hits / col.base_rows if hits else _untopped_share(col)


def _uniform_share(col: ColRef) -> float:
    """Share of rows of one value of a column without top values: its non-null rows spread evenly over its distinct
    values."""
    return (1.0 - col.nullfrac) / max(col.distinct, 1.0)


def _untopped_share(col: ColRef) -> float:
    """Share of rows of one value that is not among the column's top values."""
    rest_d = max(col.distinct, 1.0) - len(col.stats.top)
    if rest_d <= 0.5:  # every value is a top value and val is not one of them: absent, or too rare to be sampled
        return 0.0 if col.exact_distinct else 0.5 / max(col.sample_rows, 1.0)
    rest_rows = max(col.base_rows * (1.0 - col.nullfrac) - sum(c for _, c in col.stats.top), 0.0)
    return rest_rows / rest_d / col.base_rows


def _freqs(col: ColRef) -> tuple[dict[Any, float], float, float, bool]:
    """(top value -> rows, rows not in the top list, distinct values not in it, whether the list is complete)."""
    st = col.stats
    n = col.base_rows * (1.0 - col.nullfrac)
    top: dict[Any, float] = {}
    if st is not None and col.base_rows > 0:
        for v, c in st.top:  # numeric-looking text joins numbers (SQLite applies numeric affinity to the other side)
            k = value_key(coerce(v, "numeric"))
            top[k] = top.get(k, 0.0) + float(c)
    rest_rows = max(n - sum(top.values()), 0.0)
    rest_d = max(col.distinct - len(top), 0.0)
    return top, rest_rows, rest_d, bool(top) and rest_d < 0.5


def join_sel(a: ColRef, b: ColRef) -> float:
    """Selectivity of the equi-join ``a = b`` over the product of the two base tables. With frequent-value lists the
    matching top values are joined value by value (cA(v)·cB(v)); the rest follows the containment assumption
    (rest rows of both / the larger rest distinct count). Without statistics: 1 / max(distinct)."""
    if a.base_rows <= 0 or b.base_rows <= 0 or (not (a.stats and a.stats.top) and not (b.stats and b.stats.top)):
        return 1.0 / max(a.distinct, b.distinct, 1.0)
    ta, ra, da, ca = _freqs(a)
    tb, rb, db, cb = _freqs(b)
    size = 0.0
    for v in set(ta) | set(tb):
        fa = ta.get(v, 0.0 if ca else (ra / da if da >= 1 else 0.0))
        fb = tb.get(v, 0.0 if cb else (rb / db if db >= 1 else 0.0))
        size += fa * fb
        if v not in ta and not ca:
            ra, da = max(ra - fa, 0.0), max(da - 1, 0.0)
        if v not in tb and not cb:
            rb, db = max(rb - fb, 0.0), max(db - 1, 0.0)
    if not ca and not cb:
        size += ra * rb / max(da, db, 1.0)
    return min(size / (a.base_rows * b.base_rows), 1.0)


def cdf(col: ColRef, val: Any) -> float | None:
    """Share of non-null values below ``val`` by interpolation between the quantile boundaries at `QUANTILE_LEVELS`
    (None when not comparable); inside a run of equal boundaries, the middle of their levels."""
    st = col.stats
    if st is None or not st.quantiles:
        return None
    q = st.quantiles
    num = isinstance(q[0], (int, float))
    if num != (isinstance(val, (int, float)) and not isinstance(val, bool)):
        return None
    if val <= q[0]:
        return 0.0
    if val > q[-1]:
        return 1.0
    lv = QUANTILE_LEVELS
    for i in range(len(q) - 1):
        if q[i] <= val <= q[i + 1]:
            if num and q[i + 1] > q[i]:
                return lv[i] + (lv[i + 1] - lv[i]) * (val - q[i]) / (q[i + 1] - q[i])
            return (lv[i] + lv[i + 1]) / 2
    return 1.0


def range_sel(col: ColRef, val: Any, op: str) -> float:
    """Share of rows with ``col <op> val`` for op in <, <=, >, >=."""
    if val is None:
        return 0.0
    nonnull = 1.0 - col.nullfrac
    f = cdf(col, val)
    if f is None:
        return SEL_RANGE * nonnull
    nonnull *= col.stats.quantile_share if col.stats is not None else 1.0
    below = f * nonnull  # share strictly below val (interpolated)
    at = min(eq_sel(col, val), nonnull - below) if op in ("<=", ">") else 0.0
    share = {"<": below, "<=": below + at, ">": nonnull - below - at, ">=": nonnull - below}[op]
    return min(max(share, 0.0), nonnull)


def like_sel(col: ColRef, pat: str) -> float:
    """``LIKE`` selectivity: an exact match without wildcards; a prefix range for 'abc%'; `SEL_LIKE` otherwise."""
    if "%" not in pat and "_" not in pat:
        return eq_sel(col, pat) if col.affinity == "text" else SEL_LIKE
    m = re.match(r"^([^%_]+)%$", pat)
    if m and col.stats is not None and col.stats.quantiles and isinstance(col.stats.quantiles[0], str):
        pre = m.group(1)
        lo, hi = cdf(col, pre), cdf(col, pre + "\U0010ffff")
        if lo is not None and hi is not None:
            return max(hi - lo, 1.0 / max(col.distinct, 1.0)) * (1 - col.nullfrac)
    if col.samples:  # share of the catalog's sample values that match, smoothed towards SEL_LIKE
        rx = re.compile("^" + "".join(".*" if ch == "%" else "." if ch == "_" else re.escape(ch) for ch in pat) + "$",
                        re.IGNORECASE | re.DOTALL)
        hits = sum(1 for v in col.samples if rx.match(v))
        return (hits + SEL_LIKE) / (len(col.samples) + 1) * (1 - col.nullfrac)
    return SEL_LIKE
