"""The monitor's trajectory table: which episodes it shows and its rows (bapsql/logs/samples.py)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bapsql.logs.samples import (
    COLUMNS,
    run_trajectory_table,
    select_episodes,
    selection_key,
    trajectory_rows,
    trajectory_table,
)
from bapsql.logs.writer import TrajectoryWriter
from tests.logs._rows import episode_row, turn_rows


def _ep(method, budget, task, success, seed=0):
    return {"method": method, "budget": budget, "task_id": f"t{task}", "episode_id": f"{method}|{budget}|{task}|{seed}",
            "seed": seed, "sample": 0, "success": success, "reward": float(success)}


def _cell(method, budget, wins, losses):
    return [_ep(method, budget, i, True) for i in range(wins)] + [_ep(method, budget, 100 + i, False)
                                                                  for i in range(losses)]


def _reference(episodes, per_cell, successes):
    """A slow reference: per cell, walk the sorted successes and failures and fill the quota one by one."""
    out = []
    cells = {}
    for e in episodes:
        cells.setdefault((e["method"], e["budget"]), []).append(e)
    for key in cells:
        wins = sorted((e for e in cells[key] if e["success"]), key=selection_key)
        losses = sorted((e for e in cells[key] if not e["success"]), key=selection_key)
        chosen_w, chosen_l = wins[:successes], losses[:per_cell - successes]
        while len(chosen_w) + len(chosen_l) < per_cell and (len(chosen_w) < len(wins) or len(chosen_l) < len(losses)):
            if len(chosen_w) < len(wins):
                chosen_w = wins[:len(chosen_w) + 1]
            else:
                chosen_l = losses[:len(chosen_l) + 1]
        out.append((key, {e["episode_id"] for e in chosen_w + chosen_l}))
    return dict(out)


def test_two_successes_and_two_failures_per_cell_when_available():
    eps = _cell("a@full", "XS", 5, 5) + _cell("a@full", "S", 5, 1) + _cell("a@full", "M", 0, 3) + \
        _cell("b@full", "XS", 1, 0)
    chosen = select_episodes(eps)
    per = {}
    for e in chosen:
        per.setdefault((e["method"], e["budget"]), []).append(e["success"])
    assert per == {("a@full", "XS"): [True, True, False, False], ("a@full", "S"): [True, True, True, False],
                   ("a@full", "M"): [False, False, False], ("b@full", "XS"): [True]}
    # cells: methods by name, levels in ladder order
    assert list(per) == [("a@full", "XS"), ("a@full", "S"), ("a@full", "M"), ("b@full", "XS")]


@given(st.lists(st.tuples(st.sampled_from(["m1", "m2"]), st.sampled_from(["XS", "S", "L", "probe"]),
                          st.integers(0, 30), st.booleans(), st.integers(0, 2)),
                max_size=80, unique_by=lambda x: x[:3] + (x[4],)),
       st.integers(0, 6), st.integers(0, 6), st.randoms(use_true_random=False))
def test_selection_matches_the_reference_and_ignores_input_order(rows, per_cell, successes, rnd):
    successes = min(successes, per_cell)
    eps = [_ep(m, b, t, s, seed) for m, b, t, s, seed in rows]
    chosen = select_episodes(eps, per_cell=per_cell, successes=successes)
    shuffled = eps[:]
    rnd.shuffle(shuffled)
    assert chosen == select_episodes(shuffled, per_cell=per_cell, successes=successes)  # deterministic
    got: dict = {}
    for e in chosen:
        got.setdefault((e["method"], e["budget"]), set()).add(e["episode_id"])
    ref = {k: v for k, v in _reference(eps, per_cell, successes).items() if v}
    assert got == ref


def test_the_same_tasks_come_back_across_rounds():
    """Validation rounds differ in their seed: with the same outcomes, the same questions are shown."""
    r0 = [_ep("m", "XS", i, i % 3 == 0, seed=0) for i in range(30)]
    r5 = [_ep("m", "XS", i, i % 3 == 0, seed=5) for i in range(30)]
    assert [e["task_id"] for e in select_episodes(r0)] == [e["task_id"] for e in select_episodes(r5)]


def test_bad_quota_is_refused():
    with pytest.raises(ValueError, match="successes <= per_cell"):
        select_episodes([], per_cell=2, successes=3)


def test_rows_are_one_per_turn_with_text_cut_for_display():
    e = _ep("m@full", "XS", 1, False)
    turns = [{"turn": 2, "action": "answer", "valid": True, "status": None, "completion": "A" * 50,
              "observation": "Episode over."},
             {"turn": 1, "action": "invalid", "valid": False, "status": None, "completion": "SELECT * FROM t",
              "observation": "x" * 5000}]
    rows = trajectory_rows([e], {e["episode_id"]: turns}, display_chars=100)
    assert [r["turn"] for r in rows] == [1, 2] and all(tuple(r) == COLUMNS for r in rows)
    assert rows[0]["completion"] == "SELECT * FROM t" and rows[0]["valid"] is False
    assert len(rows[0]["observation"]) == 100 and rows[0]["observation"].endswith("chars]")
    assert all(r["success"] is False and r["reward"] == 0.0 and r["level"] == "XS" for r in rows)


def test_trajectory_table_over_pairs_shows_only_the_chosen_episodes():
    eps = _cell("m", "XS", 3, 3)
    pairs = [(e, [{"turn": 1, "action": "answer", "valid": True, "status": None, "completion": e["episode_id"],
                   "observation": "ok"}]) for e in eps]
    rows = trajectory_table(pairs)
    chosen = select_episodes(eps)
    assert [r["episode_id"] for r in rows] == [e["episode_id"] for e in chosen]
    assert [r["completion"] for r in rows] == [e["episode_id"] for e in chosen]


def test_the_table_of_a_logged_run_reads_the_chosen_episodes_turns(tmp_path):
    rng = random.Random(0)
    episodes = [episode_row("r", m, b, 0, t) for m in ("raw", "bap") for b in ("XS", "S") for t in range(12)]
    with TrajectoryWriter(tmp_path, "r", flush_every=40) as w:
        for e in rng.sample(episodes, len(episodes)):
            w.add_episode(e, turn_rows(e))
    rows = run_trajectory_table(tmp_path)
    chosen = select_episodes(episodes)
    assert list(dict.fromkeys(r["episode_id"] for r in rows)) == [e["episode_id"] for e in chosen]
    assert len(rows) == sum(e["turns"] for e in chosen)
    expected = {(t["episode_id"], t["turn"]): t["completion"] for e in chosen for t in turn_rows(e)}
    assert all(r["completion"] == expected[(r["episode_id"], r["turn"])] for r in rows)
