"""Correctness comparator (bapsql/env/scoring.py) and evidence score (bapsql/env/evidence_score.py)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bapsql.env.evidence import EvidenceStore
from bapsql.env.evidence_score import (
    citation_precision,
    evidence_breakdown,
    evidence_score,
    independent,
    normalize_sql,
    rows_signature,
)
from bapsql.env.scoring import answer_from_rows, answer_shape_ok, answers_match, is_ordered_sql
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
    """Blocks as (columns, rows, truncated) or (columns, rows, truncated, sql); the SQL defaults to one per block,
    so blocks differ in SQL unless a test says otherwise."""
    store = EvidenceStore()
    for i, (cols, rows, truncated, *sql) in enumerate(blocks):
        store.add(sql=sql[0] if sql else f"SELECT {cols[0]} FROM t{i + 1}", columns=cols, rows=rows,
                  status="truncated" if truncated else "ok", truncated=truncated,
                  truncated_by="rows" if truncated else None, rows_total=len(rows) + (5 if truncated else 0),
                  result_tokens=10, turn=1)
    return store


def _parts(b):
    return (b.valid_citations, b.provenance, b.support, b.corroboration, b.precision)


def test_evidence_one_complete_block_supports_but_does_not_corroborate():
    store = _store((("n",), [(42,)], False))
    b = evidence_breakdown(S(42), ["E1"], store)
    assert _parts(b) == (0.25, 0.25, 0.25, 0.0, 1.0) and b.total == 0.75
    assert evidence_score(S(42), ["E1"], store) == 0.75


def test_evidence_no_citations_scores_zero():
    store = _store((("n",), [(42,)], False))
    assert evidence_score(S(42), [], store) == 0.0


def test_evidence_unknown_or_discarded_citation_loses_validity():
    store = _store((("n",), [(42,)], False))
    b = evidence_breakdown(S(42), ["E1", "E9"], store)
    assert b.valid_citations == 0 and b.provenance == 0 and b.support == 0.25
    assert b.precision == 0.5 and b.total == 0.125  # the unknown id is a cited result that supports nothing
    store.apply("discard", "E1")
    b = evidence_breakdown(S(42), ["E1"], store)
    assert b.valid_citations == 0 and b.provenance == 0.25 and b.support == 0 and b.corroboration == 0


def test_evidence_support_only_from_visible_rows():
    store = _store((("n",), [(42,)], False))
    store.apply("archive", "E1")
    b = evidence_breakdown(S(42), ["E1"], store)
    assert (b.valid_citations, b.provenance, b.support, b.corroboration) == (0.25, 0.25, 0.0, 0.0)
    store.apply("restore", "E1")
    assert evidence_score(S(42), ["E1"], store) == 0.75


def test_evidence_corroboration_needs_an_independent_block():
    # the count 3 is a cell of E1 and the row count of the complete detail block E2: two different results
    store = _store((("n",), [(3,)], False, "SELECT COUNT(*) FROM t"),
                   (("x",), [(1,), (2,), (4,)], False, "SELECT x FROM t"),
                   (("n",), [(3,)], False, "select  count(*)\nFROM t ;"),  # E1 again, other layout
                   (("n",), [(3,)], False, "SELECT * FROM (SELECT COUNT(*) FROM t) AS corroboration"))
    assert _parts(evidence_breakdown(S(3), ["E1", "E2"], store)) == (0.25, 0.25, 0.25, 0.25, 1.0)
    assert evidence_score(S(3), ["E1", "E2"], store) == 1.0
    assert evidence_score(S(3), ["E1", "E3"], store) == 0.75  # the same SQL twice
    assert evidence_score(S(3), ["E1", "E4"], store) == 0.75  # a cosmetic rewrite with the same rows
    assert evidence_score(S(3), ["E1", "E3", "E4"], store) == 0.75


def test_evidence_truncations_of_one_query_do_not_corroborate():
    store = _store((("name",), [("a",), ("b",)], True, "SELECT name FROM p"),
                   (("name",), [("b",), ("c",)], True, "SELECT name FROM p;"),
                   (("name",), [("b",), ("a",), ("d",)], True, "SELECT name FROM p ORDER BY name"))
    one = evidence_breakdown(L("a", "b"), ["E1"], store)
    assert one.support == 0.25 and one.corroboration == 0.0
    assert evidence_breakdown(L("a", "b"), ["E1", "E2"], store).corroboration == 0.0  # same SQL, other rows
    three = evidence_breakdown(L("a", "b"), ["E1", "E3"], store)  # other SQL and other rows: independent
    assert three.corroboration == 0.25 and three.total == 1.0


def test_evidence_unsupporting_citations_lower_precision():
    store = _store((("n",), [(42,)], False), (("n",), [(99,)], False), (("m",), [(7,)], False))
    assert evidence_breakdown(S(42), ["E1", "E2"], store).precision == 0.5
    assert evidence_score(S(42), ["E1", "E2"], store) == pytest.approx(0.5 * 0.75)
    assert evidence_score(S(42), ["E1", "E2", "E3"], store) == pytest.approx(0.75 / 3)
    b = evidence_breakdown(S(42), ["E2"], store)  # valid, ran fine, supports nothing
    assert _parts(b) == (0.25, 0.25, 0.0, 0.0, 0.0) and b.total == 0.0


def test_evidence_partial_corroboration_is_a_share():
    store = _store((("x",), [(1,), (2,)], False, "SELECT x FROM a"), (("x",), [(1,)], False, "SELECT x FROM a WHERE x = 1"))
    b = evidence_breakdown(L(1, 2), ["E1", "E2"], store)
    assert _parts(b) == (0.25, 0.25, 0.25, 0.125, 1.0) and b.total == 0.875


def test_evidence_empty_answer():
    store = _store((("x",), [], False), (("x",), [(5,)], False))
    assert _parts(evidence_breakdown(L(), ["E1"], store)) == (0.25, 0.25, 0.25, 0.0, 1.0)
    assert evidence_breakdown(L(), ["E1", "E2"], store).precision == 0.5


def test_independence_and_its_parts():
    store = _store((("n",), [(1,), (2,)], False, "SELECT a FROM t"), (("m",), [(2,), (1.0,)], False, "SELECT b FROM t"),
                   (("n",), [(3,)], False, "SELECT  a FROM t;"))
    e1, e2, e3 = store.blocks
    assert normalize_sql("SELECT  a\nFROM t ;") == normalize_sql("select a from t") == "select a from t"
    assert rows_signature(e1.rows) == rows_signature(e2.rows)  # order, column names and 1 vs 1.0 do not matter
    assert not independent(e1, e2) and not independent(e1, e3) and independent(e2, e3)
    assert citation_precision([], set()) == 0.0 and citation_precision(["a", "b", "a"], {"a"}) == 0.5


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
    assert evidence_score(None, ["E1"], store) == 0.0
    assert evidence_breakdown(None, ["E1"], store).valid_citations == 0.25
    assert not math.isnan(evidence_score(S(float("nan")), ["E1"], store))


# Random stores: blocks over three SQL texts with small integer rows, some archived or discarded.
_block = st.tuples(st.integers(0, 2), st.lists(st.integers(0, 5), max_size=4), st.booleans(),
                   st.sampled_from(["visible", "visible", "archived", "discarded"]))
_answers = st.one_of(st.integers(0, 6).map(S), st.lists(st.integers(0, 6), min_size=1, max_size=3).map(lambda v: L(*v)))


def _random_store(blocks):
    store = EvidenceStore()
    for sql_id, rows, truncated, _ in blocks:
        _add(store, f"SELECT v FROM t{sql_id}", [(v,) for v in rows], truncated)
    for i, (*_, state) in enumerate(blocks):
        if state != "visible":
            store.apply("archive" if state == "archived" else "discard", f"E{i + 1}")
    return store


def _add(store, sql, rows, truncated):
    return store.add(sql=sql, columns=("v",), rows=rows, status="truncated" if truncated else "ok",
                     truncated=truncated, truncated_by="rows" if truncated else None, rows_total=len(rows),
                     result_tokens=5, turn=1)


@given(st.lists(_block, min_size=1, max_size=5), _answers, st.data())
@settings(max_examples=300, deadline=None)
def test_adding_a_citation_that_supports_nothing_never_raises_e(blocks, answer, data):
    store = _random_store(blocks)
    refs = [b.ref for b in store.blocks]
    cited = data.draw(st.lists(st.sampled_from(refs), max_size=4))
    extra = data.draw(st.sampled_from(refs + ["E99"]))
    if extra != "E99" and evidence_breakdown(answer, [extra], store).support > 0:
        return  # the extra block supports a value: not the case under test
    before = evidence_breakdown(answer, cited, store)
    after = evidence_breakdown(answer, cited + [extra], store)
    assert after.total <= before.total + 1e-12
    assert 0.0 <= after.total <= 1.0 and after.corroboration <= before.corroboration + 1e-12


@given(st.lists(_block, min_size=1, max_size=5), _answers, st.data())
@settings(max_examples=300, deadline=None)
def test_duplicating_a_block_never_adds_corroboration(blocks, answer, data):
    store = _random_store(blocks)
    refs = [b.ref for b in store.blocks]
    cited = data.draw(st.lists(st.sampled_from(refs), min_size=1, max_size=4))
    original = store.get(data.draw(st.sampled_from(refs)))
    before = evidence_breakdown(answer, cited + [original.ref], store)
    layout = data.draw(st.sampled_from(["", " ", ";", "\n"]))  # the same SQL, however laid out
    dup = _add(store, original.sql.lower() + layout, list(reversed(original.rows)), original.truncated)
    if original.state != "visible":
        store.apply("archive" if original.state == "archived" else "discard", dup.ref)
    after = evidence_breakdown(answer, cited + [original.ref, dup.ref], store)
    assert after.corroboration == before.corroboration
    assert after.total == pytest.approx(before.total)
