"""The join model of one SELECT and what an expression means inside it, split out of `bapsql.db.cardinality` (whose
`Analyzer` builds on both parts):

- `Rel` (one FROM item), `Conjunct` (one AND-term of WHERE / inner-join ON) and `Scope` (a SELECT's relations and
  pooled inner-join conjuncts): the predicates on one table combine with exponential backoff (`Scope.local_sel`),
  floored at one row unless one of them is provably empty; join predicates multiply (`Scope.rows_of`). The VM-step
  model walks these scopes (``Analysis.scopes``).
- `Columns`, a mixin of the `Analyzer`: column references resolved through the enclosing scopes, constants
  (`value_of`, `_lit`), the width / distinct count / sample texts of output columns, and the distinct combinations of
  GROUP BY / DISTINCT keys.
- `DEFAULT_WIDTH` (width of an output column nothing is known about) and `INF` (no upper bound), shared by the
  analysis.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from sqlglot import exp

from bapsql.db.catalog import TableStats
from bapsql.db.rows import cell_text
from bapsql.db.selectivity import NUMBER_RE, ColRef, occupancy

DEFAULT_WIDTH = 8.0
INF = float("inf")


@dataclass
class Rel:
    """One FROM item (table, view, CTE or subquery) under its alias."""

    alias: str
    rows: float
    ub: float
    cols: dict[str, ColRef]  # lower-case name -> column, in declaration order
    table: TableStats | None = None


@dataclass
class Conjunct:
    """One AND-term of WHERE / inner-join ON: the aliases it touches, its selectivity, the (alias, column) pairs it
    reads, its kind (``eq`` / ``range`` / ``other``) and the alias a unique-key equality pins to <= 1 row."""

    aliases: frozenset[str]
    sel: float
    unique_alias: str | None = None
    cols: frozenset[tuple[str, str]] = frozenset()
    kind: str = "other"
    probe_sel: float | None = None  # for IN: the selectivity of one of its values (one index probe)


@dataclass
class Scope:
    """The FROM/WHERE of one SELECT: its relations and pooled inner-join conjuncts."""

    rels: dict[str, Rel] = field(default_factory=dict)
    conjuncts: list[Conjunct] = field(default_factory=list)
    outer: "Scope | None" = None
    left: set[str] = field(default_factory=set)  # aliases joined with LEFT JOIN (their side may be NULL-padded)

    def rows_of(self, aliases: set[str] | frozenset[str]) -> float:
        """p50 rows of the join of ``aliases`` with every conjunct that only touches them applied."""
        r = 1.0
        for a in aliases:
            if a in self.rels:
                r *= self.rels[a].rows * self.local_sel(a)
        for c in self.conjuncts:
            if c.aliases <= aliases and len(c.aliases) != 1:
                r *= c.sel
        return r

    def local_sel(self, alias: str) -> float:
        """Combined selectivity of the predicates on ``alias`` alone, with exponential backoff for correlation:
        s1 · s2^(1/2) · s3^(1/4) · s4^(1/8) over the selectivities sorted ascending. Unless a predicate is provably
        empty (selectivity 0 from exact statistics), at least one row is assumed to qualify: questions are asked
        about values that exist."""
        sels = sorted(c.sel for c in self.conjuncts if c.aliases == {alias})
        out = 1.0
        for i, s in enumerate(sels[:4]):
            out *= s ** (1.0 / 2**i)
        rel = self.rels.get(alias)
        if sels and sels[0] > 0 and rel is not None and rel.rows >= 1:
            out = max(out, 1.0 / rel.rows)
        return out


class Columns:
    """The column side of the `Analyzer` (a mixin): what a column or expression of a scope is. Expects the host's
    ``features`` counters and ``query`` (scalar subqueries are analyzed)."""

    def resolve(self, col: exp.Column, scope: Scope | None) -> tuple[str, ColRef] | None:
        name, table = col.name.lower(), col.table.lower() if col.table else ""
        s = scope
        while s is not None:
            if table:
                for a, rel in s.rels.items():
                    if a.lower() == table and name in rel.cols:
                        return a, rel.cols[name]
            else:
                for a, rel in s.rels.items():
                    if name in rel.cols:
                        return a, rel.cols[name]
            s = s.outer
        return None

    def value_of(self, e: exp.Expression, scope: Scope) -> tuple[bool, Any]:
        """(is constant, python value): literals, negated literals, NULL and unresolvable double-quoted names."""
        if isinstance(e, exp.Paren):
            return self.value_of(e.this, scope)
        v = _lit(e)
        if v is not None or isinstance(e, exp.Null):
            return True, v
        if isinstance(e, exp.Column) and not e.table and e.this.args.get("quoted") and self.resolve(e, scope) is None:
            return True, e.name  # SQLite reads an unresolvable "x" as the string 'x'
        return False, None

    def projections(self, sel: exp.Select, scope: Scope, rows: float) -> list[ColRef]:
        out: list[ColRef] = []
        for p in sel.expressions:
            if isinstance(p, exp.Star) or (isinstance(p, exp.Column) and isinstance(p.this, exp.Star)):
                self.features["star"] = True
                table = p.table.lower() if isinstance(p, exp.Column) and p.table else ""
                for a, rel in scope.rels.items():
                    if not table or a.lower() == table:
                        out.extend(rel.cols.values())
                continue
            self.features["projections"] += 1
            ref = self.expr_col(p.unalias(), scope, rows)
            out.append(dataclasses.replace(ref, name=p.alias_or_name or ref.name))
        return out

    def expr_col(self, e: exp.Expression, scope: Scope, rows: float) -> ColRef:
        """Width / distinct / sample texts of one output expression."""
        if isinstance(e, exp.Paren):
            return self.expr_col(e.this, scope, rows)
        if isinstance(e, exp.Column):
            hit = self.resolve(e, scope)
            if hit is not None:
                return hit[1]
            ok, v = self.value_of(e, scope)
            if ok:
                return ColRef(e.name, 1, len(cell_text(v)), samples=(cell_text(v),))
        ok, v = self.value_of(e, scope)
        if ok:
            return ColRef("?", 1, len(cell_text(v)), samples=(cell_text(v),))
        if isinstance(e, (exp.Subquery, exp.Select)):
            card = self.query(e.this if isinstance(e, exp.Subquery) else e, scope)
            self.features["subqueries"] += 1
            return card.cols[0] if card.cols else ColRef("?", 1, DEFAULT_WIDTH)
        if isinstance(e, exp.Count):
            n = max(rows, 1.0)
            txt = cell_text(int(round(n)))
            return ColRef("count", n, len(txt), samples=(txt, cell_text(max(int(n) // 3, 1))))
        if isinstance(e, (exp.Avg, exp.Sum, exp.Min, exp.Max)) or (isinstance(e, exp.Anonymous) and e.name.lower()
                                                                   in ("total",)):
            inner = self.expr_col(e.this if e.this is not None else e, scope, rows) if e.this is not None else None
            base = inner.samples if inner and inner.samples else ("1",)
            if isinstance(e, (exp.Min, exp.Max)) and inner is not None:
                return inner
            nums = [float(s) for s in base if NUMBER_RE.match(s)] or [1.0]
            mean = sum(nums) / len(nums)
            if isinstance(e, exp.Avg) or isinstance(e, exp.Anonymous):
                vals = [mean + 1 / 3, mean * 1.01 + 0.123457, mean]
            else:
                vals = [mean * max(rows, 1.0), mean * max(rows, 1.0) / 2]
                if all(float(x).is_integer() for x in nums):
                    vals = [int(round(v)) for v in vals]
            samples = tuple(cell_text(v) for v in vals)
            return ColRef("agg", rows, sum(map(len, samples)) / len(samples), samples=samples)
        subs = [self.expr_col(c, scope, rows) for c in e.iter_expressions() if not isinstance(c, exp.DataType)]
        if subs:
            if isinstance(e, exp.DPipe) or (isinstance(e, exp.Func) and e.key in ("concat",)):
                w = sum(s.width for s in subs)
                n = min(len(s.samples) for s in subs) if all(s.samples for s in subs) else 0
                samples = tuple("".join(s.samples[i] for s in subs) for i in range(n))
                return ColRef("?", max(s.distinct for s in subs), w, samples=samples)
            best = max(subs, key=lambda s: s.width)
            return ColRef("?", best.distinct, best.width, samples=best.samples)
        return ColRef("?", rows, DEFAULT_WIDTH)

    def distinct_of(self, scope: Scope, keys: list[exp.Expression], rows: float, sel: exp.Select) -> tuple[float, float]:
        """(p50 distinct combinations, hard upper bound) of ``keys`` over the scope's joined rows."""
        per_alias: dict[str, list[ColRef]] = {}
        other = 1.0
        ub = 1.0
        aliases_out = {p.alias_or_name.lower(): p.unalias() for p in sel.expressions if p.alias}
        for k in keys:
            if isinstance(k, exp.Literal) and not k.is_string and k.this.isdigit() and \
                    0 < int(k.this) <= len(sel.expressions):  # GROUP BY 2: an output position
                k = sel.expressions[int(k.this) - 1].unalias()
            if isinstance(k, exp.Column) and not k.table and k.name.lower() in aliases_out \
                    and self.resolve(k, scope) is None:
                k = aliases_out[k.name.lower()]
            hit = self.resolve(k, scope) if isinstance(k, exp.Column) else None
            if hit is None:
                if self.value_of(k, scope)[0]:
                    continue
                other *= max(rows, 1.0) ** 0.5
                ub = INF
                continue
            a, ref = hit
            per_alias.setdefault(a, []).append(ref)
            ub *= (ref.distinct + (1 if ref.nullfrac > 0 else 0)) if ref.exact_distinct else INF
        d = other
        for a, refs in per_alias.items():
            rel = scope.rels.get(a)
            cap = rel.rows * scope.local_sel(a) if rel is not None else INF
            uniq = [r for r in refs if r.unique]
            if uniq:
                prod = uniq[0].distinct
            else:
                prod = math.prod(max(r.distinct, 1.0) + (1 if r.nullfrac > 0 else 0) for r in refs)
            # distinct values surviving this alias's own filters
            d *= occupancy(prod, max(cap, 1.0)) if cap < INF else prod
        return max(d, 1.0 if rows >= 1 else rows), ub


def _lit(e: exp.Expression | None) -> Any:
    if isinstance(e, exp.Paren):
        return _lit(e.this)
    if isinstance(e, exp.Literal):
        if e.is_string:
            return e.this
        try:
            f = float(e.this)
        except ValueError:
            return None
        return int(f) if f.is_integer() and "." not in e.this and "e" not in e.this.lower() else f
    if isinstance(e, exp.Neg):
        v = _lit(e.this)
        return -v if isinstance(v, (int, float)) else None
    if isinstance(e, exp.Boolean):
        return 1 if e.this else 0
    return None
