"""The recipe's pooled report over training seeds (`bapsql.train.recipe.evaluation.pooled_report`), on hand-made
logs."""

from __future__ import annotations

import json

from bapsql.analysis.synthetic import write_run
from bapsql.config import from_mapping
from bapsql.train.config import TrainConfig
from bapsql.train.recipe.evaluation import pooled_report
from tests.analysis.helpers import episodes_table


def _cfg(tmp_path, seeds):
    return from_mapping(TrainConfig, {"name": "p", "model": {"base": "m"}, "out_dir": str(tmp_path),
                                      "seeds": seeds, "eval": {"replicates": 200}})


def _sweep(cfg, seed, grpo_wins):
    """SFT solves tasks 0-4 of 20 (4 databases) at XS; GRPO solves those too, plus ``grpo_wins`` (or fewer)."""
    rows = [dict(method=f"model.{m}@full", budget="XS", task_id=f"t{i:02d}", db_id=f"db{i % 4}", seed=0,
                 run=f"p-seed{seed}-eval", success=i < 5 or (m == "grpo" and i in grpo_wins))
            for m in ("sft", "grpo") for i in range(20)]
    write_run(cfg.run_dir(seed) / "eval", episodes_table(rows))


def test_the_pooled_report_pairs_the_mean_over_training_seeds(tmp_path):
    """Seed 0's GRPO gains 4 of 20 tasks, seed 1's 2: the pooled XS difference is their mean, +15 pp, over both
    seeds' sweeps; one seed with a sweep gives no pooled report."""
    cfg = _cfg(tmp_path, [0, 1, 2])
    _sweep(cfg, 0, {5, 6, 7, 8})
    assert pooled_report(cfg, cfg.seeds) is None  # seed 1 and 2 have no sweep yet
    _sweep(cfg, 1, {5, 6})
    out = pooled_report(cfg, cfg.seeds)
    assert out == tmp_path / "p-pooled" / "report" and (out / "report.md").is_file()
    summary = json.loads((out / "summary.json").read_text())
    assert len(summary["runs"]) == 2 and summary["reference"] == "model.sft@full"
    (xs,) = [c for c in summary["comparisons"] if c["budget"] == "XS"]
    assert xs["method"] == "model.grpo@full" and abs(xs["quality"]["estimate"] - 15.0) < 1e-9


def test_the_eval_stage_sweeps_with_its_log_text_and_a_monitor_it_closes(tmp_path, monkeypatch):
    """`run_eval_stage` hands the sweep ``eval.log_text`` and a monitor of ``monitor.kind`` (where the sweep logs
    the trajectory table), and closes the monitor after the sweep."""
    from bapsql.logs.monitor import MemoryMonitor
    from bapsql.logs.text import TextLogConfig
    from bapsql.rollout import sweep
    from bapsql.train.recipe import evaluation

    cfg = from_mapping(TrainConfig, {"name": "p", "model": {"base": "m"}, "out_dir": str(tmp_path),
                                     "monitor": {"kind": "memory"}, "rollout": {"engine": {"kind": "hf"}},
                                     "eval": {"budgets": ["XS"], "log_text": {"mode": "sample", "share": 0.5}}})
    seen = {}

    def fake_sweep(exp, *, monitor=None, **kw):
        seen.update(exp=exp, monitor=monitor, closed_during=monitor.closed)
        return "summary"

    monkeypatch.setattr(sweep, "run_sweep", fake_sweep)
    monkeypatch.setattr("bapsql.analysis.analyze.analyze_runs", lambda *a, **k: None)
    (tmp_path / "sft").mkdir()
    summary, report = evaluation.run_eval_stage(cfg, 0, {"sft": tmp_path / "sft"})
    assert summary == "summary" and report == cfg.run_dir(0) / "report"
    assert seen["exp"].log_text == TextLogConfig(mode="sample", share=0.5)
    assert isinstance(seen["monitor"], MemoryMonitor) and not seen["closed_during"] and seen["monitor"].closed
