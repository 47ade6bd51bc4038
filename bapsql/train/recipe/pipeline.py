"""The training recipe as one call per stage (DESIGN §5): SFT → GRPO → evaluation sweep + analysis.

Every stage of seed ``k`` works in ``run_dir = <out_dir>/<name>-seed<k>``:

- `run_sft_stage`: exports the workflows' turn pairs when ``sft.data`` is not given (``bapsql sft-data`` logic,
  into ``run_dir/sft_pairs.parquet``), runs Ray Train SFT (`bapsql.train.recipe.sft.run_sft`) and leaves
  ``run_dir/sft/{adapter,merged}`` and ``sft/result.json``;
- `run_grpo_stage`: LoRA on the SFT-merged model (or the base with ``grpo.sft_init: none``), rollouts with the
  configured engine (vLLM here and on GPUs; HF as the reference) on env workers — Ray actors, or in-process with
  ``rollout.use_ray: false`` — and the `GRPOTrainer` loop; ``--resume`` continues from
  ``run_dir/grpo/checkpoints``. Leaves ``grpo/{adapter,merged}``, ``grpo/history.jsonl`` and the rollouts' Parquet
  logs under ``grpo/rollouts``; with ``grpo.validate_every`` also ``grpo/validation.jsonl`` and the validated
  updates' adapters (`bapsql.train.loop.validation`), and with ``grpo.keep: best`` the validated best update is the
  saved policy (``grpo/selected.json`` says which);
- `bapsql.train.recipe.evaluation.run_eval_stage`: the SFT and GRPO policies (merged folders) swept over
  ``eval.budgets`` × ``eval.seeds`` on ``data.eval_split``, then the analysis report;
- `run_recipe` runs the stages in order inside one Ray session (a private local Ray, or the cluster at
  ``rollout.ray_address``), skipping SFT when its outputs exist.

``model.base`` goes through `bapsql.models.resolve.resolve_model`: ``builtin:tiny`` is the tiny Qwen-architecture
model the rollout helpers share, built into the cache dir on first use; a registry name (``smollm2-135m-instruct``)
is fetched into the cache dir on first use.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from bapsql.config import flat_config
from bapsql.errors import ConfigError
from bapsql.files import atomic_write_text
from bapsql.train.config import TrainConfig
from bapsql.train.loop.validation import Validator, keep_best
from bapsql.train.recipe.evaluation import run_eval_stage, write_learning_curves
from bapsql.train.recipe.sft import SFTResult


@dataclass(frozen=True)
class GRPOResult:
    """What a GRPO stage did: updates done (in total), where the policy is, and the per-update metrics."""

    run_dir: Path
    updates: int
    resumed_from: int
    adapter_dir: Path
    merged_dir: Path
    history: tuple[dict, ...]
    seconds: float


@dataclass(frozen=True)
class RecipeResult:
    sft: SFTResult | None
    grpo: GRPOResult | None
    eval_dir: Path | None
    report_dir: Path | None
    success: dict[str, dict[str, float]]  # method -> level -> success rate of the evaluation sweep


def _say(console: Any, msg: str) -> None:
    if console is not None:
        console.print(f"[cyan]{msg}[/cyan]")


def base_model(cfg: TrainConfig, console: Any = None, *, seed: int | None = None) -> Path:
    """The base model: the pretraining stage's output when ``pretrain.enabled``, else ``model.base``."""
    from bapsql.models.resolve import resolve_model

    if cfg.pretrain.enabled:
        path = cfg.run_dir(cfg.seeds[0] if seed is None else seed) / "pretrain" / "model"
        if not (path / "config.json").is_file():
            raise ConfigError(f"no pretrained model at {path}; run the pretrain stage first (--stages pretrain)")
        return path
    path = Path(resolve_model(cfg.model.base, announce=lambda m: _say(console, m)))
    if not (path / "config.json").is_file():
        raise ConfigError(f"model.base: {path} is not a transformers model folder (no config.json)")
    return path


def sft_dir(cfg: TrainConfig, seed: int) -> Path:
    """Where seed ``seed``'s SFT stage writes (and GRPO reads) its model: the first seed's with ``sft.shared``."""
    return cfg.run_dir(cfg.seeds[0] if cfg.sft.shared else seed) / "sft"


