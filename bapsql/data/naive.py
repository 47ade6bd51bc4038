"""Naive (broad) drafts derived from gold SQL, for benchmarks that carry none (BIRD, Spider).

`scripted.drafter` first drafts "the obvious broad query" an agent writes to look at the data before aggregating.
The embedded generator writes one per task; real benchmarks do not, so `naive_from_gold` derives it from the gold
query with fixed rules (sqlglot, SQLite dialect), keeping the FROM / JOIN / WHERE so the draft reads the same rows:

- one aggregate over a column or ``*``, no GROUP BY (``SELECT MAX(x) FROM t WHERE ...``) → the aggregated column, or
  ``*`` for ``COUNT(*)`` (``SELECT x FROM t WHERE ...``);
- a GROUP BY query → its grouping columns and aggregated columns, ungrouped, without HAVING / ORDER BY / LIMIT;
- a plain listing → ``SELECT *`` over the same FROM / WHERE, without DISTINCT / ORDER BY / LIMIT;
- set operations, nested aggregates or SQL that does not parse → no draft ("" : the gold query is drafted).

The draft is returned only when it differs from the gold query.
"""

from __future__ import annotations

import sqlglot
from sqlglot import exp

_AGGS = (exp.Count, exp.Max, exp.Min, exp.Avg, exp.Sum)


def _agg_args(node: exp.Expression) -> list[exp.Expression]:
    out = []
    for agg in node.find_all(*_AGGS):
        arg = agg.this
        if isinstance(arg, exp.Distinct):
            arg = arg.expressions[0] if arg.expressions else None
        if isinstance(arg, exp.Column):
            out.append(arg.copy())
    return out


def naive_from_gold(gold_sql: str) -> str:
    """The broad draft of ``gold_sql`` (module docstring), or "" when no rule applies."""
    try:
        tree = sqlglot.parse_one(gold_sql, read="sqlite")
    except (sqlglot.errors.ParseError, sqlglot.errors.TokenError):
        return ""
    if not isinstance(tree, exp.Select) or tree.args.get("with") or not (tree.args.get("from") or tree.args.get("from_")):
        return ""
    draft = tree.copy()
    for key in ("order", "limit", "offset", "having", "distinct"):
        draft.set(key, None)
    projections = [p.unalias() for p in tree.expressions]
    has_agg = any(p.find(*_AGGS) for p in projections)
    if tree.args.get("group"):
        cols = [g.copy() for g in tree.args["group"].expressions if isinstance(g, exp.Column)]
        cols += [c for p in projections for c in _agg_args(p)]
        if not cols:
            return ""
        draft.set("group", None)
        draft.set("expressions", list({c.sql(): c for c in cols}.values()))
    elif has_agg:
        args = [c for p in projections for c in _agg_args(p)]
        draft.set("expressions", list({c.sql(): c for c in args}.values()) or [exp.Star()])
    else:
        draft.set("expressions", [exp.Star()])
    if any(isinstance(n, (exp.Union, exp.Intersect, exp.Except)) for n in tree.walk()):
        return ""
    sql = draft.sql(dialect="sqlite")
    return "" if sql.strip() == gold_sql.strip() else sql
