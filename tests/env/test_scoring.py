"""Correctness comparator and evidence score (bapsql/env/scoring.py)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bapsql.env.evidence import EvidenceStore
from bapsql.env.scoring import (
    answer_from_rows,
    answer_shape_ok,
    answers_match,
    evidence_breakdown,
    evidence_score,
    is_ordered_sql,
)
from bapsql.types import Answer


def S(v):  # noqa: N802 - tiny constructor helpers keep the tables of cases readable
    return Answer("scalar", (v,))


def L(*vs):  # noqa: N802
    return Answer("list", vs)


def O(*vs):  # noqa: N802
    return Answer("ordered_list", vs)


@pytest.mark.parametrize(
    "pred, gold",
    [
        (S(42), S(42)),
        (S("42"), S(42)),
        (S(" 42 "), S(42.0)),
        (S("1,234"), S(1234)),
        (S(3.14), S(3.14159)),  # rounded to 2 decimals, within half a unit
        (S("0.333"), S(1 / 3)),
        (S(100000), S(100001)),  # relative tolerance 1e-4
        (S(1e-7), S(0)),  # absolute tolerance 1e-6
        (S("  New   York "), S("new york")),
        (S(None), S(None)),
        (S("NULL"), S(None)),
        (S(""), S(None)),
        (S(True), S(1)),
        (L(5), S(5)),  # a scalar gold vs a one-element list prediction
        (S(5), L(5)),
        (L("b", "a", "a"), L("a", "b", "a")),
        (O("a", "b"), O("a", "b")),
        (L(("x", 1), ("y", 2)), L(("y", 2.0), ("x", "1"))),
        (L(1.0, 2.5), L(2.5, 1)),
        (S((7,)), S(7)),  # a one-element row is its cell
    ],
)
def test_matches(pred, gold):
    assert answers_match(pred, gold)


@pytest.mark.parametrize(
    "pred, gold",
    [
        (S(43), S(42)),
        (S(3.1), S(3.14159)),  # one decimal: the rounding rule needs at least two
        (S(3.14), S(3.146)),  # outside half a unit of the last decimal
        (S("42a"), S(42)),
        (S("york"), S("new york")),
        (S(None), S(0)),
        (S("null"), S("nul")),
        (L("a", "b"), L("a", "b", "b")),  # multiset: multiplicities count
        (L("a", "a"), L("a", "b")),
        (O("b", "a"), O("a", "b")),  # order matters for ordered lists
        (L(1, 2), S(1)),
        (L(("x", 1)), L(("x", 1, 2))),
        (None, S(1)),
        (S(1), None),
        (S(float("nan")), S(1)),
        (Answer("scalar", ({"a": 1},)), S(1)),
        (Answer("list", ((1, (2, 3)),)), L((1, 2))),
        (Answer("scalar", (b"x",)), S("x")),
    ],
)
def test_mismatches(pred, gold):
    assert not answers_match(pred, gold)


def test_list_matching_is_a_maximum_matching_not_greedy():
    # 0.99996 matches both golds; greedily taking 1.0 would leave 1.00008 (which matches only 1.0) unpaired.
    gold = L(1.0, 0.99992)
    pred = L(0.99996, 1.00008)
    assert answers_match(pred, gold)


cells = st.one_of(
    st.integers(-10**6, 10**6),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    st.text(max_size=6),
    st.none(),
)


@settings(max_examples=80, deadline=None)
@given(st.lists(cells, min_size=1, max_size=8), st.randoms(use_true_random=False))
def test_list_is_permutation_invariant(values, rnd):
    perm = list(values)
    rnd.shuffle(perm)
    assert answers_match(Answer("list", tuple(perm)), Answer("list", tuple(values)))


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(-1000, 1000), min_size=2, max_size=8, unique=True))
def test_ordered_list_is_order_sensitive(values):
    gold = Answer("ordered_list", tuple(values))
    assert answers_match(Answer("ordered_list", tuple(values)), gold)
    assert not answers_match(Answer("ordered_list", tuple(reversed(values))), gold)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(cells, st.tuples(cells, cells)), min_size=1, max_size=6),
       st.sampled_from(["list", "ordered_list"]))
def test_reflexive(values, kind):
    a = Answer(kind, tuple(values))
    assert answers_match(a, a)
    if len(values) == 1:
        assert answers_match(Answer("scalar", (values[0],)), Answer("scalar", (values[0],)))


@settings(max_examples=200, deadline=None)
@given(st.floats(-1e6, 1e6), st.floats(-1e6, 1e6), st.floats(0, 1e-2), st.floats(0, 1e-2))
def test_tolerance_is_monotone(p, g, t1, t2):
    lo, hi = sorted((t1, t2))
    if answers_match(S(p), S(g), rel_tol=lo, abs_tol=lo):
        assert answers_match(S(p), S(g), rel_tol=hi, abs_tol=hi)


@given(st.floats(allow_nan=True, allow_infinity=True) | st.text() | st.binary() | st.none())
def test_never_raises(v):
    assert answers_match(S(v), S(v)) in (True, False)


def test_answer_shape():
    assert answer_shape_ok(L(("a", 1)), L(("b", 2), ("c", 3)))
    assert not answer_shape_ok(L("a"), L(("b", 2)))
    assert not answer_shape_ok(L(1, 2), S(1))


def test_answer_from_rows_and_order():
    assert answer_from_rows([(3,)], ordered=False) == S(3)
    assert answer_from_rows([(1,), (2,)], ordered=True) == O(1, 2)
    assert answer_from_rows([("a", 1)], ordered=False) == L(("a", 1))
    assert answer_from_rows([], ordered=False) == Answer("list", ())
    assert is_ordered_sql("SELECT a FROM t ORDER BY a")
    assert not is_ordered_sql("SELECT a FROM (SELECT a FROM t ORDER BY a)")
    assert not is_ordered_sql("this is not sql ((")


# ---------------------------------------------------------------------------------------------- evidence score


def _store(*blocks):
    store = EvidenceStore()
    for cols, rows, truncated in blocks:
        store.add(sql="SELECT 1", columns=cols, rows=rows, status="truncated" if truncated else "ok",
                  truncated=truncated, truncated_by="rows" if truncated else None,
                  rows_total=len(rows) + (5 if truncated else 0), result_tokens=10, turn=1)
    return store


def test_evidence_full_score_from_one_complete_block():
    store = _store((("n",), [(42,)], False))
    assert evidence_score(S(42), ["E1"], store) == 1.0


def test_evidence_no_citations_scores_zero():
    store = _store((("n",), [(42,)], False))
    assert evidence_score(S(42), [], store) == 0.0


def test_evidence_unknown_or_discarded_citation_loses_validity():
    store = _store((("n",), [(42,)], False))
    b = evidence_breakdown(S(42), ["E1", "E9"], store)
    assert b.valid_citations == 0 and b.provenance == 0 and b.support == 0.25
    store.apply("discard", "E1")
    b = evidence_breakdown(S(42), ["E1"], store)
    assert b.valid_citations == 0 and b.provenance == 0.25 and b.support == 0 and b.corroboration == 0


def test_evidence_support_only_from_visible_rows():
    store = _store((("n",), [(42,)], False))
    store.apply("archive", "E1")
    b = evidence_breakdown(S(42), ["E1"], store)
    assert (b.valid_citations, b.provenance, b.support, b.corroboration) == (0.25, 0.25, 0.0, 0.0)
    store.apply("restore", "E1")
    assert evidence_score(S(42), ["E1"], store) == 1.0


def test_evidence_truncated_block_needs_corroboration():
    store = _store((("name",), [("a",), ("b",)], True), (("name",), [("b",), ("a",)], True))
    one = evidence_breakdown(L("a", "b"), ["E1"], store)
    assert one.support == 0.25 and one.corroboration == 0.0
    two = evidence_breakdown(L("a", "b"), ["E1", "E2"], store)
    assert two.corroboration == 0.25


def test_evidence_partial_support_and_aggregates():
    store = _store((("x",), [(1,), (2,), (4,)], False))
    assert evidence_breakdown(L(1, 99), ["E1"], store).support == pytest.approx(0.125)
    # derivable aggregates of a complete visible block: count 3, sum 7, avg 7/3
    for v in (3, 7, 7 / 3):
        assert evidence_breakdown(S(v), ["E1"], store).support == 0.25
    trunc = _store((("x",), [(1,), (2,), (4,)], True))
    assert evidence_breakdown(S(7), ["E1"], trunc).support == 0.0


def test_evidence_tuple_values_need_one_row():
    store = _store((("name", "n"), [("a", 1), ("b", 2)], False))
    assert evidence_breakdown(L(("a", 1)), ["E1"], store).support == 0.25
    assert evidence_breakdown(L(("a", 2)), ["E1"], store).support == 0.0


def test_evidence_score_bounds_and_determinism():
    store = _store((("x",), [(1,), (2,)], False), (("x",), [(2,)], True))
    scores = {evidence_score(L(1, 2), ["E1", "E2"], store) for _ in range(3)}
    assert len(scores) == 1 and 0.0 <= scores.pop() <= 1.0
    assert evidence_score(None, ["E1"], store) == 0.5
    assert not math.isnan(evidence_score(S(float("nan")), ["E1"], store))
