"""One-shot transition analysis: partition by the reference; rescued / regressed / additional per level."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hst
from hypothesis.extra.numpy import arrays

from bapsql.analysis.transitions import median_seed, partition_tasks, transition_analysis, transition_counts
from tests.analysis.helpers import LADDER, episodes_table


def _loop_counts(ref: np.ndarray, oth: np.ndarray) -> dict[str, list[int]]:
    """Slow reference: classify each task, then count each level task by task."""
    out = {"rescued": [], "regressed": [], "additional": []}
    groups = []
    for t in range(ref.shape[0]):
        if ref[t].all():
            groups.append("always")
        elif ref[t, -1]:
            groups.append("sensitive")
        else:
            groups.append("persistent")
    for lv in range(ref.shape[1]):
        res = reg = add = 0
        for t in range(ref.shape[0]):
            if ref[t, lv] and not oth[t, lv]:
                reg += 1
            if not ref[t, lv] and oth[t, lv]:
                if groups[t] == "sensitive":
                    res += 1
                elif groups[t] == "persistent":
                    add += 1
        out["rescued"].append(res)
        out["regressed"].append(reg)
        out["additional"].append(add)
    return out


@given(data=hst.data(), t=hst.integers(1, 30))
@settings(max_examples=60, deadline=None)
def test_counts_match_loop_and_net_is_the_success_difference(data, t):
    ref = data.draw(arrays(bool, (t, 4)))
    oth = data.draw(arrays(bool, (t, 4)))
    counts = transition_counts(ref, oth)
    loop = _loop_counts(ref, oth)
    for key in ("rescued", "regressed", "additional"):
        assert list(counts[key]) == loop[key]
    assert list(counts["net"]) == list(oth.sum(axis=0) - ref.sum(axis=0))
    assert (counts["rescued"][-1] == 0)  # budget-sensitive tasks are correct at L by definition


def test_partition_tasks():
    ref = np.array([[1, 1, 1, 1], [0, 1, 1, 1], [1, 0, 0, 1], [1, 1, 1, 0], [0, 0, 0, 0]], dtype=bool)
    assert list(partition_tasks(ref)) == [0, 1, 1, 2, 2]


def _rows(method, seed, table):
    return [dict(method=method, budget=lv, seed=seed, task_id=task, success=bool(v))
            for task, vals in table.items() for lv, v in zip(LADDER, vals)]


def test_transition_analysis_on_logs_per_seed_and_median():
    ref = {"a": (1, 1, 1, 1), "b": (0, 0, 1, 1), "c": (0, 0, 0, 0), "d": (1, 1, 1, 1)}
    seed0 = {"a": (1, 1, 1, 1), "b": (1, 1, 1, 1), "c": (1, 0, 0, 0), "d": (0, 1, 1, 1)}  # XS: +1 +1 -1 → net +1
    seed1 = {"a": (0, 1, 1, 1), "b": (0, 1, 1, 1), "c": (0, 0, 0, 0), "d": (0, 1, 1, 1)}  # XS net -2
    seed2 = {"a": (1, 1, 1, 1), "b": (1, 1, 1, 1), "c": (1, 1, 1, 1), "d": (1, 1, 1, 1)}  # XS net +2
    rows = _rows("ref", 0, ref) + _rows("new", 0, seed0) + _rows("new", 1, seed1) + _rows("new", 2, seed2)
    rows += [dict(method="new", budget="XS", seed=0, task_id="only_xs", success=True)]  # incomplete → excluded
    res = transition_analysis(episodes_table(rows).to_pandas(), "new", "ref")
    assert [a.seed for a in res] == [0, 1, 2]
    assert all(a.reference_seed == 0 for a in res)  # single-seed reference is broadcast
    a0 = res[0]
    assert (a0.tasks, a0.always_correct, a0.budget_sensitive, a0.persistent) == (4, 2, 1, 1)
    xs = a0.rows[0]
    assert (xs.budget, xs.rescued, xs.regressed, xs.additional, xs.net) == ("XS", 1, 1, 1, 1)
    assert median_seed(res).seed == 0
    with pytest.raises(ValueError):
        median_seed(())


def test_transition_analysis_needs_every_level():
    rows = [dict(method=m, budget="XS", task_id="t", success=True) for m in ("new", "ref")]
    assert transition_analysis(episodes_table(rows).to_pandas(), "new", "ref") == ()
