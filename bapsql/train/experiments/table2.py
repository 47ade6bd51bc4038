"""Table 2 in miniature (issue 16): the paper's main comparison trained and evaluated by one call,
`bapsql.train.experiments.table2_run.run_table2`; this module holds its config, rows and stage plan.

Per training seed ``k`` (run dir ``<out_dir>/<name>-seed<k>``, the recipe's layout of `bapsql.train.recipe.pipeline`):

- ``pretrain`` (when ``train.pretrain.enabled``) and ``sft`` (BAP-SQL SFT under the training condition): the
  recipe's stages;
- ``protocol`` (with ``prompting_model: protocol``): the protocol-only adapter of the prompting rows
  (`bapsql.train.experiments.protocol`: budget-blind workflows under each prompting condition);
- ``rl_full`` and ``rl_sql``: GRPO from that one SFT model with ``reward.variant`` ``full`` (BAP-SQL RL) and
  ``correctness`` (matched SQL-RL), in ``rl_full/`` and ``rl_sql/``: same prompts, filter, update budget and seed;
- ``eval``: one sweep (`bapsql.rollout.sweep.run_sweep`) over the rows of `table2_rows` at ``train.eval.budgets`` on
  ``train.data.eval_split``, into ``table2/eval``, the trained rows first (a sweep stopped part-way has them whole
  to resume after). The sweep's seed is the training seed, so the analysis's seed axis
  is the adapter seed, as in the paper (``train.eval.seeds`` is set from ``train.seeds`` by the loader).

Then, once over every seed, ``report`` (`bapsql.train.experiments.table2_report`) into ``<out_dir>/<name>-table2``:
Table 2 (reference: the dashboard row), the Table 3 gate (reference: the SFT row), the figures and ``table2.md``.

Resume: a stage is finished when ``<run>/table2/stages.json`` records it so; finished stages are reused, GRPO
continues from its latest checkpoint (``rl_*/checkpoints``, also when ``grpo.updates`` grew) and the sweep skips the
episodes it already logged; a stage older than what it was made from is made again, its old output set aside.
`bapsql.train.experiments.stage_plan.plan_stages` says which of run / resume / reuse / skip / redo each stage gets,
from the files alone.

Config (``configs/experiments/table2_cpu.yaml``)::

    train: {extends: ../train/cpu_learn_tiny.yaml, name: table2-cpu, ...}   # a training config (TrainConfig), inline
    prompting_model: base | sft | protocol   # the model of the prompting rows (protocol: a protocol-only adapter,
                                             # for an instruct model that cannot act zero-shot)
    protocol: {workflows, conditions, budgets, export_pairs, epochs}   # with prompting_model: protocol
    prompting_conditions: [raw, dashboard, adaptive_posthoc]
    reference_condition: dashboard     # the prompting row Table 2 is compared against
    quick: {...}                       # the --quick preset: keys merged over this document (train.* included)

A variant file may start with ``extends: table2_smollm2.yaml`` (a path relative to it): every key of that experiment
file, ``quick:`` included, merged under the variant's, mappings key by key, lists and values replaced; each file's
``train.extends`` stays relative to the file that wrote it.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from bapsql.config import flat_config, from_mapping
from bapsql.errors import ConfigError
from bapsql.train.config import TrainConfig
from bapsql.train.experiments.protocol import ProtocolSettings, protocol_model_dir
from bapsql.train.extends import deep_merge, read_raw, resolve_extends

SEED_STAGES: tuple[str, ...] = ("pretrain", "protocol", "sft", "rl_full", "rl_sql", "eval")
STAGES: tuple[str, ...] = SEED_STAGES + ("report",)
RL_REWARDS: dict[str, str] = {"rl_full": "full", "rl_sql": "correctness"}  # stage -> reward.variant
Action = Literal["run", "resume", "reuse", "skip", "redo"]  # bapsql.train.experiments.stage_plan


@dataclass(frozen=True)
class Table2Config:
    """The experiment (module docstring). ``preset`` and ``reduced`` are set by `load_table2_config`."""

    train: TrainConfig
    prompting_model: Literal["base", "sft", "protocol"] = "base"
    prompting_conditions: tuple[str, ...] = ("raw", "dashboard", "adaptive_posthoc")
    reference_condition: str = "dashboard"
    description: str = ""
    protocol: ProtocolSettings | None = None
    preset: Literal["full", "quick"] = "full"
    reduced: tuple[str, ...] = ()  # what the quick preset changed, as "key: full value -> quick value"

    def __post_init__(self) -> None:
        from bapsql.env.conditions import check_conditions

        check_conditions(self.prompting_conditions, "prompting_conditions")
        if self.reference_condition not in self.prompting_conditions:
            raise ConfigError(f"reference_condition: {self.reference_condition!r} is not one of prompting_conditions "
                              f"{list(self.prompting_conditions)}")
        if (self.prompting_model == "protocol") != (self.protocol is not None):
            raise ConfigError("protocol: set it exactly when prompting_model is protocol (it trains that model), "
                              f"got prompting_model {self.prompting_model!r} and protocol "
                              f"{'set' if self.protocol is not None else 'missing'}")
        t = self.train
        if not (t.sft.enabled and t.grpo.enabled) or t.grpo.sft_init != "merged":
            raise ConfigError("train: Table 2 trains SFT and then GRPO from it: keep sft.enabled, grpo.enabled and "
                              "grpo.sft_init: merged")

    @property
    def report_dir(self) -> Path:
        return Path(self.train.out_dir) / f"{self.train.name}-table2"


@dataclass(frozen=True)
class Row:
    """One row of Table 2: ``key`` (the paper's row), its label, and the sweep method ``model:<engine>@<cond>``."""

    key: str
    label: str
    engine: str
    condition: str

    @property
    def method(self) -> str:
        return f"model:{self.engine}@{self.condition}"

    @property
    def logged(self) -> str:
        """The method as the logs and the analysis name it."""
        from bapsql.experiment import MODEL_PREFIX

        return f"{MODEL_PREFIX}{self.engine}@{self.condition}"


LABELS: dict[str, str] = {"raw": "Raw agent", "dashboard": "Dashboard", "adaptive_posthoc": "Adaptive post-hoc",
                          "full": "Full interface (prompted)", "sft": "BAP-SQL SFT", "sql_rl": "SQL-RL (matched)",
                          "bap_rl": "BAP-SQL RL"}


def table2_rows(cfg: Table2Config) -> tuple[Row, ...]:
    """The prompting rows (the base or SFT model under each prompting condition), then SFT, SQL-RL, BAP-SQL RL under
    the training condition."""
    cond = cfg.train.condition
    prompting = tuple(Row(c, LABELS.get(c, c), cfg.prompting_model, c) for c in cfg.prompting_conditions)
    return prompting + (Row("sft", LABELS["sft"], "sft", cond), Row("sql_rl", LABELS["sql_rl"], "sql_rl", cond),
                        Row("bap_rl", LABELS["bap_rl"], "bap_rl", cond))


def select_rows(cfg: Table2Config, keys: tuple[str, ...] | None) -> tuple[Row, ...]:
    """The rows ``keys`` names (``--rows``; None: every row), in `table2_rows` order; an unknown key is a
    `ConfigError` that lists the row keys."""
    rows = table2_rows(cfg)
    if keys is None:
        return rows
    known = [r.key for r in rows]
    bad = sorted(set(keys) - set(known))
    if bad or not keys:
        raise ConfigError(f"--rows: unknown row(s) {bad}; use a comma-separated subset of {','.join(known)}")
    return tuple(r for r in rows if r.key in keys)


# ------------------------------------------------------------------------------------------------------- loading
def _build(raw: dict, base_dir: Path, where: str, out_dir: str | None) -> Table2Config:
    raw = dict(raw)
    for key in ("preset", "reduced"):
        if key in raw:
            raise ConfigError(f"{where}: {key}: set by the loader (--quick), not by the file")
    train = raw.get("train")
    if not isinstance(train, dict):
        raise ConfigError(f"{where}: train: expected a training config mapping (e.g. extends: ../train/X.yaml)")
    if "seeds" in (train.get("eval") or {}):
        raise ConfigError(f"{where}: train.eval.seeds: leave it out; each training seed's models are evaluated "
                          "with that seed (train.seeds)")
    resolved = resolve_extends(train, base_dir, where=f"{where}: train")
    if out_dir is not None:
        resolved["out_dir"] = out_dir
    resolved["eval"] = {**(resolved.get("eval") or {}), "seeds": resolved.get("seeds", [0])}
    try:
        train_cfg = from_mapping(TrainConfig, resolved, "train")
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from exc
    try:
        return _with_train(raw, train_cfg)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from exc


def _with_train(raw: dict, train: TrainConfig) -> Table2Config:
    fields = {f.name for f in dataclasses.fields(Table2Config)} - {"train", "preset", "reduced"}
    unknown = sorted(set(raw) - fields - {"train"})
    if unknown:
        raise ConfigError(f"unknown key(s) {unknown} for Table2Config; allowed keys are "
                          f"{sorted(fields | {'train', 'quick'})}")
    checked = from_mapping(_Rest, {k: v for k, v in raw.items() if k != "train"})
    return Table2Config(train=train, **{f.name: getattr(checked, f.name) for f in dataclasses.fields(_Rest)})


@dataclass(frozen=True)
class _Rest:
    """The file's keys beside ``train``, type-checked by `from_mapping` (their defaults are Table2Config's)."""

    prompting_model: Literal["base", "sft", "protocol"] = "base"
    prompting_conditions: tuple[str, ...] = ("raw", "dashboard", "adaptive_posthoc")
    reference_condition: str = "dashboard"
    description: str = ""
    protocol: ProtocolSettings | None = None


def _train_extends_absolute(raw: dict, folder: Path) -> dict:
    """``raw`` with its ``train.extends`` and its ``quick.train.extends`` made absolute against ``folder`` (the
    folder of the file that wrote them), so that they still point there once a variant from another folder is
    merged over it."""
    train = raw.get("train")
    if isinstance(train, dict) and isinstance(train.get("extends"), str):
        raw = {**raw, "train": {**train, "extends": str(folder / train["extends"])}}
    quick = raw.get("quick")
    if isinstance(quick, dict) and isinstance(quick.get("train"), dict):
        raw = {**raw, "quick": _train_extends_absolute(quick, folder)}
    return raw


def load_table2_config(path: str | Path, *, quick: bool = False, out_dir: str | None = None) -> Table2Config:
    """Load the experiment strictly (unknown keys name themselves), the ``quick:`` preset validated too; with
    ``quick`` return the preset. ``out_dir`` overrides ``train.out_dir``."""
    p = Path(path)
    raw = read_raw(p, kind="experiment file", adjust=_train_extends_absolute)
    preset = raw.pop("quick", None)
    if preset is not None and not isinstance(preset, dict):
        raise ConfigError(f"{p}: quick: expected a mapping of the keys the preset changes")
    full = _build(raw, p.parent, str(p), out_dir)
    if preset is None:
        if quick:
            raise ConfigError(f"{p}: --quick: this config has no quick: preset")
        return full
    merged = deep_merge(raw, preset)
    small = _build(merged, p.parent, f"{p} (quick)", out_dir)
    before, after = flat_config(full.train), flat_config(small.train)
    reduced = tuple(f"train.{k}: {before.get(k)} -> {v}" for k, v in sorted(after.items()) if before.get(k) != v)
    top = ("prompting_model", "prompting_conditions", "reference_condition", "protocol")
    reduced += tuple(f"{k}: {getattr(full, k)} -> {getattr(small, k)}"
                     for k in top if getattr(full, k) != getattr(small, k))
    return dataclasses.replace(small, preset="quick", reduced=reduced) if quick else full


def rl_config(cfg: TrainConfig, stage: str) -> TrainConfig:
    """The training config of GRPO stage ``stage``: the same in everything but ``reward.variant``."""
    return dataclasses.replace(cfg, reward=dataclasses.replace(cfg.reward, variant=RL_REWARDS[stage]))


@dataclass(frozen=True)
class RLPair:
    """How Table 2's two RL stages of one seed started (their ``start.json``,
    `bapsql.train.recipe.pipeline.write_grpo_start`): ``same_start`` — the same SFT adapter (by hash) and init model;
    ``differences`` — the config keys in which they differ (``("reward.variant",)`` when only the reward does)."""

    sft_adapter_sha256: str | None
    same_start: bool
    differences: tuple[str, ...]


def rl_pair(cfg: Table2Config, seed: int) -> RLPair:
    """`RLPair` of seed ``seed`` from ``rl_full/start.json`` and ``rl_sql/start.json``; `ConfigError` when a stage
    has not started yet."""
    run = cfg.train.run_dir(seed)
    starts = []
    for stage in RL_REWARDS:
        path = run / stage / "start.json"
        if not path.is_file():
            raise ConfigError(f"{path}: missing; the {stage} stage writes it when it starts (run it first)")
        starts.append(json.loads(path.read_text()))
    a, b = starts
    keys = sorted(set(a["config"]) | set(b["config"]))
    diff = tuple(k for k in keys if a["config"].get(k) != b["config"].get(k))
    same = (a["sft_adapter_sha256"] is not None and a["sft_adapter_sha256"] == b["sft_adapter_sha256"]
            and a["init_model"] == b["init_model"])
    return RLPair(a["sft_adapter_sha256"], same, diff)


def trained_models(cfg: Table2Config, seed: int) -> dict[str, Path]:
    """Engine name -> merged model folder of the rows this experiment trains (the protocol model when it is one, SFT,
    SQL-RL, BAP-SQL RL); the folders exist once their stages ran."""
    from bapsql.train.recipe.pipeline import sft_dir

    run = cfg.train.run_dir(seed)
    models = {"sft": sft_dir(cfg.train, seed) / "merged", "sql_rl": run / "rl_sql" / "merged",
              "bap_rl": run / "rl_full" / "merged"}
    if cfg.prompting_model == "protocol":
        models = {"protocol": protocol_model_dir(cfg.train, seed), **models}
    return models


def eval_models(cfg: Table2Config, seed: int, console: Any = None,
                engines: tuple[str, ...] | None = None) -> dict[str, Path]:
    """Engine name -> merged model folder of the rows (`table2_rows`): `trained_models`, and the base model when it
    plays the prompting rows; only ``engines`` when given (the engines of the rows ``--rows`` evaluates)."""
    from bapsql.train.recipe.pipeline import base_model

    models = trained_models(cfg, seed)
    if cfg.prompting_model == "base" and (engines is None or "base" in engines):
        models = {"base": base_model(cfg.train, console, seed=seed), **models}
    if engines is not None:
        models = {name: path for name, path in models.items() if name in engines}
    for name, path in models.items():
        if not (path / "config.json").is_file():
            raise ConfigError(f"eval: no model for {name} at {path}; run the stages before eval")
    return models
