"""Mechanism diagnostics of Table 2: the spread inside GRPO groups, against a slow reference loop, by hand-made
cases, and read back from real Parquet written in the log schema."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings, strategies as st

from bapsql.train.algo.reward import RewardConfig, group_rewards
from bapsql.train.experiments.mechanism import COLUMNS, group_spread, read_group_spread
from tests.analysis.helpers import episodes_table


def _group(gid: str, budget: str, success, queries, evidence, method: str = "model.policy@full") -> list[dict]:
    return [{"group_id": gid, "budget": budget, "method": method, "correct": bool(s), "feasible": True,
             "success": bool(s), "queries": int(q), "evidence_score": float(e)}
            for s, q, e in zip(success, queries, evidence)]


def _reference(df: pd.DataFrame) -> dict[str, tuple]:
    """Slow loop: per level, (groups, mixed, multi, q%, e%, full%, sd q, sd e)."""
    out = {}
    df = df[~df["method"].str.contains(".val@", regex=False)]
    for budget in df["budget"].unique():
        n = mixed = multi = qd = ed = fd = 0
        qs, es = [], []
        level = df[df["budget"] == budget]
        for gid in level["group_id"].unique():
            g = level[level["group_id"] == gid]
            n += 1
            s = list(g["success"])
            q = [int(x) for x in g["queries"]]
            e = [float(x) for x in g["evidence_score"]]
            if 0 < sum(s) < len(s):
                mixed += 1
                qs.append(float(np.std(q)))
                es.append(float(np.std(e)))
            if sum(s) >= 2:
                multi += 1
                sq = [q[i] for i in range(len(s)) if s[i]]
                se = [e[i] for i in range(len(s)) if s[i]]
                qd += len(set(sq)) > 1
                ed += max(se) - min(se) > 1e-9
                r = group_rewards(np.array(list(g["correct"])), np.array(list(g["feasible"])), np.array(e),
                                  np.array(q), RewardConfig(variant="full"))
                sr = [r[i] for i in range(len(s)) if s[i]]
                fd += max(sr) - min(sr) > 1e-9
        pct = (lambda k: 100.0 * k / multi if multi else math.nan)
        out[str(budget)] = (n, mixed, multi, pct(qd), pct(ed), pct(fd),
                            sum(qs) / len(qs) if qs else math.nan, sum(es) / len(es) if es else math.nan)
    return out


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b)


def test_hand_made_groups():
    rows = (_group("a", "XS", [1, 1, 0, 0], [1, 1, 1, 1], [0.75, 0.75, 0.0, 0.0])      # successes alike
            + _group("b", "XS", [1, 1, 1, 0], [1, 2, 1, 3], [0.75, 0.75, 0.75, 0.0])   # one more query
            + _group("c", "XS", [1, 0, 0, 0], [1, 4, 4, 4], [1.0, 0.0, 0.0, 0.0])      # one success: not multi
            + _group("d", "S", [1, 1, 0, 0], [1, 1, 2, 2], [1.0, 0.5, 0.0, 0.0])       # evidence differs
            + _group("e", "S", [0, 0, 0, 0], [1, 1, 1, 1], [0.0] * 4)                  # no success
            + _group("v", "S", [1, 1, 0, 0], [1, 3, 1, 1], [1.0] * 4, method="model.policy.val@full"))
    spread = {s.budget: s for s in group_spread(pd.DataFrame(rows))}
    assert list(spread) == ["XS", "S"]
    xs, s = spread["XS"], spread["S"]
    assert (xs.groups, xs.mixed, xs.multi) == (3, 3, 2)
    assert xs.queries_differ_pct == 50.0 and xs.evidence_differ_pct == 0.0 and xs.full_differs_pct == 50.0
    assert (s.groups, s.mixed, s.multi) == (2, 1, 1)  # the validation group is left out
    assert s.queries_differ_pct == 0.0 and s.evidence_differ_pct == 100.0 and s.full_differs_pct == 100.0
    assert s.queries_sd == pytest.approx(0.5) and s.evidence_sd == pytest.approx(np.std([1.0, 0.5, 0.0, 0.0]))


def test_no_successes_leave_the_shares_undefined():
    (only,) = group_spread(pd.DataFrame(_group("e", "M", [0, 0], [1, 1], [0.0, 0.0])))
    assert only.multi == 0 and math.isnan(only.full_differs_pct) and math.isnan(only.queries_sd)


def test_missing_columns_are_named():
    with pytest.raises(ValueError, match="evidence_score"):
        group_spread(pd.DataFrame(_group("a", "XS", [1], [1], [0.5])).drop(columns=["evidence_score"]))


@st.composite
def _rollouts(draw):
    rows = []
    for gi in range(draw(st.integers(1, 6))):
        size = draw(st.integers(1, 6))
        rows += _group(f"g{gi}", draw(st.sampled_from(["XS", "S", "M", "L"])),
                       draw(st.lists(st.booleans(), min_size=size, max_size=size)),
                       draw(st.lists(st.integers(0, 4), min_size=size, max_size=size)),
                       draw(st.lists(st.sampled_from([0.0, 0.25, 0.5, 1.0]), min_size=size, max_size=size)),
                       method=draw(st.sampled_from(["model.policy@full", "model.policy.val@full"])))
    return pd.DataFrame(rows, columns=list(COLUMNS))


@settings(max_examples=60, deadline=None)
@given(_rollouts())
def test_matches_the_reference_loop(df):
    ref = _reference(df)
    got = {s.budget: s for s in group_spread(df)}
    assert set(got) == set(ref)
    for budget, want in ref.items():
        g = got[budget]
        have = (g.groups, g.mixed, g.multi, g.queries_differ_pct, g.evidence_differ_pct, g.full_differs_pct,
                g.queries_sd, g.evidence_sd)
        assert all(_same(float(a), float(b)) for a, b in zip(have, want)), (budget, have, want)
        # the full reward can differ among successes only where their queries or evidence do
        if g.multi:
            assert g.full_differs_pct <= g.queries_differ_pct + g.evidence_differ_pct + 1e-9


def test_reads_real_rollout_parquet(tmp_path):
    from bapsql.analysis.synthetic import write_run

    rows = [{**r, "task_id": r["group_id"], "condition": "full", "sample": i}
            for i, r in enumerate(_group("a", "XS", [1, 1, 0], [1, 2, 1], [0.5, 0.5, 0.0])
                                  + _group("b", "L", [1, 1, 0], [1, 1, 1], [0.5, 0.5, 0.0]))]
    write_run(tmp_path / "rollouts", episodes_table(rows), None)
    spread = {s.budget: s for s in read_group_spread(tmp_path / "rollouts")}
    assert spread["XS"].full_differs_pct == 100.0 and spread["L"].full_differs_pct == 0.0
    assert read_group_spread(tmp_path / "absent") == ()


def test_rollouts_of_an_update_never_made_are_left_out(tmp_path):
    from bapsql.analysis.synthetic import write_run

    made = _group("a", "XS", [1, 1, 0], [1, 2, 1], [0.5, 0.5, 0.0])  # update 1's groups: sampled by version 0
    never = [{**r, "policy_version": 1} for r in _group("b", "XS", [1, 1, 0], [1, 1, 1], [0.5, 0.5, 0.0])]
    rows = [{**r, "task_id": r["group_id"], "condition": "full", "sample": i} for i, r in enumerate(made + never)]
    write_run(tmp_path / "rollouts", episodes_table(rows), None)
    (xs,) = read_group_spread(tmp_path / "rollouts", updates=1)
    assert xs.groups == 1 and xs.full_differs_pct == 100.0
    (both,) = read_group_spread(tmp_path / "rollouts")  # every logged rollout
    assert both.groups == 2 and both.full_differs_pct == 50.0
    assert read_group_spread(tmp_path / "rollouts", updates=0) == ()
