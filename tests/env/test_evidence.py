"""Evidence store transitions and profiles (bapsql/env/evidence.py)."""

from __future__ import annotations

import pytest

from bapsql.env.evidence import EvidenceStore, Profile, normalize_ref


def _add(store, rows, *, truncated=False, cols=("name", "n")):
    return store.add(sql="SELECT name, n FROM t", columns=cols, rows=rows, status="truncated" if truncated else "ok",
                     truncated=truncated, truncated_by="rows" if truncated else None,
                     rows_total=None if not truncated else 99, result_tokens=12, turn=2)


def test_refs_are_sequential_and_lookup_normalizes():
    store = EvidenceStore()
    a, b = _add(store, [("x", 1)]), _add(store, [("y", 2)])
    assert (a.ref, b.ref) == ("E1", "E2")
    assert store.get(" e2 ") is b and store.get("E3") is None and store.get("bogus") is None
    assert normalize_ref("E0") is None and normalize_ref(3) is None


@pytest.mark.parametrize(
    "ops, final",
    [
        (["archive"], "archived"),
        (["compress"], "compressed"),
        (["archive", "restore"], "visible"),
        (["compress", "restore"], "visible"),
        (["archive", "compress"], "compressed"),
        (["compress", "archive"], "archived"),
        (["archive", "discard"], "discarded"),
    ],
)
def test_allowed_transitions(ops, final):
    store = EvidenceStore()
    _add(store, [("x", 1)])
    for op in ops:
        assert store.apply(op, "E1").ok
    assert store.get("E1").state == final


@pytest.mark.parametrize(
    "ops, refused, why",
    [
        ([], "restore", "already visible"),
        (["archive"], "archive", "already archived"),
        (["compress"], "compress", "already compressed"),
        (["discard"], "restore", "discarded for good"),
        (["discard"], "discard", "discarded for good"),
    ],
)
def test_refused_transitions_change_nothing(ops, refused, why):
    store = EvidenceStore()
    _add(store, [("x", 1)])
    for op in ops:
        store.apply(op, "E1")
    before = store.get("E1")
    res = store.apply(refused, "E1")
    assert not res.ok and why in res.message
    assert store.get("E1") == before


def test_unknown_ref_and_op_are_refused():
    store = EvidenceStore()
    assert "no evidence block" in store.apply("archive", "E1").message
    _add(store, [("x", 1)])
    assert "unknown operation" in store.apply("delete", "E1").message


def test_visible_rows_only_when_visible():
    store = EvidenceStore()
    _add(store, [("x", 1), ("y", 2)])
    assert store.get("E1").visible_rows == (("x", 1), ("y", 2))
    for op in ("archive", "compress", "discard"):
        s2 = EvidenceStore()
        _add(s2, [("x", 1)])
        s2.apply(op, "E1")
        assert s2.get("E1").visible_rows == ()


def test_profile_is_deterministic_summary():
    rows = [("b", 3), ("a", None), ("b", 10), (None, 2.5)]
    p = Profile.of(("name", "n"), rows, truncated=True, rows_total=40)
    assert p == Profile.of(("name", "n"), list(rows), truncated=True, rows_total=40)
    name, n = p.columns
    assert (name.nulls, name.distinct, name.min, name.max, name.first) == (1, 2, "a", "b", ("b", "a"))
    assert (n.nulls, n.distinct, n.min, n.max) == (1, 3, 2.5, 10)
    text = p.render()
    assert text.splitlines()[0] == "4 of 40 rows (truncated)"
    assert "name: 2 distinct; 1 null; min a max b; first b, a" in text
