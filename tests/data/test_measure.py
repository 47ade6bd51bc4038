"""Unshielded query costs: the shield's charging contract, early stop at a token limit, budget fit checks."""

from __future__ import annotations

import sqlite3

import pytest

from bapsql.budgets import Budget
from bapsql.data.measure import TOKEN_ROWS, QueryCost, measure
from bapsql.db.rows import result_tokens
from bapsql.db.sandbox import Sandbox
from bapsql.tokens import load_token_counter

COUNTER = load_token_counter("regex")


@pytest.fixture()
def sb(tmp_path):
    path = tmp_path / "m.sqlite"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, word TEXT)")
    con.executemany("INSERT INTO t VALUES (?, ?)", [(i, f"w{i % 7}") for i in range(1, 1001)])
    con.commit()
    con.close()
    with Sandbox(path) as s:
        yield s


def test_small_results_are_charged_exactly_like_the_shield(sb):
    res = sb.query("SELECT id, word FROM t WHERE id <= 5")
    cost = measure(sb, "SELECT id, word FROM t WHERE id <= 5", COUNTER, vm_step_cap=10**6)
    assert cost.result_tokens == result_tokens(res.columns, res.rows, COUNTER)
    assert cost.rows == 5 and cost.vm_steps == res.vm_steps and not cost.partial and not cost.interrupted
    assert measure(sb, "SELECT id FROM t WHERE id < 0", COUNTER, vm_step_cap=10**6).result_tokens == 0


def test_large_results_extrapolate_and_token_limit_stops_early(sb):
    full = measure(sb, "SELECT id, word FROM t", COUNTER, vm_step_cap=10**7)
    assert full.rows == 1000 and full.partial and TOKEN_ROWS < 1000
    res = sb.query("SELECT id, word FROM t")
    exact = result_tokens(res.columns, res.rows, COUNTER)
    assert abs(full.result_tokens - exact) / exact < 0.1
    early = measure(sb, "SELECT id, word FROM t", COUNTER, vm_step_cap=10**7, token_limit=50)
    assert early.partial and 50 < early.result_tokens < 80 and early.rows < 20
    assert early.vm_steps < full.vm_steps


def test_vm_cap_and_fits(sb):
    capped = measure(sb, "SELECT COUNT(*) FROM t a, t b", COUNTER, vm_step_cap=5_000)
    assert capped.interrupted and capped.vm_steps <= 5_000
    b = Budget("X", context_tokens=1, queries=1, result_tokens=10, vm_steps=100, turns=1)
    assert QueryCost(1, 10, 100, False, False).fits(b)
    assert not QueryCost(1, 11, 100, False, False).fits(b)
    assert not QueryCost(1, 10, 101, False, False).fits(b)
    assert not QueryCost(1, 1, 1, True, False).fits(b)
    c = QueryCost(3, 4, 5, False, True)
    assert QueryCost.from_json(c.to_json()) == c