def policy_base(cfg: TrainConfig, seed: int, console: Any = None) -> Path:
    """The model GRPO trains a fresh LoRA on: the SFT-merged model, or the base with ``sft_init: none``."""
    if cfg.grpo.sft_init == "none":
        return base_model(cfg, console, seed=seed)
    merged = sft_dir(cfg, seed) / "merged"
    if not (merged / "config.json").is_file():
        raise ConfigError(f"no SFT model at {merged}; run the SFT stage first (python -m jobs.sft --config ...)")
    return merged


def ray_context(cfg: TrainConfig, run_dir: Path) -> contextlib.AbstractContextManager:
    """One Ray session for the stages: join ``rollout.ray_address``, reuse a running one, or start a private one."""
    from bapsql.rollout.ray_shell import ray_session, short_temp_dir

    r = cfg.rollout
    # logical CPUs: env workers + the engines of the largest stage (evaluation serves the SFT and GRPO policies side
    # by side) + the writer and Ray Train's controller. Actors wait for free logical CPUs, so too few would hang.
    ncpu = r.num_cpus or r.env_workers + 2 * r.engine_replicas + 2
    return ray_session(r.ray_address, num_cpus=ncpu,
                       temp_dir=None if r.ray_address else short_temp_dir(run_dir / "tmp"))


