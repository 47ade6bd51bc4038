"""The rule-based deterministic rewriter: fixed rules, pure and deterministic."""

from __future__ import annotations

import sqlglot
from hypothesis import given, settings
from hypothesis import strategies as st

from bapsql.env.rewriter import MAX_K, affordable_rows, deterministic_rewrite


def test_broad_listing_becomes_count_over_same_rows():
    rw = deterministic_rewrite("SELECT * FROM orders o JOIN customers c ON o.customer_id = c.id WHERE o.amount > 5")
    assert rw.rule == "count_rows"
    assert rw.sql == "SELECT COUNT(*) FROM orders AS o JOIN customers AS c ON o.customer_id = c.id WHERE o.amount > 5"


def test_ordered_or_grouped_results_get_a_limit():
    assert deterministic_rewrite("SELECT a FROM t ORDER BY a", k=7).sql == "SELECT a FROM t ORDER BY a LIMIT 7"
    rw = deterministic_rewrite("SELECT a, COUNT(*) FROM t GROUP BY a", k=3)
    assert (rw.rule, rw.sql) == ("limit", "SELECT a, COUNT(*) FROM t GROUP BY a LIMIT 3")
    assert deterministic_rewrite("SELECT DISTINCT a FROM t", k=4).rule == "limit"


def test_large_limit_is_tightened_small_one_kept():
    assert deterministic_rewrite("SELECT a FROM t LIMIT 500", k=10).sql == "SELECT a FROM t LIMIT 10"
    kept = deterministic_rewrite("SELECT a FROM t LIMIT 3", k=10)
    assert (kept.rule, kept.sql) == ("unchanged", "SELECT a FROM t LIMIT 3")


def test_unparseable_or_compound_sql_is_left_unchanged():
    assert deterministic_rewrite("SELEC nothing ((").rule == "unchanged"
    assert deterministic_rewrite("SELECT a FROM t UNION SELECT b FROM u").rule == "unchanged"


def test_affordable_rows_uses_half_the_remaining_tokens_per_row():
    # 10 tokens per row at p95, 200 tokens left -> 100 usable -> 10 rows
    assert affordable_rows(est_rows_p95=50, est_tokens_p95=500, remaining_result_tokens=200) == 10
    assert affordable_rows(50, 500, 0) == 1
    assert affordable_rows(1, 1, 10**9) == MAX_K


_SQL = st.sampled_from([
    "SELECT * FROM t", "SELECT a, b FROM t WHERE a > 1", "SELECT a FROM t ORDER BY b DESC",
    "SELECT a, SUM(b) FROM t GROUP BY a", "SELECT a FROM t LIMIT 99", "SELECT COUNT(*) FROM t",
    "SELECT t.a FROM t JOIN u ON t.id = u.id WHERE u.x = 'q'",
])


@settings(max_examples=60, deadline=None)
@given(_SQL, st.integers(min_value=-5, max_value=500))
def test_rewrite_is_deterministic_parseable_and_bounded(sql, k):
    a, b = deterministic_rewrite(sql, k), deterministic_rewrite(sql, k)
    assert a == b
    tree = sqlglot.parse_one(a.sql, read="sqlite")
    if a.rule in ("limit", "tighten_limit"):
        assert int(tree.args["limit"].expression.this) == max(1, k)
    if a.rule == "count_rows":
        assert tree.sql(dialect="sqlite").startswith("SELECT COUNT(*)")
    if a.rule == "unchanged":
        assert a.sql == sql
