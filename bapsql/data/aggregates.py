"""The aggregate a question asks for, read from its gold SQL (sqlglot, SQLite dialect).

- `question_aggregate(gold_sql)`: ``(kind, column, decimals)`` with kind in count / max / min / avg / mode when the
  gold query is one aggregate a whole-result profile can show (``SELECT COUNT(*) ...``, ``SELECT ROUND(AVG(x), 2)
  ...``, the argmax of a count ``SELECT x ... GROUP BY x ORDER BY COUNT(*) DESC LIMIT 1``); None otherwise. What
  `scripted.drafter` reads a profile by.
- `aggregate_kind(gold_sql, answer_kind)`: the coarse class the analysis splits results by, one of
  `AGGREGATE_KINDS`: ``count`` (any COUNT, DISTINCT included), ``min/max``, ``avg``, ``mode``, ``list`` (list and
  ordered-list answers), ``other`` (every other scalar: SUM, ratios, lookups, SQL that does not parse).

Pure functions, no I/O.
"""

from __future__ import annotations

import sqlglot
from sqlglot import exp

AGGREGATE_KINDS: tuple[str, ...] = ("count", "min/max", "avg", "mode", "list", "other")
_KINDS = {exp.Count: "count", exp.Max: "max", exp.Min: "min", exp.Avg: "avg"}


def _parse(sql: str) -> exp.Expression | None:
    try:
        return sqlglot.parse_one(sql, read="sqlite")
    except (sqlglot.errors.ParseError, sqlglot.errors.TokenError, ValueError):
        return None


def question_aggregate(gold_sql: str) -> tuple[str, str | None, int | None] | None:
    """The question's aggregate as (kind, column, decimals) (module docstring); None when the gold query is not one
    aggregate a profile can show."""
    tree = _parse(gold_sql)
    if not isinstance(tree, exp.Select) or len(tree.expressions) != 1:
        return None
    node = tree.expressions[0].unalias()
    decimals = None
    if isinstance(node, exp.Round):
        d = node.args.get("decimals")
        decimals = int(d.name) if isinstance(d, exp.Literal) and d.is_int else 0
        node = node.this
    group = tree.args.get("group")
    if group is not None:  # argmax of a count: SELECT x ... GROUP BY x ORDER BY COUNT(*) DESC LIMIT 1
        order = tree.args.get("order")
        if (isinstance(node, exp.Column) and order is not None and len(order.expressions) == 1
                and isinstance(order.expressions[0].this, exp.Count) and order.expressions[0].args.get("desc")):
            return "mode", node.name, None
        return None
    for cls, kind in _KINDS.items():
        if isinstance(node, cls):
            arg = node.this
            if isinstance(arg, exp.Distinct):
                return None
            column = arg.name if isinstance(arg, exp.Column) else None
            if kind != "count" and column is None:
                return None
            return kind, column, decimals
    return None


def aggregate_kind(gold_sql: str, answer_kind: str | None = None) -> str:
    """The class of ``gold_sql``'s question (module docstring); ``answer_kind`` is the task's typed gold kind
    (``scalar`` / ``list`` / ``ordered_list``; None: unknown, read from the SQL alone)."""
    if answer_kind in ("list", "ordered_list"):
        return "list"
    agg = question_aggregate(gold_sql)
    if agg is not None:
        return "min/max" if agg[0] in ("min", "max") else agg[0]
    tree = _parse(gold_sql)
    if isinstance(tree, exp.Select) and len(tree.expressions) == 1 and tree.args.get("group") is None:
        node = tree.expressions[0].unalias()
        node = node.this if isinstance(node, exp.Round) else node
        for cls, kind in _KINDS.items():
            if isinstance(node, cls):
                return "min/max" if kind in ("min", "max") else kind
    return "other"
