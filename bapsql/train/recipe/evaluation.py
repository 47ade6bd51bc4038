"""The evaluation stage of a training recipe: the trained policies swept on held-out tasks, the analysis report, and
the run's learning curves beside it.

- `eval_experiment`: the validated sweep config of ``model:<name>@<condition>`` methods served by merged folders,
  with the recipe's eval settings (the one builder of evaluation sweeps: the recipe and Table 2 use it);
- `run_eval_stage`: the SFT and GRPO policies swept over ``eval.budgets`` × ``eval.seeds`` on ``data.eval_split``
  (or another split, reported in ``report_<split>/``; `bapsql.rollout.sweep.run_sweep`), then
  `bapsql.analysis.analyze_runs` writes the report. The sweep reports to a monitor of ``monitor.kind`` (W&B run
  ``<name>-seed<k>-eval[_<split>]``, its files in the sweep folder): live success per method × level and, at the end,
  the table ``eval/trajectories`` of a few trajectories per method × level with their completion and observation
  text (`bapsql.logs.samples`); the logs keep turn text as ``eval.log_text`` says;
- `pooled_report`: one report over several training seeds' evaluation sweeps (``<out_dir>/<name>-pooled/report``);
- `write_learning_curves`: the GRPO, pretraining and SFT curves as PNG into a report folder.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from bapsql.train.config import TrainConfig
from bapsql.train.loop.engine_setup import engine_config


def eval_experiment(cfg: TrainConfig, models: dict[str, Path], methods: tuple[str, ...], *, run: str, split: str,
                    out_dir: Path, seeds: tuple[int, ...] | None = None) -> Any:
    """The validated `ExperimentConfig` of an evaluation sweep: ``methods`` (``model:<name>@<condition>``) served by
    ``models`` (name → merged model folder) with the recipe's eval settings, on ``split``, into ``out_dir``."""
    from bapsql.experiment import ExperimentConfig, SamplingConfig, WorkersConfig, validate

    engines = {name: engine_config(cfg, path, lora=False, levels=cfg.eval.budgets) for name, path in models.items()}
    r = cfg.rollout
    e = cfg.eval
    return validate(ExperimentConfig(
        run=run, benchmark=cfg.data.benchmark, methods=methods, split=split, limit=e.limit, budgets=e.budgets,
        seeds=e.seeds if seeds is None else seeds, samples_per_group=e.samples_per_group, engines=engines,
        sampling=SamplingConfig(max_tokens=e.max_new_tokens, temperature=e.temperature, top_p=e.top_p,
                                template_kwargs=dict(cfg.model.chat_template_kwargs)),
        workers=WorkersConfig(env_workers=r.env_workers, engine_threads=r.engine_threads, engine_gpus=r.engine_gpus,
                              env_worker_cpus=r.env_worker_cpus, in_flight=r.in_flight,
                              env_resources=dict(r.env_resources), placement_timeout_s=r.placement_timeout_s,
                              engine_phases=e.engine_phases),
        prompt_style=cfg.prompt_style, out_dir=str(out_dir), calibration=cfg.calibration, log_text=e.log_text))


def run_eval_stage(cfg: TrainConfig, seed: int, models: dict[str, Path], *, console: Any = None,
                   split: str | None = None) -> tuple[Any, Path]:
    """Sweep the given policies (name → merged model folder) on ``split`` (default ``data.eval_split``) and analyse
    the sweep; returns (summary, report dir). The eval split's report is ``run_dir/report``; another split's is
    ``run_dir/report_<split>`` (its sweep in ``eval_<split>``)."""
    from bapsql.analysis.analyze import analyze_runs
    from bapsql.logs.monitor import make_monitor
    from bapsql.rollout.sweep import run_sweep

    split = split or cfg.data.eval_split
    suffix = "" if split == cfg.data.eval_split else "_" + split.replace(":", "-")
    run_dir = cfg.run_dir(seed)
    r = cfg.rollout
    e = cfg.eval
    methods = tuple(f"model:{n}@{c}" for n in models for c in (e.conditions or (cfg.condition,)))
    exp = eval_experiment(cfg, models, methods, run=f"{cfg.name}-seed{seed}-eval{suffix}", split=split,
                          out_dir=run_dir / f"eval{suffix}")
    monitor = make_monitor(cfg.monitor.kind, project=cfg.monitor.project, run_name=exp.run, config=exp.to_dict(),
                           dir=run_dir / f"eval{suffix}")
    try:
        summary = run_sweep(exp, address=r.ray_address, out_dir=run_dir / f"eval{suffix}", console=console,
                            backend="ray" if r.use_ray else "local", monitor=monitor)
    finally:
        monitor.close()
    report = run_dir / f"report{suffix}"
    analyze_runs([run_dir / f"eval{suffix}"], report, reference=_reference(cfg, tuple(models)),
                 replicates=e.replicates, seed=seed)
    return summary, report