# ---------------------------------------------------------------------------------------------------------- SFT
def run_sft_stage(cfg: TrainConfig, seed: int, *, console: Any = None) -> SFTResult:
    """Export pairs if needed and run Ray Train SFT (Ray must be up: `run_recipe` / the job opens the session).
    With ``sft.shared`` every seed's SFT stage is the first seed's (one model, trained with that seed)."""
    from bapsql.train.recipe.sft import run_sft

    from bapsql.env.records import EnvOptions

    seed = cfg.seeds[0] if cfg.sft.shared else seed
    run_dir = cfg.run_dir(seed)
    base = base_model(cfg, console, seed=seed)
    data = Path(cfg.sft.data) if cfg.sft.data else run_dir / "sft_pairs.parquet"
    if not data.is_file():
        if cfg.sft.data:
            raise ConfigError(f"sft.data: {data} does not exist; export it with `bapsql sft-data --out {data}`")
        from collections import Counter

        from bapsql.policies.registry import WORKFLOW_NAMES
        from bapsql.policies.sft_export import estimate_first_line, export_sft_shares

        _say(console, f"exporting {cfg.sft.export_pairs} SFT pairs from the workflows into {data} ...")
        exports = export_sft_shares(
            cfg.sft.conditions or (cfg.condition,), cfg.data.benchmark, cfg.data.split, cfg.sft.export_pairs, data,
            seed=seed, max_length=cfg.sft.max_length, tokenizer_dir=base,
            template_kwargs=cfg.model.chat_template_kwargs, workflows=cfg.sft.workflows or WORKFLOW_NAMES,
            budgets=cfg.sft.budgets, env_options=EnvOptions(prompt_style=cfg.prompt_style),
            per_episode=cfg.sft.per_episode, only_successes=cfg.sft.only_successes, slips=_slip_bank(cfg),
            console=console, branch_tries=cfg.sft.branch_tries)
        branched, kept, first = Counter(), Counter(), Counter()
        for e in exports:
            branched.update(e.branched)
            kept.update(e.kept_per_budget)
            first.update(e.estimate_first)
        _say(console, "kept episodes that took their workflow's budget-aware branch: "
             + (", ".join(f"{k.removeprefix('workflow.')} {v}" for k, v in sorted(branched.items())) or "none"))
        _say(console, "kept episodes that start with an estimate, per level: "
             + (estimate_first_line(kept, first) or "none"))
    n_pairs = _count_rows(data)
    steps = -(-n_pairs // cfg.sft.effective_batch) * cfg.sft.epochs
    lcfg = cfg.learner_config(base, "sft", seed=seed, total_steps=steps)
    _say(console, f"SFT: {n_pairs} pairs, {steps} steps, {cfg.sft.num_workers} Ray Train worker(s)")
    result = run_sft(data, lcfg, sft_dir(cfg, seed), effective_batch=cfg.sft.effective_batch,
                     max_length=cfg.sft.max_length, epochs=cfg.sft.epochs, seed=seed,
                     num_workers=cfg.sft.num_workers, use_gpu=cfg.sft.use_gpu, strategy=cfg.sft.strategy)
    record = {k: (str(v) if isinstance(v, Path) else v) for k, v in dataclasses.asdict(result).items()
              if k != "history"}
    atomic_write_text(sft_dir(cfg, seed) / "result.json", json.dumps(record, indent=1, default=str) + "\n")
    return result


def _slip_bank(cfg: TrainConfig) -> Any:
    """``sft.slips`` loaded (`bapsql.policies.slips.SlipBank`), or None when the config names none."""
    if not cfg.sft.slips:
        return None
    from bapsql.data.tasks import resolve_benchmark
    from bapsql.policies.slips import SlipBank

    return SlipBank.load(cfg.sft.slips, resolve_benchmark(cfg.data.benchmark))


def _count_rows(path: Path) -> int:
    import pyarrow.parquet as pq

    return pq.ParquetFile(path).metadata.num_rows


def keep_history_until(path: Path, update: int) -> int:
    """Drop the records of ``path`` (``history.jsonl``, one metrics dict per line) whose ``update`` is past
    ``update``: after a resume from the checkpoint of ``update`` those updates run again and are logged again, so
    keeping them would duplicate them. Rewrites the file atomically; returns how many records remain."""
    if not path.exists():
        return 0
    keep = [line for line in path.read_text().splitlines() if line.strip() and json.loads(line)["update"] <= update]
    if keep:
        atomic_write_text(path, "\n".join(keep) + "\n")
    else:
        path.unlink()
    return len(keep)


# --------------------------------------------------------------------------------------------------------- GRPO
def tree_sha256(path: Path) -> str:
    """SHA-256 over a file or a folder's files (relative names and bytes, in sorted order): an adapter's identity."""
    import hashlib

    root = Path(path)
    h = hashlib.sha256()
    for f in sorted(p for p in ([root] if root.is_file() else root.rglob("*")) if p.is_file()):
        h.update(f.relative_to(root.parent if root.is_file() else root).as_posix().encode() + b"\0")
        with f.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def write_grpo_start(cfg: TrainConfig, seed: int, base: Path, grpo_dir: Path) -> Path:
    """``<grpo_dir>/start.json``: what the GRPO stage starts from — the model it trains a fresh LoRA on (``base``),
    the SFT adapter behind it and its `tree_sha256` (None with ``grpo.sft_init: none``), and the whole training
    config flattened to ``section.key`` — so two stages (Table 2's ``rl_full`` and ``rl_sql``) can be shown to start
    from the same SFT adapter and to differ only in the reward. Returns the path."""
    adapter = sft_dir(cfg, seed) / "adapter"
    from_sft = cfg.grpo.sft_init == "merged" and adapter.is_dir()
    record = {"seed": seed, "init_model": str(base), "sft_init": cfg.grpo.sft_init,
              "sft_adapter": str(adapter) if from_sft else None,
              "sft_adapter_sha256": tree_sha256(adapter) if from_sft else None, "config": flat_config(cfg)}
    path = Path(grpo_dir) / "start.json"
    atomic_write_text(path, json.dumps(record, indent=1, sort_keys=True, default=str) + "\n")
    return path


def run_grpo_stage(cfg: TrainConfig, seed: int, *, resume: bool = False, console: Any = None,
                   updates: int | None = None, subdir: str = "grpo") -> GRPOResult:
    """Run GRPO (see the module docstring). With ``rollout.use_ray`` Ray must be up (`run_recipe` opens it).
    ``subdir``: the stage's folder under the run dir (``grpo``; Table 2 trains two rewards side by side from one SFT
    model, in ``rl_full`` and ``rl_sql``, with ``cfg.reward`` set per stage).

    In order: the model it starts from, the data it trains on, the rollouts + learner + loop (wired once by
    `build_grpo`), the updates, the policy it keeps, the result."""
    from bapsql.data.tasks import resolve_benchmark
    from bapsql.rollout.completion_cap import warn_completion_cap
    from bapsql.train.loop.grpo_data import grpo_prompt_tasks, validation_tasks, write_prompt_record
    from bapsql.train.loop.grpo_setup import build_grpo

    t0 = time.perf_counter()
    grpo_dir = cfg.run_dir(seed) / subdir
    grpo_dir.mkdir(parents=True, exist_ok=True)
    base = policy_base(cfg, seed, console)
    write_grpo_start(cfg, seed, base, grpo_dir)
    # the data: GRPO's prompts, and (grpo.validate_every) the held-out validation questions
    root = resolve_benchmark(cfg.data.benchmark, announce=lambda m: _say(console, m))
    tasks, empty = grpo_prompt_tasks(cfg, seed, root)
    write_prompt_record(cfg, tasks, empty, grpo_dir)
    _say(console, _prompts_line(cfg, tasks, empty))
    warn_completion_cap(tasks, base, cfg.grpo.max_new_tokens, where="GRPO prompt",
                        key="grpo.max_new_tokens", say=lambda m: _say(console, m))
    every = cfg.grpo.validate_every
    val_tasks = validation_tasks(cfg, seed, root, exclude=tasks) if every else []
    # the rollouts, the learner and the loop; the validator plays the validation questions on the same rollouts
    total = cfg.grpo.updates if updates is None else updates
    setup = build_grpo(cfg, seed, base=base, tasks=tasks, run_dir=grpo_dir, total_updates=total,
                       run_name=f"{cfg.name}-seed{seed}-{subdir}",
                       monitor_run=f"{cfg.name}-seed{seed}" + ("" if subdir == "grpo" else f"-{subdir}"),
                       validation=val_tasks)
    validator = Validator(setup.rollouts, setup.learner, val_tasks, cfg.budgets.levels, grpo_dir,
                          monitor=setup.monitor) if every else None
    history_path = grpo_dir / "history.jsonl"
    try:
        resumed_from = _start(setup, validator, history_path, resume=resume, total=total, console=console)
        while setup.trainer.update < total:
            rec = setup.trainer.step()
            if validator is not None and (rec.update % every == 0 or rec.update == total):
                rec.metrics.update(_validate(validator, setup.monitor, rec.update, console))
            with history_path.open("a") as f:
                f.write(json.dumps(rec.metrics) + "\n")
            _say(console, _progress_line(rec.update, total, rec.metrics))
        adapter, merged = _save_policy(cfg, setup, validator, grpo_dir, total, console)
    finally:
        setup.close()
    history = tuple(json.loads(line) for line in history_path.read_text().splitlines()) \
        if history_path.exists() else ()
    return GRPOResult(run_dir=grpo_dir, updates=total, resumed_from=resumed_from, adapter_dir=Path(adapter),
                      merged_dir=Path(merged), history=history, seconds=time.perf_counter() - t0)


def _prompts_line(cfg: TrainConfig, tasks: Sequence[Any], empty: Sequence[Any]) -> str:
    return (f"GRPO prompts: {len(tasks)} tasks ({cfg.grpo.prompts}); {len(empty)} with an empty gold answer "
            + ("left out (grpo.empty_gold: exclude)" if cfg.grpo.empty_gold == "exclude" else "kept"))


def _start(setup: Any, validator: Validator | None, history_path: Path, *, resume: bool, total: int,
           console: Any) -> int:
    """Start the trainer (from its latest checkpoint with ``resume``), drop the history past the update it starts
    from, and validate that update unless it already was. Returns the update it starts from."""
    first = setup.trainer.start(resume=resume)
    resumed_from = setup.trainer.update
    if not resume and history_path.exists():
        history_path.unlink()
    keep_history_until(history_path, resumed_from)  # updates past the checkpoint are redone and logged again
    _say(console, f"GRPO from update {resumed_from} to {total} (sync check: mean |Δ| = {first.mean_abs:.2e})")
    if validator is not None:
        validator.resume(resumed_from if resume else None)
        if not validator.validated(resumed_from):
            _validate(validator, setup.monitor, resumed_from, console)
    return resumed_from


def _save_policy(cfg: TrainConfig, setup: Any, validator: Validator | None, grpo_dir: Path, total: int,
                 console: Any) -> tuple[Path, Path]:
    """The final checkpoint, then the policy the stage keeps (the validated best with ``grpo.keep: best``, else the
    last update's) saved as ``adapter/`` and ``merged/``; returns both folders."""
    learner = setup.learner
    setup.trainer.checkpoint()
    if cfg.grpo.keep == "best" and validator is not None:
        best = keep_best(validator, learner)
        atomic_write_text(grpo_dir / "selected.json",
                          json.dumps({"keep": "best", **dataclasses.asdict(best)}) + "\n")
        _say(console, f"keeping the validated best policy: update {best.update} (validation success "
                      f"{best.mean:.3f}; update {total}: {validator.records[-1].mean:.3f})")
    else:
        (grpo_dir / "selected.json").unlink(missing_ok=True)  # an earlier keep: best run's choice is not this one's
    if validator is not None and cfg.grpo.keep_validated == "best":
        validator.prune()  # after the final checkpoint: a resume from it can still choose only the best record
    adapter = learner.save_adapter(grpo_dir / "adapter")
    merged = learner.merge_and_save(grpo_dir / "merged")
    return adapter, merged


def _validate(validator: Validator, monitor: Any, update: int, console: Any) -> dict[str, float]:
    """Validate update ``update``, log it to the monitor at that step; returns its metrics."""
    rec = validator.run(update)
    metrics = rec.metrics()
    monitor.log(metrics, step=update)
    _say(console, f"validation at update {update}: success " + ", ".join(
        f"{lv} {v:.3f}" for lv, v in rec.success.items()) + f" ({rec.episodes} episodes, {rec.seconds:.0f}s)")
    return metrics


def _progress_line(update: int, total: int, m: dict[str, float]) -> str:
    loss = f"{m['learner/loss']:.4f}" if "learner/loss" in m else "skipped"
    return (f"update {update}/{total}: success {m['success/all']:.2f}, reward {m['reward/mean']:.3f}, kept "
            f"{int(m['filter/kept_groups'])}/{int(m['filter/drawn_groups'])} groups, loss {loss}, "
            f"rollout {m['time/rollout_s']:.1f}s learner {m['time/learner_s']:.1f}s sync {m['time/sync_s']:.1f}s")


# ------------------------------------------------------------------------------------------------------- recipe
def run_recipe(cfg: TrainConfig, seed: int, *, resume: bool = False,
               stages: tuple[str, ...] = ("pretrain", "sft", "grpo", "eval"), console: Any = None) -> RecipeResult:
    """Run the stages in order inside one Ray session (see the module docstring)."""
    unknown = sorted(set(stages) - {"pretrain", "sft", "grpo", "eval"})
    if unknown:
        raise ConfigError(f"unknown stage(s) {unknown}; stages are pretrain, sft, grpo, eval")
    run_dir = cfg.run_dir(seed)
    run_dir.mkdir(parents=True, exist_ok=True)
    need_ray = "sft" in stages or cfg.rollout.use_ray
    sft = grpo = None
    eval_dir = report = None
    success: dict[str, dict[str, float]] = {}
    if "pretrain" in stages and cfg.pretrain.enabled:
        if (run_dir / "pretrain" / "result.json").is_file() and resume:
            _say(console, f"pretrained model exists in {run_dir / 'pretrain'}; skipping pretraining (resume)")
        else:
            from bapsql.train.recipe.pretrain import run_pretrain

            run_pretrain(cfg, seed, run_dir, console=console)
    with (ray_context(cfg, run_dir) if need_ray else contextlib.nullcontext()):
        if need_ray:  # every node must see the benchmark and write the run folder (StorageError otherwise)
            from bapsql.data.tasks import resolve_benchmark
            from bapsql.rollout.ray_shell.nodes import preflight

            preflight(resolve_benchmark(cfg.data.benchmark, announce=lambda m: _say(console, m)), run_dir)
        if "sft" in stages and cfg.sft.enabled:
            if (sft_dir(cfg, seed) / "merged" / "config.json").is_file() and resume:
                _say(console, f"SFT outputs exist in {sft_dir(cfg, seed)}; skipping SFT (resume)")
            else:
                sft = run_sft_stage(cfg, seed, console=console)
        if "grpo" in stages and cfg.grpo.enabled:
            grpo = run_grpo_stage(cfg, seed, resume=resume, console=console)
        if "eval" in stages and cfg.eval.enabled:
            models: dict[str, Path] = {}
            if cfg.sft.enabled and (sft_dir(cfg, seed) / "merged").is_dir():
                models["sft"] = sft_dir(cfg, seed) / "merged"
            if cfg.grpo.enabled and (run_dir / "grpo" / "merged").is_dir():
                models["grpo"] = run_dir / "grpo" / "merged"
            if not models:
                raise ConfigError("eval: no trained policy to evaluate (run the sft / grpo stages first)")
            _, report = run_eval_stage(cfg, seed, models, console=console)
            eval_dir = run_dir / "eval"
            # from the report (every logged episode), not the sweep's cells: a resumed sweep's cells count only
            # the episodes it ran itself
            methods = json.loads((report / "summary.json").read_text())["methods"]
            success = {m: {lvl: v / 100.0 for lvl, v in row["success"].items() if v is not None}
                       for m, row in methods.items()}
            for extra in cfg.eval.extra_splits:
                run_eval_stage(cfg, seed, models, console=console, split=extra)
            write_learning_curves(run_dir, report, sft=sft_dir(cfg, seed))
    return RecipeResult(sft, grpo, eval_dir, report, success)
