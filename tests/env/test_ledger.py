"""One test per ledger rule (bapsql/env/ledger.py)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bapsql.budgets import Budget, get_budget
from bapsql.env.ledger import Ledger
from bapsql.errors import BudgetBreach

XS = get_budget("XS")


def test_context_is_a_level_archive_restores_headroom():
    led = Ledger(XS)
    led.set_context(1500)
    led.set_context(2100)  # rows entered the context
    assert led.remaining().context_tokens == 300
    led.set_context(1600)  # archive replaced the rows by a stub: the level goes down
    assert led.spent().context_tokens == 1600
    assert led.remaining().context_tokens == 800
    assert led.peak_context == 2100
    assert led.feasible


def test_queries_are_cumulative_never_refunded():
    led = Ledger(get_budget("S"))
    led.charge_execution(vm_steps=10, result_tokens=5)
    led.set_context(10)  # nothing about the context refunds cumulative channels
    led.charge_execution(vm_steps=10, result_tokens=5)
    assert led.spent().queries == 2 and led.remaining().queries == 0
    assert led.spent().result_tokens == 10 and led.spent().vm_steps == 20


def test_preflight_rejection_costs_turn_not_query():
    led = Ledger(XS)
    led.consume_turn()
    led.record_rejection()
    s = led.spent()
    assert (s.turns, s.queries, s.vm_steps, s.result_tokens) == (1, 0, 0, 0)
    assert led.rejections == 1


def test_restore_charges_result_tokens_again():
    led = Ledger(XS)
    led.charge_execution(vm_steps=100, result_tokens=30)
    led.charge_restore(result_tokens=30)
    assert led.spent().result_tokens == 60
    assert led.spent().queries == 1  # restoring is not a query


def test_estimate_costs_vm_steps_not_query():
    led = Ledger(XS)
    led.charge_probe(vm_steps=1234)
    assert led.spent().vm_steps == 1234
    assert led.spent().queries == 0 and led.spent().result_tokens == 0


def test_rewrite_costs_vm_steps_not_query_and_is_counted():
    led = Ledger(XS)
    led.charge_probe(vm_steps=50)
    led.record_rewrite()
    assert led.rewrites == 1 and led.spent().queries == 0 and led.spent().vm_steps == 50


def test_every_action_costs_a_turn():
    led = Ledger(XS)
    for _ in range(XS.turns):
        led.consume_turn()
    assert led.remaining().turns == 0 and led.feasible
    led.consume_turn()
    assert not led.feasible


def test_invalid_action_costs_a_turn_and_is_counted():
    led = Ledger(XS)
    led.consume_turn()
    led.record_invalid_action()
    assert led.spent().turns == 1 and led.invalid_actions == 1


def test_total_tokens_are_reported_never_subtracted():
    led = Ledger(XS)
    led.charge_prompt(500)
    led.charge_completion(40)
    led.charge_execution(vm_steps=1, result_tokens=20)
    led.charge_controller(7)
    assert led.total_tokens == 567
    assert led.remaining().result_tokens == XS.result_tokens - 20  # only the result channel is a budget


def test_caps_are_the_remaining_budget_and_context_headroom():
    led = Ledger(XS)
    led.charge_execution(vm_steps=1000, result_tokens=30)
    led.set_context(2350)
    caps = led.caps(context_reserve=10, rows=50, bytes=999)
    assert caps.vm_steps == XS.vm_steps - 1000
    assert caps.result_tokens == 40  # min(80 - 30, 2400 - 2350 - 10)
    assert (caps.rows, caps.bytes) == (50, 999)
    led.set_context(1000)
    assert led.caps().result_tokens == 50


def test_overspend_is_recorded_as_breach_and_audit_raises():
    led = Ledger(XS)
    led.charge_execution(vm_steps=1, result_tokens=1)
    led.charge_execution(vm_steps=1, result_tokens=1)  # XS allows one query
    assert not led.feasible and led.breaches == ("queries 2 > 1",)
    assert led.remaining().queries == 0  # floored, never negative
    with pytest.raises(BudgetBreach, match="queries 2 > 1"):
        led.audit()


def test_snapshot_is_immutable_and_serializable():
    led = Ledger(XS)
    led.record_warning()
    snap = led.snapshot()
    led.record_warning()
    assert snap.warnings == 1 and led.snapshot().warnings == 2
    d = snap.to_dict()
    assert d["budget"]["queries"] == 1 and d["remaining"]["turns"] == XS.turns and d["breaches"] == []


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["exec", "probe", "restore", "ctx"]), st.integers(0, 500)), max_size=20))
def test_spent_plus_remaining_is_budget_while_feasible(ops):
    b = Budget("T", context_tokens=3000, queries=50, result_tokens=20000, vm_steps=20000, turns=5)
    led = Ledger(b)
    for op, n in ops:
        if op == "exec":
            led.charge_execution(vm_steps=n, result_tokens=n)
        elif op == "probe":
            led.charge_probe(vm_steps=n)
        elif op == "restore":
            led.charge_restore(result_tokens=n)
        else:
            led.set_context(n)
    if led.feasible:
        s, r = led.spent(), led.remaining()
        for ch in ("queries", "result_tokens", "vm_steps", "turns", "context_tokens"):
            assert getattr(s, ch) + getattr(r, ch) == getattr(b, ch)
