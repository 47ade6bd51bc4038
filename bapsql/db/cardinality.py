"""Shape analysis of one SELECT with sqlglot + catalog statistics: output rows (p50 and a hard upper bound), output
column widths, and the per-scope join model the VM-step model walks.

Contract: `analyze(sql, catalog)` never raises for SQL sqlglot cannot parse or for unknown tables/columns: it falls
back to documented defaults and says so in ``Analysis.notes``. Estimates are System-R style:
- base rows from the catalog (views and CTEs are analyzed as subqueries); unknown tables get `DEFAULT_ROWS`;
- one predicate's selectivity comes from `bapsql.db.selectivity` (frequent values, quantiles, samples); ``IN
  (list)`` sums equalities; ``IS NULL`` the null share; other predicates use fixed selectivities (`SEL_*`); OR is
  inclusion–exclusion, NOT complements; the predicates on one table combine with exponential backoff
  (`Scope.local_sel`), floored at one row unless one of them is provably empty; join predicates multiply;
- an equi-join uses `join_sel` (frequent values joined value by value, containment for the rest);
- GROUP BY / DISTINCT: D = product of the keys' distinct counts per table (a unique key makes the table's other keys
  redundant), then the occupancy formula D·(1 − exp(−R/D)) for R input rows; an aggregate without GROUP BY is 1 row;
- LIMIT/OFFSET clip; UNION ALL adds, UNION/INTERSECT/EXCEPT use fixed overlaps.
Upper bounds (``ub``) are hard where the catalog is exact: table sizes, products, equality on a unique key, LIMIT,
GROUP BY over exact distinct counts, one row for an ungrouped aggregate.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import sqlglot
from sqlglot import exp

from bapsql.db.catalog import Catalog, TableStats
from bapsql.db.rows import cell_text
from bapsql.db.selectivity import (NUMBER_RE, SEL_LIKE, SEL_RANGE, ColRef, coerce, eq_sel, join_sel, like_sel,
                                   occupancy, range_sel, ref_from_stats)

DEFAULT_ROWS = 1000.0
SEL_DEFAULT = 0.25
SEL_HAVING = 1 / 3
SEL_EXISTS = 0.5
DEFAULT_WIDTH = 8.0
INF = float("inf")
AGG_NAMES = {"count", "sum", "avg", "min", "max", "total", "group_concat", "string_agg", "json_group_array",
             "json_group_object"}


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


@dataclass
class Card:
    """Estimated output of a query: p50 rows, hard upper bound, whether p50 is certain, output columns."""

    rows: float
    ub: float
    exact: bool
    cols: list[ColRef]


@dataclass
class Analysis:
    """What `analyze` returns: the output estimate, shape features, every scope (for the VM-step model), notes on
    fallbacks taken, and the group ratio of each GROUP BY in order of appearance."""

    card: Card
    features: dict[str, int | bool]
    scopes: list[Scope]  # every SELECT scope, outermost first
    notes: list[str]
    group_ratios: list[float] = field(default_factory=list)  # groups / input rows of each GROUP BY, in order


class Analyzer:
    """Walks a sqlglot tree; one instance per `analyze` call (each CTE is analyzed once per WITH clause)."""

    def __init__(self, catalog: Catalog):
        self.catalog = catalog
        self.scopes: list[Scope] = []
        self.notes: list[str] = []
        self.ctes: list[dict[str, Card | exp.Expression]] = []
        self.group_ratios: list[float] = []
        self.features: dict[str, int | bool] = {
            "tables": 0, "joins": 0, "left_joins": 0, "filters": 0, "equality_filters": 0, "range_filters": 0,
            "like_filters": 0, "in_lists": 0, "aggregates": 0, "group_by": 0, "having": False, "distinct": False,
            "order_by": False, "limit": -1, "offset": 0, "subqueries": 0, "set_ops": 0, "ctes": 0,
            "window_functions": 0, "star": False, "projections": 0, "unknown_tables": 0,
        }

    # -- queries ---------------------------------------------------------------------------------------------------
    def query(self, node: exp.Expression, outer: Scope | None = None) -> Card:
        with_ = node.args.get("with_") or node.args.get("with")
        pushed = False
        if with_ is not None:
            self.ctes.append({})
            pushed = True
            for cte in with_.expressions:
                self.features["ctes"] += 1
                name = cte.alias_or_name.lower()
                if with_.args.get("recursive"):
                    self.ctes[-1][name] = Card(DEFAULT_ROWS, INF, False, self._cols_of_select(cte.this))
                else:
                    self.ctes[-1][name] = self.query(cte.this, outer)
        try:
            if isinstance(node, exp.Subquery):
                card = self.query(node.this, outer)
            elif isinstance(node, exp.SetOperation):
                card = self.setop(node, outer)
            elif isinstance(node, exp.Select):
                card = self.select(node, outer)
            elif isinstance(node, exp.Values):
                n = float(len(node.expressions))
                first = node.expressions[0].expressions if node.expressions else []
                cols = [ColRef(f"column{i + 1}", n, float(len(cell_text(_lit(e)))) if _lit(e) is not None else
                               DEFAULT_WIDTH) for i, e in enumerate(first)]
                card = Card(n, n, True, cols)
            else:
                self.notes.append(f"unsupported statement shape {type(node).__name__}")
                card = Card(DEFAULT_ROWS, INF, False, [])
        finally:
            if pushed:
                self.ctes.pop()
        return self._limit(node, card)

    def _limit(self, node: exp.Expression, card: Card) -> Card:
        if isinstance(node, exp.Select):
            return card  # handled in select()
        lim, off = _int_arg(node.args.get("limit")), _int_arg(node.args.get("offset"))
        if lim is None and off is None:
            return card
        return _clip(card, lim, off)

    def setop(self, node: exp.SetOperation, outer: Scope | None) -> Card:
        self.features["set_ops"] += 1
        a, b = self.query(node.this, outer), self.query(node.expression, outer)
        distinct = node.args.get("distinct", True)
        if isinstance(node, exp.Union):
            rows = a.rows + b.rows if not distinct else max(a.rows, b.rows) + 0.5 * min(a.rows, b.rows)
            card = Card(rows, a.ub + b.ub, a.exact and b.exact and not distinct, a.cols)
        elif isinstance(node, exp.Intersect):
            card = Card(0.5 * min(a.rows, b.rows), min(a.ub, b.ub), False, a.cols)
        else:
            card = Card(0.5 * a.rows, a.ub, False, a.cols)
        lim, off = _int_arg(node.args.get("limit")), _int_arg(node.args.get("offset"))
        if lim is not None:
            self.features["limit"] = lim
        return _clip(card, lim, off) if (lim is not None or off is not None) else card

    def select(self, sel: exp.Select, outer: Scope | None) -> Card:
        scope = Scope(outer=outer)
        self.scopes.append(scope)
        from_ = sel.args.get("from_") or sel.args.get("from")
        items = [from_.this] if from_ is not None else []
        joins = sel.args.get("joins") or []
        for item in items + [j.this for j in joins]:
            rel = self.source(item, scope)
            scope.rels[rel.alias] = rel
        self.features["joins"] += len(joins)
        for j in joins:
            side = (j.args.get("side") or "").upper()
            alias = _alias(j.this)
            on = j.args.get("on")
            using = j.args.get("using")
            conj = _conjuncts(on) if on is not None else []
            if using:
                prev = [a for a in scope.rels if a != alias]
                for u in using:
                    col = u.name.lower()
                    for p in prev:
                        if col in scope.rels[p].cols:
                            conj.append(exp.EQ(this=exp.column(col, p), expression=exp.column(col, alias)))
                            break
            if (j.args.get("method") or "").upper() == "NATURAL":
                prev = [a for a in scope.rels if a != alias]
                for col in scope.rels[alias].cols:
                    for p in prev:
                        if col in scope.rels[p].cols:
                            conj.append(exp.EQ(this=exp.column(col, p), expression=exp.column(col, alias)))
                            break
            if side == "LEFT":
                self.features["left_joins"] += 1
                scope.left.add(alias)
            for c in conj:
                self.add_conjunct(scope, c)
        where = sel.args.get("where")
        if where is not None:
            for c in _conjuncts(where.this):
                self.add_conjunct(scope, c)
        aliases = frozenset(scope.rels)
        rows = scope.rows_of(aliases) if aliases else 1.0
        ub = self._ub(scope)
        exact = all(r.ub == r.rows for r in scope.rels.values()) and not scope.conjuncts
        for alias in scope.left:  # a LEFT JOIN keeps every row of its left side
            rows = max(rows, scope.rows_of(aliases - {alias}))
        cols = self.projections(sel, scope, rows)
        group = sel.args.get("group")
        has_agg = any(_is_agg(e) for p in sel.expressions for e in p.walk() if isinstance(e, exp.Func))
        n_agg = sum(1 for p in sel.expressions for e in p.walk() if isinstance(e, exp.Func) and _is_agg(e))
        self.features["aggregates"] += n_agg
        self.features["window_functions"] += sum(1 for p in sel.expressions for _ in p.find_all(exp.Window))
        if group is not None and group.expressions:
            self.features["group_by"] += len(group.expressions)
            d, dub = self.distinct_of(scope, group.expressions, rows, sel)
            groups = min(rows, occupancy(d, rows))
            self.group_ratios.append(groups / rows if rows > 0 else 1.0)
            rows, ub, exact = groups, min(ub, dub), False
        elif has_agg:
            rows, ub, exact = 1.0, 1.0, True
        having = sel.args.get("having")
        if having is not None:
            self.features["having"] = True
            rows, exact = rows * SEL_HAVING, False
            if has_agg and group is None:
                ub = 1.0
        if sel.args.get("distinct") is not None:
            self.features["distinct"] = True
            d, dub = self.distinct_of(scope, [p.unalias() for p in sel.expressions], rows, sel)
            rows, ub, exact = min(rows, occupancy(d, rows)), min(ub, dub), exact and rows <= 1
        if sel.args.get("order") is not None:
            self.features["order_by"] = True
        lim, off = _int_arg(sel.args.get("limit")), _int_arg(sel.args.get("offset"))
        if lim is not None:
            self.features["limit"] = lim if self.features["limit"] < 0 else min(self.features["limit"], lim)
        if off:
            self.features["offset"] = off
        card = Card(rows, max(ub, rows) if ub < INF else INF, exact, cols)
        return _clip(card, lim, off) if (lim is not None or off is not None) else card

    # -- sources ---------------------------------------------------------------------------------------------------
    def source(self, item: exp.Expression, scope: Scope) -> Rel:
        alias = _alias(item)
        if isinstance(item, exp.Table) and not isinstance(item.this, exp.Func):
            name = item.name.lower()
            for level in reversed(self.ctes):
                if name in level:
                    card = level[name]
                    return Rel(alias, card.rows, card.ub, {c.name.lower(): c for c in card.cols})
            t = self.catalog.table(item.name)
            self.features["tables"] += 1
            if t is not None:
                cols = {c.name.lower(): ref_from_stats(c, t) for c in t.columns}
                return Rel(alias, float(t.rows), float(t.rows), cols, table=t)
            vsql = self.catalog.view_sql(item.name)
            if vsql:
                try:
                    view = sqlglot.parse_one(vsql, read="sqlite")
                    card = self.query(view.expression if isinstance(view, exp.Create) else view)
                    return Rel(alias, card.rows, card.ub, {c.name.lower(): c for c in card.cols})
                except sqlglot.errors.SqlglotError:
                    pass
            self.features["unknown_tables"] += 1
            self.notes.append(f"unknown table {item.name!r}: assuming {DEFAULT_ROWS:g} rows")
            return Rel(alias, DEFAULT_ROWS, INF, {})
        if isinstance(item, exp.Subquery):
            self.features["subqueries"] += 1
            card = self.query(item.this, scope.outer)
            return Rel(alias, card.rows, card.ub, {c.name.lower(): c for c in card.cols})
        self.notes.append(f"unsupported FROM item {type(item).__name__}")
        return Rel(alias, DEFAULT_ROWS, INF, {})

    def _cols_of_select(self, node: exp.Expression) -> list[ColRef]:
        sel = node if isinstance(node, exp.Select) else node.find(exp.Select)
        if sel is None:
            return []
        return [ColRef(p.alias_or_name or f"c{i}", DEFAULT_ROWS, DEFAULT_WIDTH) for i, p in enumerate(sel.expressions)]

    # -- columns ---------------------------------------------------------------------------------------------------
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

    # -- predicates ------------------------------------------------------------------------------------------------
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

    def _ub(self, scope: Scope) -> float:
        """Hard upper bound of the scope's join: the product of the relations' bounds, after dropping each relation
        pinned to at most one row per row of the others (unique-key equality), one at a time so cycles stay sound."""
        left = {a: max(r.ub, 1.0) if a in scope.left else r.ub for a, r in scope.rels.items()}  # LEFT: >= 1 row
        changed = True
        while changed:
            changed = False
            for c in scope.conjuncts:
                u = c.unique_alias
                if u in left and (c.aliases - {u}) <= set(left) - {u}:
                    left.pop(u)
                    changed = True
        return math.prod(left.values()) if left else 1.0

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


def _clip(card: Card, lim: int | None, off: int | None) -> Card:
    rows, ub = card.rows, card.ub
    if off:
        rows, ub = max(0.0, rows - off), max(0.0, ub - off)
    if lim is not None and lim >= 0:
        rows, ub = min(rows, lim), min(ub, lim)
    return Card(rows, ub, card.exact, card.cols)


def _int_arg(node: exp.Expression | None) -> int | None:
    if node is None:
        return None
    e = node.args.get("expression") if isinstance(node, (exp.Limit, exp.Offset)) else node
    v = _lit(e) if e is not None else None
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


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


def analyze(sql: str, catalog: Catalog) -> Analysis:
    """Estimate the output of ``sql`` against ``catalog``. Never raises: parse failures give an `Analysis` with
    unknown rows (`DEFAULT_ROWS`, no upper bound) and a note."""
    an = Analyzer(catalog)
    try:
        tree = sqlglot.parse_one(sql, read="sqlite")
    except (sqlglot.errors.SqlglotError, ValueError, RecursionError) as exc:
        return Analysis(Card(DEFAULT_ROWS, INF, False, []), an.features, [], [f"sqlglot could not parse: {exc}"], [])
    try:
        card = an.query(tree)
    except (sqlglot.errors.SqlglotError, ValueError, TypeError, AttributeError, KeyError, RecursionError) as exc:
        an.notes.append(f"shape analysis failed: {type(exc).__name__}: {exc}")
        card = Card(DEFAULT_ROWS, INF, False, [])
    return Analysis(card, an.features, an.scopes, an.notes, an.group_ratios)
