"""Selectivity of WHERE / join-ON predicates for the shape analysis, split out of `bapsql.db.cardinality`: the
`Predicates` mixin of its `Analyzer`, and the small pure sqlglot helpers the walk shares (`_int_arg`, `_alias`,
`_conjuncts`, `_in_subquery`, `_is_agg`).

Contract: one predicate's selectivity comes from `bapsql.db.selectivity` (frequent values, quantiles, samples);
``LOWER(TRIM(col)) = v`` (a chain of ``LOWER`` / ``UPPER`` / ``TRIM`` over a column, compared with a literal) reads
the column's statistics through the same fold (`folded_eq_sel`); ``IN (list)`` sums equalities; ``IS NULL`` the
null share; other predicates use fixed selectivities (`SEL_*`); OR is inclusion–exclusion, NOT complements; an
equi-join uses `join_sel` (frequent values joined value by value, containment for the rest).
`Predicates.add_conjunct` records each AND-term as a `Conjunct` of its `Scope` (`bapsql.db.scope`), which combines
them.
"""

from __future__ import annotations

import string
from typing import Any, Callable

from sqlglot import exp

from bapsql.db.scope import Conjunct, Scope, _lit
from bapsql.db.selectivity import (SEL_LIKE, SEL_RANGE, ColRef, coerce, eq_sel, folded_eq_sel, join_sel, like_sel,
                                   occupancy, range_sel)

SEL_DEFAULT = 0.25
SEL_EXISTS = 0.5
AGG_NAMES = {"count", "sum", "avg", "min", "max", "total", "group_concat", "string_agg", "json_group_array",
             "json_group_object"}


