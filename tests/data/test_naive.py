"""Naive drafts derived from gold SQL for benchmarks without them (bapsql/data/naive.py)."""

from __future__ import annotations

import pytest

from bapsql.data.naive import naive_from_gold


@pytest.mark.parametrize("gold,naive", [
    ("SELECT count(*) FROM head WHERE age > 56", "SELECT * FROM head WHERE age > 56"),
    ("SELECT max(budget), min(budget) FROM department", "SELECT budget FROM department"),
    ("SELECT name FROM t GROUP BY name ORDER BY count(*) DESC LIMIT 1", "SELECT name FROM t"),
    ("SELECT DISTINCT a.x FROM a JOIN b ON a.id = b.id WHERE b.y = 1 ORDER BY a.x LIMIT 3",
     "SELECT * FROM a JOIN b ON a.id = b.id WHERE b.y = 1"),
    ("SELECT avg(T1.x) FROM a AS T1 JOIN b AS T2 ON T1.id = T2.id WHERE T2.z = 'q'",
     "SELECT T1.x FROM a AS T1 JOIN b AS T2 ON T1.id = T2.id WHERE T2.z = 'q'"),
    ("SELECT a FROM t UNION SELECT b FROM u", ""),
    ("SELECT * FROM t", ""),  # already broad: no separate draft
    ("not sql at all (", ""),
])
def test_rules(gold, naive):
    assert naive_from_gold(gold) == naive


@pytest.mark.slow
def test_spider_tasks_carry_derived_drafts():
    from pathlib import Path

    root = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "spider_train"
    if not root.is_dir():
        pytest.skip("the Spider training data is not present")
    from bapsql.data.loaders import load_real

    bench = load_real(root, "spider")
    with_naive = [t for t in bench.tasks if t.naive_sql]
    assert len(with_naive) > 0.5 * len(bench.tasks)
