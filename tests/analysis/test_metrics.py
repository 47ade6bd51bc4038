"""Budgeted Success, Frontier Score and cost metrics per method × budget."""

from __future__ import annotations

import numpy as np
import pytest

from bapsql.analysis import statistics as st
from bapsql.analysis.load import load_runs
from bapsql.analysis.metrics import (
    LADDER,
    cell_metrics,
    frontier_score,
    frontier_scores,
    order_levels,
    success_intervals,
)
from bapsql.analysis.report import fmt
from bapsql.analysis.synthetic import write_run
from tests.analysis.helpers import PAPER_TABLE2, episodes_table


@pytest.mark.parametrize("method", sorted(PAPER_TABLE2))
def test_frontier_score_reproduces_paper_table2(method):
    cells, printed = PAPER_TABLE2[method]
    score = frontier_score(dict(zip(LADDER, cells)))
    assert score == pytest.approx((cells[0] / 2 + cells[1] + cells[2] + cells[3] / 2) / 3)
    assert abs(score - printed) <= 0.05 + 1e-9
    assert fmt(score) == f"{printed:.1f}"  # the report prints the paper's number to one decimal


def test_frontier_score_needs_all_four_levels():
    assert frontier_score({"XS": 30.0, "S": 31.0, "M": 32.0}) is None
    assert frontier_score({"XS": 30.0, "S": 31.0, "M": 32.0, "L": float("nan")}) is None
    assert frontier_score({"XS": 30.0, "S": 30.0, "M": 30.0, "L": 30.0, "probe": 99.0}) == pytest.approx(30.0)


def test_order_levels_puts_the_ladder_first():
    levels = ["L", "probe_b", "XS", "M", "probe_a", "S", "XS"]
    assert order_levels(levels) == ("XS", "S", "M", "L", "probe_a", "probe_b")


def _logs(tmp_path):
    rows = []
    # method a: db0 has tasks t0,t1; db1 has t2; two seeds; success pattern chosen by hand.
    pattern = {("XS", 0): (1, 0, 0), ("XS", 1): (1, 1, 0), ("L", 0): (1, 1, 1), ("L", 1): (0, 1, 1)}
    for (budget, seed), succ in pattern.items():
        for t, s in enumerate(succ):
            rows.append(dict(method="a", budget=budget, seed=seed, task_id=f"t{t}", db_id="db0" if t < 2 else "db1",
                             success=bool(s), total_tokens=100 * (t + 1), official_ex=bool(s) if t else None,
                             breach=False, abstained=not s))
    rows.append(dict(method="b", budget="XS", seed=0, task_id="t0", db_id="db0", success=True, total_tokens=50,
                     breach=True))
    write_run(tmp_path / "run", episodes_table(rows))
    return load_runs([tmp_path / "run"]).episodes


def test_cell_metrics_pooled_by_database_and_by_seed(tmp_path):
    ep = _logs(tmp_path)
    cells = {(c.method, c.budget): c for c in cell_metrics(ep)}
    a_xs = cells[("a", "XS")]
    assert a_xs.episodes == 6 and a_xs.tasks == 3 and a_xs.databases == 2 and a_xs.seeds == 2
    assert a_xs.success == pytest.approx(100 * 3 / 6)
    assert a_xs.total_tokens == pytest.approx(200.0)
    # official EX only over the 4 episodes that record it (t1, t2 at two seeds): successes t1@seed1 only
    assert a_xs.official_ex == pytest.approx(100 * 1 / 4)
    assert a_xs.abstained == pytest.approx(50.0)
    assert cells[("b", "XS")].breaches == 1 and cells[("b", "XS")].official_ex is None
    by_db = {(c.method, c.budget, c.group): c.success for c in cell_metrics(ep, by="db_id")}
    assert by_db[("a", "XS", "db0")] == pytest.approx(100 * 3 / 4)
    assert by_db[("a", "XS", "db1")] == pytest.approx(0.0)
    by_seed = {(c.method, c.budget, c.group): c.success for c in cell_metrics(ep, by="seed")}
    assert by_seed[("a", "L", "1")] == pytest.approx(100 * 2 / 3)
    # cells come out in ladder order within a method
    assert [c.budget for c in cell_metrics(ep) if c.method == "a"] == ["XS", "L"]
    assert frontier_scores(cell_metrics(ep))[("a", None)] is None  # S and M missing


def test_success_intervals_match_a_slow_resampling_loop(tmp_path):
    ep = _logs(tmp_path)
    r, seed = 200, 5
    got = success_intervals(ep, replicates=r, seed=seed)[("a", "XS")]
    sub = ep[(ep["method"] == "a") & (ep["budget"] == "XS")]
    dbs = sorted(sub["db_id"].unique())
    draws = st.bootstrap_draws(len(dbs), r, seed)
    reps = []
    for rep in range(r):
        rows = np.concatenate([sub.loc[sub["db_id"] == dbs[d], "success"].to_numpy(float) for d in draws[rep]])
        reps.append(100.0 * rows.mean())
    assert got == pytest.approx(st.percentile_interval(np.asarray(reps)))
    assert got[0] <= 50.0 <= got[1]