class Predicates:
    """The predicate side of the `Analyzer` (a mixin): conjuncts and their selectivities. Expects the host's
    ``features`` counters, ``query`` (subqueries in predicates are analyzed) and the `Columns` mixin's ``resolve`` /
    ``value_of``."""

    def add_conjunct(self, scope: Scope, c: exp.Expression) -> None:
        self.features["filters"] += 1
        cols = frozenset((h[0], h[1].name.lower()) for col in c.find_all(exp.Column)
                         if (h := self.resolve(col, scope)) is not None and h[0] in scope.rels
                         and not _in_subquery(col, c))
        aliases = frozenset(a for a, _ in cols)
        sel = self.selectivity(c, scope)
        uniq = None
        if isinstance(c, exp.EQ):
            for side, other in ((c.this, c.expression), (c.expression, c.this)):
                if isinstance(side, exp.Column):
                    h = self.resolve(side, scope)
                    if h is not None and h[0] in scope.rels and h[1].unique and scope.rels[h[0]].table is not None:
                        uniq = h[0]
        kind = "eq" if isinstance(c, (exp.EQ, exp.In)) else "range" if isinstance(
            c, (exp.GT, exp.GTE, exp.LT, exp.LTE, exp.Between)) or (isinstance(c, exp.Like)) else "other"
        probe = None
        if isinstance(c, exp.In):
            col = self._column(c.this, scope)
            probe = 1.0 / max(col.distinct, 1.0) if col is not None else None
        conj = Conjunct(aliases, sel, uniq, cols, kind, probe)
        scope.conjuncts.append(conj)

    def selectivity(self, e: exp.Expression, scope: Scope) -> float:
        s = self._sel(e, scope)
        return min(max(s, 0.0), 1.0)

    def _sel(self, e: exp.Expression, scope: Scope) -> float:
        f = self.features
        if isinstance(e, exp.Paren):
            return self._sel(e.this, scope)
        if isinstance(e, exp.And):
            return self.selectivity(e.this, scope) * self.selectivity(e.expression, scope)
        if isinstance(e, exp.Or):
            a, b = self.selectivity(e.this, scope), self.selectivity(e.expression, scope)
            return a + b - a * b
        if isinstance(e, exp.Not):
            return 1.0 - self.selectivity(e.this, scope)
        if isinstance(e, (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.Is, exp.NullSafeEQ)):
            col, val, op = self._col_side(e, scope)
            if isinstance(e, exp.Is):
                if col is None:
                    return SEL_DEFAULT
                return col.nullfrac if isinstance(e.expression, exp.Null) else 1 - col.nullfrac
            if isinstance(e, (exp.EQ, exp.NullSafeEQ)):
                f["equality_filters"] += 1
            elif not isinstance(e, exp.NEQ):
                f["range_filters"] += 1
            if col is None and isinstance(e, (exp.EQ, exp.NEQ)):
                folded = self._folded_side(e, scope)
                if folded is not None:
                    fcol, fold, val = folded
                    share = folded_eq_sel(fcol, val, fold)
                    return share if isinstance(e, exp.EQ) else max(0.0, 1.0 - fcol.nullfrac - share)
            if col is None:
                other = self._both_cols(e, scope)
                if other is not None and other[0] is other[1]:  # t.a = t.a: true for every non-null a
                    return 1.0 - other[0].nullfrac if isinstance(e, (exp.EQ, exp.GTE, exp.LTE)) else 0.0
                if other is not None and isinstance(e, exp.EQ):
                    return join_sel(other[0], other[1])
                return 0.9 if isinstance(e, exp.NEQ) else SEL_RANGE if not isinstance(e, exp.EQ) else 0.1
            if val is _NOVAL:
                return 1.0 / max(col.distinct, 1.0) if isinstance(e, exp.EQ) else (
                    1 - 1.0 / max(col.distinct, 1.0) if isinstance(e, exp.NEQ) else SEL_RANGE)
            if isinstance(e, (exp.EQ, exp.NullSafeEQ)):
                return eq_sel(col, val)
            if isinstance(e, exp.NEQ):
                return max(0.0, 1 - col.nullfrac - eq_sel(col, val))
            return range_sel(col, val, op)
        if isinstance(e, exp.Between):
            f["range_filters"] += 1
            col = self._column(e.this, scope)
            lo_ok, lo = self.value_of(e.args["low"], scope)
            hi_ok, hi = self.value_of(e.args["high"], scope)
            if col is None or not (lo_ok and hi_ok):
                return SEL_RANGE / 2
            return max(0.0, range_sel(col, hi, "<=") - range_sel(col, lo, "<"))
        if isinstance(e, exp.Like):
            f["like_filters"] += 1
            col = self._column(e.this, scope)
            ok, pat = self.value_of(e.expression, scope)
            s = SEL_LIKE if col is None or not ok or not isinstance(pat, str) else like_sel(col, pat)
            return 1.0 - s if e.args.get("negate") else s
        if isinstance(e, exp.In):
            col = self._column(e.this, scope)
            if e.args.get("query") is not None:
                self.features["subqueries"] += 1
                card = self.query(e.args["query"].this if isinstance(e.args["query"], exp.Subquery)
                                  else e.args["query"], scope)
                if col is None:
                    return 0.5
                return min(1.0, occupancy(card.cols[0].distinct if card.cols else card.rows, card.rows)
                           / max(col.distinct, 1.0))
            f["in_lists"] += 1
            if col is None:
                return min(1.0, 0.1 * len(e.expressions))
            total = 0.0
            for v in e.expressions:
                ok, val = self.value_of(v, scope)
                total += eq_sel(col, val) if ok else 1.0 / max(col.distinct, 1.0)
            return min(total, 1.0 - col.nullfrac)
        if isinstance(e, exp.Exists):
            self.features["subqueries"] += 1
            self.query(e.this, scope)
            return SEL_EXISTS
        return SEL_DEFAULT

    def _column(self, e: exp.Expression, scope: Scope) -> ColRef | None:
        while isinstance(e, exp.Paren):
            e = e.this
        if isinstance(e, exp.Column):
            h = self.resolve(e, scope)
            return h[1] if h else None
        return None

    def _folded_side(self, e: exp.Binary, scope: Scope) -> tuple[ColRef, Callable[[str], str], Any] | None:
        """(column, fold, literal) when one side is a text fold of a column (`text_fold`) and the other a value."""
        for side, other in ((e.this, e.expression), (e.expression, e.this)):
            found = text_fold(side)
            if found is None:
                continue
            col = self._column(found[0], scope)
            ok, val = self.value_of(other, scope)
            if col is not None and ok:
                return col, found[1], val
        return None

    def _both_cols(self, e: exp.Binary, scope: Scope) -> tuple[ColRef, ColRef] | None:
        a, b = self._column(e.this, scope), self._column(e.expression, scope)
        for side in (e.this, e.expression):
            if isinstance(side, (exp.Subquery, exp.Select)):
                self.features["subqueries"] += 1
                self.query(side.this if isinstance(side, exp.Subquery) else side, scope)
        return (a, b) if a is not None and b is not None else None

    def _col_side(self, e: exp.Binary, scope: Scope) -> tuple[ColRef | None, Any, str]:
        flip = {"GT": "<", "GTE": "<=", "LT": ">", "LTE": ">="}
        ops = {"GT": ">", "GTE": ">=", "LT": "<", "LTE": "<="}
        name = type(e).__name__
        for side, other, op in ((e.this, e.expression, ops.get(name, "=")), (e.expression, e.this, flip.get(name, "="))):
            col = self._column(side, scope)
            if col is None:
                continue
            ok, val = self.value_of(other, scope)
            if ok:
                return col, coerce(val, col.affinity), op
            if self._column(other, scope) is None:
                if isinstance(other, (exp.Subquery, exp.Select)):
                    self.features["subqueries"] += 1
                    self.query(other.this if isinstance(other, exp.Subquery) else other, scope)
                return col, _NOVAL, op
        return None, _NOVAL, "="


