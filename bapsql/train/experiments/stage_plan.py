"""The stage plan of Table 2 in miniature (`bapsql.train.experiments.table2`): what each of a seed's stages will do,
decided from the run's files alone, and the ledger of what each stage did and with which settings
(``<run>/table2/stages.json``).

Actions (`Action`), in stage order, each stage seeing what the ones before it will do:

- ``skip``: not wanted, pretraining disabled, or no protocol model asked for;
- ``reuse``: recorded finished, its output there, its settings as they were, and nothing it was made from newer;
- ``resume``: something to continue from: a GRPO checkpoint — of an interrupted stage, or of a finished one that made
  fewer updates than ``grpo.updates`` asks for now (the key grew) — or the evaluation's logged episodes, when it is
  unfinished or a row has none (set aside by a redo that was stopped, or left out by ``--rows``);
- ``run``: from scratch;
- ``redo``: its output is older than what it was made from, or short of what the config asks and with nothing to
  resume from; the old output is set aside (`set_aside`, never deleted) and the stage made again:

  - a GRPO stage whose ``start.json`` names an SFT adapter other than the one there now (by `tree_sha256`), or whose
    SFT stage computes in this call, or a finished one with no checkpoint left (the trainer always writes one at the
    end; someone removed them) that logged fewer updates than ``grpo.updates`` (its ``history.jsonl``): the stage
    folder moves to ``rl_x.stale-<time>`` and GRPO starts afresh;
  - a finished protocol or SFT stage, or a GRPO stage, whose settings changed since it computed (`stage_recipe`:
    e.g. ``sft.lr``, ``sft.branch_tries``, ``reward.*``; the ones in `RECIPE_NEUTRAL` — placement, memory, logging,
    ``grpo.updates`` — do not count): an SFT stage's folder moves to ``sft.stale-<time>`` with the pairs exported for
    it, and everything trained from it is redone in turn;
  - the evaluation, for the rows whose model is newer than their logged episodes, or is trained in this call: those
    rows' ``method=`` partitions move to ``table2/eval.stale-<time>/`` and the sweep resumes, running them again
    (episode ids do not depend on the model, so without this the sweep would skip them as logged).

A stage is recorded unfinished (`mark_started`) before it computes, so a call stopped part-way never leaves an earlier
attempt's ``finished`` standing. A GRPO stage that made more updates than ``grpo.updates`` (by its checkpoint, else
its history) is a `ConfigError` (a checkpoint cannot be un-trained): set the key to what it made, or use another
``--out-dir``. Not checked: a protocol or SFT model older than a pretraining stage rerun (the pretrained backbones
have no rerun path here; the real backbone is not pretrained).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from bapsql.config import flat_config
from bapsql.errors import ConfigError
from bapsql.files import atomic_write_text
from bapsql.train.config import TrainConfig
from bapsql.train.experiments.protocol import protocol_train_config
from bapsql.train.experiments.table2 import (
    RL_REWARDS,
    SEED_STAGES,
    STAGES,
    Action,
    Row,
    Table2Config,
    rl_config,
    table2_rows,
    trained_models,
)

COMPUTES: frozenset[str] = frozenset({"run", "resume", "redo"})  # the actions that compute (and are timed)
ROW_STAGES: dict[str, str] = {"protocol": "protocol", "sft": "sft", "sql_rl": "rl_sql", "bap_rl": "rl_full"}


# ------------------------------------------------------------------------------------------------------- ledger
def stages_path(cfg: Table2Config, seed: int) -> Path:
    return cfg.train.run_dir(seed) / "table2" / "stages.json"


def read_stages(path: Path) -> dict[str, dict]:
    """The stage records of ``stages.json`` (stage -> {finished, seconds, attempts}); empty when there is none."""
    return json.loads(path.read_text())["stages"] if path.is_file() else {}


def record_attempt(path: Path, stage: str, action: str, seconds: float, finished: bool,
                   recipe: dict[str, Any] | None = None) -> dict[str, dict]:
    """Add one attempt of ``stage`` to ``stages.json`` (atomically); ``seconds`` (the stage's total) sums the
    attempts that computed something (run / resume / redo); ``recipe`` (`stage_recipe`, given when it computed)
    replaces the stage's recorded one. Returns the updated records."""
    stages = read_stages(path)
    rec = stages.setdefault(stage, {"finished": False, "seconds": 0.0, "attempts": []})
    if recipe is not None:
        rec["recipe"] = recipe
    rec["attempts"].append({"action": action, "seconds": round(seconds, 2), "finished": finished,
                            "at": datetime.now(timezone.utc).isoformat(timespec="seconds")})
    rec["seconds"] = round(sum(a["seconds"] for a in rec["attempts"] if a["action"] in COMPUTES), 2)
    rec["finished"] = rec["finished"] or finished
    atomic_write_text(path, json.dumps({"stages": stages}, indent=1) + "\n")
    return stages


def mark_started(path: Path, stage: str) -> None:
    """Record ``stage`` unfinished before it computes: a call killed part-way through a redo or a resume (whose old
    output was set aside, or is being extended) must not leave the stage recorded finished from an earlier attempt,
    or the next plan would reuse what is not there."""
    stages = read_stages(path)
    stages.setdefault(stage, {"finished": False, "seconds": 0.0, "attempts": []})["finished"] = False
    atomic_write_text(path, json.dumps({"stages": stages}, indent=1) + "\n")


# ------------------------------------------------------------------------------------------------------ recipes
# the settings that make a stage's output: flat keys of its training config (`flat_config`), a key ending in "." a
# whole section. The GRPO stages' recipe leaves out what they share with SFT: a change there redoes SFT, and that
# redoes them.
_SFT_RECIPE = ("sft.", "lora.", "model.base", "model.dtype", "data.benchmark", "data.split", "data.limit",
               "condition", "prompt_style")
_RL_RECIPE = ("grpo.", "reward.", "filter.", "budgets.", "calibration")
RECIPE_KEYS: dict[str, tuple[str, ...]] = {"protocol": _SFT_RECIPE, "sft": _SFT_RECIPE,
                                           **{stage: _RL_RECIPE for stage in RL_REWARDS}}
# keys inside those that leave what a stage makes as it is: where it runs, how it fits in memory, what it logs, and
# grpo.updates, whose growth a finished GRPO stage resumes (`_rl_step`)
RECIPE_NEUTRAL: frozenset[str] = frozenset({"sft.num_workers", "sft.use_gpu", "sft.strategy", "sft.micro_batch_tokens",
                                            "sft.gradient_checkpointing", "grpo.updates", "grpo.micro_batch_tokens",
                                            "grpo.gradient_checkpointing", "grpo.log_drift"})
LEDGER_RECIPES: tuple[str, ...] = ("protocol", "sft")  # whose recipe stages.json keeps (GRPO's: its start.json)


def _pick(flat: dict[str, Any], stage: str) -> dict[str, Any]:
    keys = RECIPE_KEYS.get(stage, ())
    return {k: v for k, v in flat.items() if k not in RECIPE_NEUTRAL
            and any(k == p or (p.endswith(".") and k.startswith(p)) for p in keys)}


def _stage_train(cfg: Table2Config, stage: str) -> TrainConfig:
    """The training config ``stage`` runs with: the protocol SFT's, a GRPO stage's (its reward), else the config's."""
    if stage == "protocol":
        return protocol_train_config(cfg.train, cfg.protocol)
    return rl_config(cfg.train, stage) if stage in RL_REWARDS else cfg.train


def stage_recipe(cfg: Table2Config, stage: str) -> dict[str, Any]:
    """The settings of ``stage`` (`RECIPE_KEYS` less `RECIPE_NEUTRAL`) as ``{"section.key": value}``, from the
    training config it runs with (`_stage_train`); empty for stages without one (and for the protocol stage of a
    config without a protocol model)."""
    if stage == "protocol" and cfg.protocol is None:
        return {}
    return _pick(flat_config(_stage_train(cfg, stage)), stage)


def _recorded_recipe(cfg: Table2Config, seed: int, stage: str, records: dict[str, dict]) -> dict[str, Any] | None:
    """The recipe ``stage`` last computed with: a GRPO stage's from the config its ``start.json`` holds (written at
    every start and resume), the others' from the ledger; None when there is none (runs from before recipes)."""
    if stage in RL_REWARDS:
        start = cfg.train.run_dir(seed) / stage / "start.json"
        return _pick(json.loads(start.read_text()).get("config", {}), stage) if start.is_file() else None
    return records.get(stage, {}).get("recipe")


def recipe_changes(recorded: dict[str, Any] | None, current: dict[str, Any]) -> str:
    """The keys whose value differs between a stage's recorded recipe and the config's now, as ``"key a → b"``
    (``;``-joined; empty when none, or when nothing was recorded). Only keys in both count: a key added to the code
    since (its default is the old behaviour) or removed from it changes nothing."""
    if not recorded:
        return ""
    return "; ".join(f"{k} {recorded[k]!r} → {current[k]!r}" for k in sorted(set(recorded) & set(current))
                     if recorded[k] != current[k])


# --------------------------------------------------------------------------------------------------------- plan
@dataclass(frozen=True)
class Step:
    """What one stage will do: ``action``, ``why`` (empty for the plain cases) and, for the evaluation's ``redo``,
    the logged methods (`Row.logged`) whose episodes are set aside and run again."""

    action: Action
    why: str = ""
    stale_methods: tuple[str, ...] = ()


def _output_exists(cfg: Table2Config, seed: int, stage: str) -> bool:
    run = cfg.train.run_dir(seed)
    if stage == "pretrain":
        return (run / "pretrain" / "model" / "config.json").is_file()
    if stage == "eval":
        return (run / "table2" / "eval").is_dir()
    engine = {s: e for e, s in ROW_STAGES.items()}[stage]
    return (trained_models(cfg, seed)[engine] / "config.json").is_file()


def _checkpoint(cfg: Table2Config, seed: int, stage: str) -> tuple[Path | None, int | None]:
    """GRPO stage ``stage``'s latest checkpoint and the update it holds, ``(None, None)`` when it has none."""
    from bapsql.train.learner.checkpoint import checkpoint_update, latest_checkpoint

    ckpt = latest_checkpoint(cfg.train.run_dir(seed) / stage / "checkpoints")
    return ckpt, (checkpoint_update(ckpt) if ckpt is not None else None)


def _logged_updates(cfg: Table2Config, seed: int, stage: str) -> int | None:
    """How many updates GRPO stage ``stage`` logged in its ``history.jsonl`` (None without one): what a finished stage
    whose checkpoints were removed (to free disk, say) made."""
    from bapsql.train.recipe.curves import read_history

    hist = cfg.train.run_dir(seed) / stage / "history.jsonl"
    records = read_history(hist) if hist.is_file() else []
    return int(max(r["update"] for r in records)) if records else None


def _sft_changed(cfg: Table2Config, seed: int, stage: str, sft_sha: list[str | None]) -> bool:
    """Whether GRPO stage ``stage`` started from an SFT adapter other than the one there now (``sft_sha`` caches the
    current adapter's hash across the two RL stages)."""
    from bapsql.train.recipe.pipeline import sft_dir, tree_sha256

    start = cfg.train.run_dir(seed) / stage / "start.json"
    if not start.is_file():
        return False
    started = json.loads(start.read_text()).get("sft_adapter_sha256")
    adapter = sft_dir(cfg.train, seed) / "adapter"
    if started is None or not adapter.is_dir():
        return False
    if not sft_sha:
        sft_sha.append(tree_sha256(adapter))
    return started != sft_sha[0]


def _newest_mtime(folder: Path) -> float | None:
    times = [p.stat().st_mtime for p in folder.iterdir() if p.is_file()] if folder.is_dir() else []
    return max(times) if times else None


def _row_episodes(cfg: Table2Config, seed: int, row: Row) -> list[Path]:
    """The episode files the evaluation logged for ``row`` (its ``method=`` partition); [] when none."""
    part = cfg.train.run_dir(seed) / "table2" / "eval" / "episodes" / f"method={row.logged}"
    return list(part.rglob("*.parquet")) if part.is_dir() else []


def _stale_rows(cfg: Table2Config, seed: int, computing: set[str]) -> tuple[tuple[str, ...], str]:
    """The logged methods whose episodes are older than their model (or whose model is trained in this call)."""
    models = trained_models(cfg, seed)
    stale, reasons = [], []
    for row in table2_rows(cfg):
        files = _row_episodes(cfg, seed, row)
        stage = ROW_STAGES.get(row.engine)
        if not files or stage is None:
            continue
        if stage in computing:
            stale.append(row.logged)
            reasons.append(f"{row.key} ({stage} computes in this call)")
            continue
        model_time = _newest_mtime(models[row.engine])
        if model_time is not None and min(p.stat().st_mtime for p in files) < model_time:
            stale.append(row.logged)
            reasons.append(f"{row.key} (its model is newer than its episodes)")
    return tuple(stale), "; ".join(reasons)


def _missing_rows(cfg: Table2Config, seed: int) -> tuple[str, ...]:
    """The rows with no logged episode yet (set aside, never evaluated, or left out by ``--rows``)."""
    return tuple(row.key for row in table2_rows(cfg) if not _row_episodes(cfg, seed, row))


def _rl_step(cfg: Table2Config, seed: int, stage: str, finished: bool, computing: set[str],
             sft_sha: list[str | None], changed: str) -> Step:
    ckpt, done = _checkpoint(cfg, seed, stage)
    logged = _logged_updates(cfg, seed, stage) if ckpt is None else None
    want = cfg.train.grpo.updates
    if "sft" in computing and (ckpt is not None or (cfg.train.run_dir(seed) / stage / "start.json").is_file()):
        return Step("redo", "its SFT model is trained again in this call")
    if _sft_changed(cfg, seed, stage, sft_sha):
        return Step("redo", "it started from another SFT adapter than the one there now")
    if changed:
        return Step("redo", f"its settings changed: {changed}")
    made = done if done is not None else logged
    if made is not None and made > want:
        where = ckpt if ckpt is not None else cfg.train.run_dir(seed) / stage / "history.jsonl"
        raise ConfigError(f"grpo.updates: {stage} of seed {seed} made {made} updates, more than the {want} asked "
                          f"for ({where}); set grpo.updates to {made} or more, or use another --out-dir")
    if finished and _output_exists(cfg, seed, stage):
        if done is not None and done < want:
            return Step("resume", f"it made {done} of grpo.updates {want} updates; continues from {ckpt.name}")
        if logged is not None and logged < want:
            return Step("redo", f"it made {logged} of grpo.updates {want} updates and has no checkpoint left to "
                                f"resume from; runs all {want} again")
        return Step("reuse")
    return Step("resume", f"continues from {ckpt.name}") if ckpt is not None else Step("run")


def plan_seed(cfg: Table2Config, seed: int, wanted: tuple[str, ...] = SEED_STAGES) -> dict[str, Step]:
    """The `Step` of each of seed ``seed``'s stages (module docstring)."""
    unknown = sorted(set(wanted) - set(STAGES))
    if unknown:
        raise ConfigError(f"unknown stage(s) {unknown}; stages are {', '.join(STAGES)}")
    done = read_stages(stages_path(cfg, seed))
    plan: dict[str, Step] = {}
    computing: set[str] = set()
    sft_sha: list[str | None] = []
    for stage in SEED_STAGES:
        finished = bool(done.get(stage, {}).get("finished"))
        changed = recipe_changes(_recorded_recipe(cfg, seed, stage, done), stage_recipe(cfg, stage)) \
            if stage in RECIPE_KEYS else ""
        if stage not in wanted or (stage == "pretrain" and not cfg.train.pretrain.enabled) or (
                stage == "protocol" and cfg.prompting_model != "protocol"):
            step = Step("skip")
        elif stage in RL_REWARDS:
            step = _rl_step(cfg, seed, stage, finished, computing, sft_sha, changed)
        elif stage == "eval":
            stale, why = _stale_rows(cfg, seed, computing)
            if stale:
                step = Step("redo", f"episodes older than their model: {why}", stale)
            else:
                missing = _missing_rows(cfg, seed)
                if finished and _output_exists(cfg, seed, stage) and not missing:
                    step = Step("reuse")
                elif any((cfg.train.run_dir(seed) / "table2" / "eval").rglob("*.parquet")):
                    gap = f"; rows with no episode yet: {', '.join(missing)}" if missing else ""
                    step = Step("resume", f"the sweep skips the episodes it logged{gap}")
                else:
                    step = Step("run")
        elif finished and _output_exists(cfg, seed, stage):
            step = Step("redo", f"its settings changed: {changed}") if changed else Step("reuse")
        else:
            step = Step("run")
        plan[stage] = step
        if step.action in COMPUTES:
            computing.add(stage)
    return plan


def plan_stages(cfg: Table2Config, seed: int, wanted: tuple[str, ...] = SEED_STAGES) -> dict[str, Action]:
    """Stage -> the action of its `Step` (`plan_seed`)."""
    return {stage: step.action for stage, step in plan_seed(cfg, seed, wanted).items()}


def set_aside(cfg: Table2Config, seed: int, stage: str, step: Step) -> list[Path]:
    """Move a ``redo`` stage's old output out of the way (module docstring); returns where it went. A no-op for
    other actions."""
    if step.action != "redo":
        return []
    run = cfg.train.run_dir(seed)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
    moves: list[tuple[Path, Path]] = []
    if stage in RL_REWARDS:
        moves.append((run / stage, run / f"{stage}.stale-{stamp}"))
    elif stage == "eval":
        ev = run / "table2" / "eval"
        moves += [(ev / sub / f"method={m}", run / "table2" / f"eval.stale-{stamp}" / sub / f"method={m}")
                  for m in step.stale_methods for sub in ("episodes", "turns")]
    elif stage in LEDGER_RECIPES:  # the SFT folder and the pairs exported for it (a given sft.data stays)
        from bapsql.train.recipe.pipeline import sft_dir

        folder = sft_dir(_stage_train(cfg, stage), seed)
        moves.append((folder, folder.with_name(f"sft.stale-{stamp}")))
        moves += [(f, f.with_name(f"{f.stem}.stale-{stamp}.parquet"))
                  for f in sorted(folder.parent.glob("sft_pairs*.parquet")) if ".stale-" not in f.name]
    else:
        raise ConfigError(f"{stage}: has no redo (only the SFT, protocol and GRPO stages and the evaluation do)")
    moved = []
    for src, dst in moves:
        if src.exists():
            dst.parent.mkdir(parents=True, exist_ok=True)
            os.replace(src, dst)
            moved.append(dst)
    return moved
