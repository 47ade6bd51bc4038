"""Running Table 2 in miniature (issue 16): `run_table2` runs every seed's wanted stages in order
(`bapsql.train.experiments.stage_plan.plan_seed` says run / resume / reuse / skip / redo for each, and why), times
each into ``<run>/table2/stages.json``, then writes the report (`bapsql.train.experiments.table2_report`). It sits
above these modules, so the config (`table2`) and the plan (`stage_plan`) never import the report that reads them.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

from bapsql.errors import ConfigError
from bapsql.train.experiments.stage_plan import (
    COMPUTES,
    LEDGER_RECIPES,
    Step,
    mark_started,
    plan_seed,
    read_stages,
    record_attempt,
    set_aside,
    stage_recipe,
    stages_path,
)
from bapsql.train.experiments.table2 import (
    RL_REWARDS,
    SEED_STAGES,
    STAGES,
    Action,
    Row,
    Table2Config,
    eval_models,
    rl_config,
    select_rows,
    table2_rows,
)
from bapsql.train.experiments.table2_report import write_report


def _run_seed_stage(cfg: Table2Config, seed: int, stage: str, action: Action, console: Any,
                    rows: tuple[Row, ...]) -> None:
    t = cfg.train
    run = t.run_dir(seed)
    if stage == "pretrain":
        from bapsql.train.recipe.pretrain import run_pretrain

        run_pretrain(t, seed, run, console=console)
    elif stage == "protocol":
        from bapsql.train.experiments.protocol import run_protocol_stage

        run_protocol_stage(t, cfg.protocol, seed, console=console)
    elif stage == "sft":
        from bapsql.train.recipe.pipeline import run_sft_stage

        run_sft_stage(t, seed, console=console)
    elif stage in RL_REWARDS:
        from bapsql.train.recipe.pipeline import run_grpo_stage

        run_grpo_stage(rl_config(t, stage), seed, resume=action == "resume", console=console, subdir=stage)
    else:
        from bapsql.rollout.sweep import run_sweep
        from bapsql.train.recipe.evaluation import eval_experiment

        out = run / "table2" / "eval"
        # the trained rows first (the sweep runs one engine after another): a sweep stopped part-way on a slow
        # machine has whole SFT / SQL-RL / BAP-SQL RL rows to resume after, not whole prompting rows
        rows = sorted(rows, key=lambda r: r.key in cfg.prompting_conditions)
        engines = tuple(dict.fromkeys(r.engine for r in rows))
        exp = eval_experiment(t, eval_models(cfg, seed, console, engines), tuple(r.method for r in rows),
                              run=f"{t.name}-seed{seed}-table2", split=t.data.eval_split, out_dir=out, seeds=(seed,))
        run_sweep(exp, address=t.rollout.ray_address, out_dir=out, console=console,
                  backend="ray" if t.rollout.use_ray else "local")


def _say(console: Any, msg: str) -> None:
    if console is not None:
        console.print(f"[bold cyan][table2][/bold cyan] {msg}")


def run_table2(cfg: Table2Config, *, stages: tuple[str, ...] = STAGES, rows: tuple[str, ...] | None = None,
               console: Any = None) -> Path | None:
    """Run the wanted stages of every seed, then the report (module docstring); returns the report folder (None
    when ``report`` is not wanted). Times each stage into ``<run>/table2/stages.json`` and prints it.

    ``rows`` (row keys, `select_rows`): the evaluation plays only these rows, so a row can be seen as soon as its
    model is trained (the others' models need not exist yet). Their episodes land in the seed's sweep, which a later
    evaluation resumes; the stage is recorded unfinished while rows are missing, and the report, which needs every
    row, cannot be asked for in the same call."""
    from bapsql.train.recipe.pipeline import ray_context

    chosen = select_rows(cfg, rows)
    if rows is not None and "eval" not in stages:
        raise ConfigError(f"--rows {','.join(r.key for r in chosen)}: picks the rows the eval stage plays; add eval "
                          "to --stages")
    if len(chosen) < len(table2_rows(cfg)) and "report" in stages:
        raise ConfigError(f"--rows {','.join(r.key for r in chosen)}: the report needs every row of Table 2; "
                          "leave report out of --stages (e.g. --stages eval) and run it once every row is evaluated")
    t = cfg.train
    for seed in t.seeds:
        steps = plan_seed(cfg, seed, stages)
        plan = {s: step.action for s, step in steps.items()}
        run = t.run_dir(seed)
        run.mkdir(parents=True, exist_ok=True)
        _say(console, f"seed {seed}: " + ", ".join(f"{s} {a}" for s, a in plan.items()))
        for s, step in steps.items():
            if step.why:
                _say(console, f"seed {seed} {s}: {step.action}: {step.why}")
        need_ray = plan["sft"] in COMPUTES or plan["protocol"] in COMPUTES or (
            t.rollout.use_ray and any(plan[s] in COMPUTES for s in ("rl_full", "rl_sql", "eval")))
        if plan["pretrain"] != "skip":  # alone, before any Ray process takes a core
            _timed(cfg, seed, "pretrain", steps["pretrain"], console, chosen)
        with (ray_context(t, run) if need_ray else contextlib.nullcontext()):
            for stage in SEED_STAGES[1:]:
                if plan[stage] != "skip":
                    _timed(cfg, seed, stage, steps[stage], console, chosen)
    if "report" not in stages:
        return None
    t0 = time.perf_counter()
    out = write_report(cfg, console=console)
    seconds = time.perf_counter() - t0
    _say(console, f"report: {seconds:.0f} s -> {out / 'table2.md'}")
    return out


def _timed(cfg: Table2Config, seed: int, stage: str, step: Step, console: Any, rows: tuple[Row, ...]) -> None:
    path = stages_path(cfg, seed)
    action = step.action
    if action == "reuse":
        prior = read_stages(path)[stage]["seconds"]
        record_attempt(path, stage, "reuse", 0.0, True)
        _say(console, f"seed {seed} {stage}: reused (finished before, {prior:.0f} s)")
        return
    mark_started(path, stage)
    for moved in set_aside(cfg, seed, stage, step):
        _say(console, f"seed {seed} {stage}: set aside -> {moved}")
    _say(console, f"seed {seed} {stage}: {action} ...")
    t0 = time.perf_counter()
    _run_seed_stage(cfg, seed, stage, action, console, rows)
    seconds = time.perf_counter() - t0
    recipe = stage_recipe(cfg, stage) if stage in LEDGER_RECIPES else None
    finished = not (stage == "eval" and len(rows) < len(table2_rows(cfg)))  # --rows played part of the table
    total = record_attempt(path, stage, action, seconds, finished, recipe)[stage]["seconds"]
    left = f"; rows {', '.join(r.key for r in rows)} only: run eval again for the others" if not finished else ""
    _say(console, f"seed {seed} {stage}: done in {seconds:.0f} s (stage total {total:.0f} s){left}")