_NOVAL = object()
_ASCII_LOWER = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)
_ASCII_UPPER = str.maketrans(string.ascii_lowercase, string.ascii_uppercase)
_TRIMS: dict[str | None, Callable[[str], str]] = {
    None: lambda v: v.strip(" "), "BOTH": lambda v: v.strip(" "), "LEADING": lambda v: v.lstrip(" "),
    "TRAILING": lambda v: v.rstrip(" ")}


def text_fold(e: exp.Expression) -> tuple[exp.Column, Callable[[str], str]] | None:
    """(the column, the fold as a function on text) for ``e`` a chain of ``LOWER``, ``UPPER`` and ``TRIM`` (spaces
    only, no custom characters) over a column, as SQLite computes them (ASCII case folding); None otherwise."""
    steps: list[Callable[[str], str]] = []
    while True:
        if isinstance(e, exp.Paren):
            e = e.this
        elif isinstance(e, exp.Lower):
            steps.append(lambda v: v.translate(_ASCII_LOWER))
            e = e.this
        elif isinstance(e, exp.Upper):
            steps.append(lambda v: v.translate(_ASCII_UPPER))
            e = e.this
        elif isinstance(e, exp.Trim) and e.args.get("expression") is None and e.args.get("position") in _TRIMS:
            steps.append(_TRIMS[e.args.get("position")])
            e = e.this
        else:
            break
    if not steps or not isinstance(e, exp.Column):
        return None

    def fold(v: str) -> str:
        for step in reversed(steps):  # innermost first
            v = step(v)
        return v

    return e, fold


def _int_arg(node: exp.Expression | None) -> int | None:
    if node is None:
        return None
    e = node.args.get("expression") if isinstance(node, (exp.Limit, exp.Offset)) else node
    v = _lit(e) if e is not None else None
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _alias(item: exp.Expression) -> str:
    return (item.alias_or_name or "?").lower()


def _conjuncts(e: exp.Expression) -> list[exp.Expression]:
    while isinstance(e, exp.Paren):
        e = e.this
    if isinstance(e, exp.And):
        return _conjuncts(e.this) + _conjuncts(e.expression)
    return [e]


def _in_subquery(col: exp.Column, root: exp.Expression) -> bool:
    p = col.parent
    while p is not None and p is not root:
        if isinstance(p, (exp.Select, exp.Subquery)):
            return True
        p = p.parent
    return False


def _is_agg(e: exp.Expression) -> bool:
    if isinstance(e, (exp.Min, exp.Max)) and e.expressions:
        return False  # min(a, b) / max(a, b) are scalar in SQLite
    if isinstance(e, exp.AggFunc):
        return not isinstance(e.parent, exp.Window)
    return isinstance(e, exp.Anonymous) and e.name.lower() in AGG_NAMES and not isinstance(e.parent, exp.Window)
