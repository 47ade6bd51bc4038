"""The rule-based deterministic rewriter (the "deterministic rewrite" intervention of paper Table 4).

Where a learned or scripted policy would choose its own evidence query after an estimator warning, this rewriter
applies fixed, question-blind rules to the warned SQL. It is pure (sqlglot only) and deterministic:

1. ``count_rows``: a broad row listing (no aggregate, no GROUP BY, no DISTINCT, no LIMIT, no ORDER BY) becomes
   ``SELECT COUNT(*)`` over the same FROM / JOIN / WHERE.
2. ``limit``: anything else without a LIMIT (ordered listings, GROUP BY results, DISTINCT lists) gets ``LIMIT k``.
3. ``tighten_limit``: a literal LIMIT above ``k`` is lowered to ``k``.
4. ``unchanged``: SQL that does not parse as one SELECT, or already has LIMIT ≤ k, is returned as is.

``k`` is the number of rows the remaining result-token budget affords at half use, from the estimate's tokens per
row (`affordable_rows`), clamped to [1, 50]; 10 when no estimate is given.
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlglot
from sqlglot import exp

DEFAULT_K = 10
MAX_K = 50


@dataclass(frozen=True)
class Rewrite:
    """One rewrite decision: the new SQL, the rule that produced it and a one-line reason."""

    sql: str
    rule: str  # count_rows | limit | tighten_limit | unchanged
    reason: str


def affordable_rows(est_rows_p95: float, est_tokens_p95: float, remaining_result_tokens: int) -> int:
    """Rows that fit in half the remaining result tokens, at the estimate's p95 tokens per row; in [1, MAX_K]."""
    per_row = est_tokens_p95 / max(est_rows_p95, 1.0) if est_tokens_p95 > 0 else 8.0
    k = int((0.5 * max(remaining_result_tokens, 0)) // max(per_row, 1.0))
    return max(1, min(MAX_K, k))


def _literal_limit(tree: exp.Select) -> int | None:
    lim = tree.args.get("limit")
    if lim is None:
        return None
    val = lim.expression if isinstance(lim, exp.Limit) else None
    if isinstance(val, exp.Literal) and not val.is_string:
        try:
            return int(val.this)
        except ValueError:
            return None
    return None


def _parse(sql: str) -> exp.Expression | None:
    """``sql`` parsed as SQLite, or None when it does not parse."""
    try:
        return sqlglot.parse_one(sql, read="sqlite")
    except (sqlglot.errors.ParseError, sqlglot.errors.TokenError, ValueError):
        return None


def _has_aggregate(tree: exp.Select) -> bool:
    """Whether the projection holds an aggregate function."""
    return any(e.find(exp.AggFunc) is not None for e in tree.expressions)


def deterministic_rewrite(sql: str, k: int = DEFAULT_K) -> Rewrite:
    """Rewrite `sql` by the fixed rules above with row allowance `k` (see module docstring)."""
    k = max(1, int(k))
    tree = _parse(sql)
    if tree is None:
        return Rewrite(sql, "unchanged", "the query does not parse; left unchanged")
    if not isinstance(tree, exp.Select):
        return Rewrite(sql, "unchanged", "not a single SELECT; left unchanged")
    broad = (
        not _has_aggregate(tree)
        and not tree.args.get("group")
        and not tree.args.get("distinct")
        and tree.args.get("limit") is None
        and tree.args.get("order") is None
        and (tree.args.get("from_") or tree.args.get("from")) is not None
    )
    if broad:
        new = tree.copy()
        new.set("expressions", [exp.Count(this=exp.Star())])
        return Rewrite(new.sql(dialect="sqlite"), "count_rows", "broad row listing replaced by a COUNT(*) aggregate")
    current = _literal_limit(tree)
    if tree.args.get("limit") is None:
        return Rewrite(tree.limit(k).sql(dialect="sqlite"), "limit", f"unbounded result capped with LIMIT {k}")
    if current is not None and current > k:
        return Rewrite(tree.limit(k).sql(dialect="sqlite"), "tighten_limit", f"LIMIT {current} lowered to {k}")
    return Rewrite(sql, "unchanged", "already bounded; left unchanged")
