"""Per-method scopes in sweeps: a scoped method plays only its cells, the others the whole sweep."""

from __future__ import annotations

import json

import pytest

from bapsql.logs.reader import read_episodes
from tests.rollout.rollout_bench import build_rollout_bench


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    return build_rollout_bench(tmp_path_factory.mktemp("bench"))


def test_a_scoped_method_plays_only_its_cells(bench, tmp_path):
    from bapsql.experiment import ExperimentConfig, MethodScope, WorkersConfig, validate
    from bapsql.rollout.sweep import run_sweep

    cfg = validate(ExperimentConfig(
        run="scoped", methods=("workflow.direct_aggregation", "scripted.drafter@raw"), benchmark=str(bench),
        split="dev", budgets=("XS", "S"), seeds=(0, 1), workers=WorkersConfig(env_workers=1, scripted_batch=2),
        scopes={"scripted.drafter@raw": MethodScope(budgets=("S",), seeds=(1,), tasks_per_db=1)}))
    s = run_sweep(cfg, out_dir=tmp_path / "run", backend="local")
    eps = read_episodes(tmp_path / "run")
    n_tasks, n_dbs = eps.task_id.nunique(), eps.db_id.nunique()
    assert n_dbs >= 2
    full = eps[eps.method == "workflow.direct_aggregation@full"]
    scoped = eps[eps.method == "scripted.drafter@raw"]
    assert len(full) == n_tasks * 2 * 2  # every task, level and seed
    assert len(scoped) == n_dbs and set(scoped.budget) == {"S"} and set(scoped.seed) == {1}
    assert scoped.groupby("db_id").size().eq(1).all()  # the first task of each database
    firsts = full.sort_values(["db_id", "task_id"]).groupby("db_id").task_id.first()
    assert set(scoped.task_id) == set(firsts)
    assert s.episodes_total == s.result.episodes_run == len(full) + len(scoped)
    record = json.loads((tmp_path / "run" / "sweep.json").read_text())
    assert record["config"]["scopes"]["scripted.drafter@raw"]["budgets"] == ["S"]
