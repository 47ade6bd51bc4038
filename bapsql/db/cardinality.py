"""Shape analysis of one SELECT with sqlglot + catalog statistics: output rows (p50 and a hard upper bound), output
column widths, and the per-scope join model the VM-step model walks.

Contract: `analyze(sql, catalog)` never raises for SQL sqlglot cannot parse or for unknown tables/columns: it falls
back to documented defaults and says so in ``Analysis.notes``. Estimates are System-R style:
- base rows from the catalog (views and CTEs are analyzed as subqueries); unknown tables get `DEFAULT_ROWS`;
- one predicate's (and an equi-join's) selectivity as `bapsql.db.predicates` describes; the predicates on one table
  combine with exponential backoff and join predicates multiply, as `bapsql.db.scope` describes;
- GROUP BY / DISTINCT: D = product of the keys' distinct counts per table (a unique key makes the table's other keys
  redundant), then the occupancy formula D·(1 − exp(−R/D)) for R input rows; an aggregate without GROUP BY is 1 row;
- LIMIT/OFFSET clip; UNION ALL adds, UNION/INTERSECT/EXCEPT use fixed overlaps.
Upper bounds (``ub``) are hard where the catalog is exact: table sizes, products, equality on a unique key, LIMIT,
GROUP BY over exact distinct counts, one row for an ungrouped aggregate.

This module holds `analyze`, its results (`Analysis`, `Card`) and the `Analyzer`'s walk over queries, set operations,
SELECTs and FROM items. The rest of the Analyzer lives in the two modules it builds on:
- `bapsql.db.scope`: the join model (`Rel`, `Conjunct`, `Scope`) and the `Columns` mixin (column resolution,
  constants, output-column shapes, distinct counts of GROUP BY / DISTINCT keys);
- `bapsql.db.predicates`: the `Predicates` mixin (WHERE / ON conjuncts and their selectivities) and the small sqlglot
  helpers the walk shares.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import sqlglot
from sqlglot import exp

from bapsql.db.catalog import Catalog
from bapsql.db.predicates import Predicates, _alias, _conjuncts, _int_arg, _is_agg
from bapsql.db.rows import cell_text
from bapsql.db.scope import DEFAULT_WIDTH, INF, Columns, Rel, Scope, _lit
from bapsql.db.selectivity import ColRef, occupancy, ref_from_stats

DEFAULT_ROWS = 1000.0
SEL_HAVING = 1 / 3


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


class Analyzer(Columns, Predicates):
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

    # -- bounds ----------------------------------------------------------------------------------------------------
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


def _clip(card: Card, lim: int | None, off: int | None) -> Card:
    rows, ub = card.rows, card.ub
    if off:
        rows, ub = max(0.0, rows - off), max(0.0, ub - off)
    if lim is not None and lim >= 0:
        rows, ub = min(rows, lim), min(ub, lim)
    return Card(rows, ub, card.exact, card.cols)


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
