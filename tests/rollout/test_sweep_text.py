"""A sweep keeps turn text as its ``log_text`` says and ends with a trajectory table on its monitor
(bapsql/rollout/sweep.py, in-process backend, scripted policies on a real benchmark)."""

from __future__ import annotations

import pandas as pd
import pytest

from bapsql.logs.reader import read_episodes, read_turns
from bapsql.logs.text import TextLogConfig, keeps_text
from tests.rollout.rollout_bench import build_rollout_bench


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    return build_rollout_bench(tmp_path_factory.mktemp("bench"))


def test_a_sweep_samples_its_turn_text_and_logs_a_trajectory_table(bench, tmp_path):
    from bapsql.experiment import ExperimentConfig, WorkersConfig, validate
    from bapsql.logs.monitor import MemoryMonitor
    from bapsql.logs.samples import TABLE_NAME, select_episodes
    from bapsql.rollout.sweep import run_sweep

    share = TextLogConfig(mode="sample", share=0.5)
    cfg = validate(ExperimentConfig(run="text", methods=("workflow.estimate_rewrite", "scripted.drafter"),
                                    benchmark=str(bench), split="dev", limit=6, budgets=("XS", "S"), seeds=(0,),
                                    workers=WorkersConfig(env_workers=2, scripted_batch=2), log_text=share))
    monitor = MemoryMonitor()
    run_sweep(cfg, out_dir=tmp_path / "run", backend="local", monitor=monitor)
    assert not monitor.closed  # the caller's monitor: the caller closes it
    turns = read_turns(tmp_path / "run")
    kept = turns[turns.completion.notna()]
    assert set(kept.episode_id) == {e for e in set(turns.episode_id) if keeps_text(e, share)}
    assert 0 < kept.episode_id.nunique() < turns.episode_id.nunique()
    assert kept.completion.str.contains("<tool_call>").all() and kept.observation.notna().all()

    rows = monitor.tables[TABLE_NAME]
    eps = read_episodes(tmp_path / "run").to_dict("records")
    chosen = select_episodes(eps)
    assert list(dict.fromkeys(r["episode_id"] for r in rows)) == [e["episode_id"] for e in chosen]
    assert {(r["method"], r["level"]) for r in rows} == {(e["method"], e["budget"]) for e in eps}
    for r in rows:  # the table shows what the logs kept
        logged = turns[(turns.episode_id == r["episode_id"]) & (turns.turn == r["turn"])].iloc[0]
        assert r["action"] == logged.action and (r["completion"] is None) == pd.isna(logged.completion)