def pooled_report(cfg: TrainConfig, seeds: tuple[int, ...], *,
                  models: tuple[str, ...] = ("sft", "grpo")) -> Path | None:
    """Analyse the ``eval/`` sweeps of every seed in ``seeds`` that has one, together, into
    ``<out_dir>/<name>-pooled/report`` (against ``eval.reference``, when that policy is among ``models``); None when
    fewer than two seeds have a sweep. Each seed's sweep runs at ``eval.seeds``, so a task's cell holds every training
    seed's episodes: the paired differences are of the mean over training seeds."""
    from bapsql.analysis.analyze import analyze_runs

    runs = [cfg.run_dir(s) / "eval" for s in seeds if (cfg.run_dir(s) / "eval" / "episodes").is_dir()]
    if len(runs) < 2:
        return None
    out = Path(cfg.out_dir) / f"{cfg.name}-pooled" / "report"
    analyze_runs(runs, out, reference=_reference(cfg, models), replicates=cfg.eval.replicates, seed=0)
    return out


def _reference(cfg: TrainConfig, models: tuple[str, ...]) -> str | None:
    """The method the report compares against: ``eval.reference`` (sft / grpo) under the first evaluated
    condition, when it is among ``models`` beside another policy; else None (no comparison)."""
    from bapsql.experiment import MODEL_PREFIX

    e = cfg.eval
    if e.reference not in models or len(models) < 2:
        return None
    return f"{MODEL_PREFIX}{e.reference}@{e.conditions[0] if e.conditions else cfg.condition}"


def write_learning_curves(run_dir: Path, report: Path, *, sft: Path | None = None) -> list[str]:
    """Put the run's learning curves into the report folder (PNG) and list them at the end of ``report.md``:
    GRPO per update (`bapsql.train.recipe.curves.learning_curves_png`), the pretraining curve, the SFT loss (from
    ``sft``, the SFT stage's folder; default ``run_dir/sft``)."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        return []
    from bapsql.train.loop.validation import VALIDATION_FILE, read_validation
    from bapsql.train.recipe.curves import learning_curves_png, pretrain_curve_png, read_history

    written = []
    hist = run_dir / "grpo" / "history.jsonl"
    if hist.is_file():
        val = [dataclasses.asdict(r) for r in read_validation(run_dir / "grpo" / VALIDATION_FILE)]
        (report / "learning_curves.png").write_bytes(learning_curves_png(read_history(hist), validation=val))
        written.append("learning_curves.png")
    pre = run_dir / "pretrain" / "result.json"
    if pre.is_file():
        (report / "pretrain_curve.png").write_bytes(
            pretrain_curve_png(json.loads(pre.read_text())["curve"], title="pretraining (full parameters)"))
        written.append("pretrain_curve.png")
    sft = (run_dir / "sft" if sft is None else sft) / "result.json"
    if sft.is_file():
        losses = json.loads(sft.read_text()).get("losses") or []
        if losses:
            (report / "sft_curve.png").write_bytes(pretrain_curve_png(
                [{"step": i, "loss": v} for i, v in enumerate(losses)], title="SFT (LoRA): completion loss per step"))
            written.append("sft_curve.png")
    md = report / "report.md"
    if written and md.is_file():
        md.write_text(md.read_text() + "\n## Learning curves\n\n" + "\n".join(f"![{w}]({w})" for w in written) + "\n")
    return written
