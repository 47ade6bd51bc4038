"""Experiment configs: one YAML file fixes a whole evaluation sweep (methods × budgets × seeds × split × engines).

`load_experiment(path, **overrides)` reads the YAML strictly (`bapsql.config.from_mapping`: an unknown or
misspelled key, a missing key or a bad value raises `ConfigError` naming the key path) and checks the parts that
need the rest of the system: every method name is a known policy (`bapsql.policies.registry`) or a model policy
``model:<engine>`` whose engine is configured under ``engines`` (validated as `EngineConfig` s); every budget is a
level of the ladder; seeds are distinct; ``reference`` (optional) is one of the methods: the one the
analysis compares the others against (primary gates, Table 4 deltas, transitions; without it those are left
out). Method names are canonicalized to their path-safe log form ``POLICY@CONDITION``
(``workflow:estimate_rewrite`` → ``workflow.estimate_rewrite@full``, ``model:tiny@raw`` → ``model.tiny@raw``;
a method without a condition runs under ``full``, `bapsql.env.conditions`).

An engine's ``model`` is a local folder (the agents read its tokenizer and chat template there: download a hub
model into a folder first), ``builtin:tiny`` (the tiny Qwen-architecture model,
`bapsql.models.tiny`: seed 0, 16,384 positions, a short next-token pretraining, built on first use into the cache
dir) or a registry name such as ``smollm2-135m-instruct`` (fetched on first use); the sweep resolves it with
`bapsql.models.resolve.resolve_model`.
A model engine's ``max_model_len`` must hold the largest swept context budget (+ a small margin).

Example (configs/experiments/smoke.yaml)::

    run: smoke
    benchmark: demo
    split: dev
    limit: 8
    methods: [workflow:estimate_rewrite, scripted.drafter@raw, "model:tiny@full"]
    budgets: [XS, S]
    seeds: [0]
    engines:
      tiny: {kind: hf, model: "builtin:tiny"}
    sampling: {max_tokens: 64, temperature: 1.0}
    workers: {env_workers: 2}

``log_text`` (optional): which episodes' turns keep their completion / observation text in the logs
(`bapsql.logs.text.TextLogConfig`): ``{mode: all}`` (the default), ``{mode: sample, share: 0.1}`` or ``{mode: none}``.

``scopes`` (optional): per-method subsets of the sweep (`MethodScope`), for a method too costly to run over every
cell, e.g. a real model on a CPU machine beside scripted policies::

    scopes:
      "model:smol@full": {budgets: [XS, S], seeds: [0], tasks_per_db: 5}

A scoped method runs the sweep's cells restricted to its ``budgets`` (a subset of ``budgets``), its ``seeds`` (a
subset of ``seeds``) and the first ``tasks_per_db`` tasks of each database (of the tasks ``limit`` keeps, in the
split's order; every database keeps a share, so database-cluster statistics still see them all); an unset field keeps
the sweep's. The analysis pairs methods on the keys both ran (task × seed × budget), so a scoped method is compared
on its own cells only. A model engine's ``max_model_len`` must hold the largest context budget of the cells its
methods run.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from bapsql.config import from_mapping, read_yaml
from bapsql.errors import ConfigError
from bapsql.logs.text import TextLogConfig

MODEL_PREFIX = "model."
MODEL_LEN_MARGIN = 64  # prompt ids may exceed the env's context accounting by a few template tokens


def model_window(model: str | Path) -> int | None:
    """The context window (``max_position_embeddings`` of ``config.json``) of a local model folder; None when
    ``model`` is not one (a registry name not fetched yet, a hub id, a served model name)."""
    import json

    cfg = Path(model) / "config.json"
    if not cfg.is_file():
        return None
    window = json.loads(cfg.read_text()).get("max_position_embeddings")
    return int(window) if isinstance(window, (int, float)) and window > 0 else None


def engine_len_need(max_context: int, model: str | Path) -> int:
    """The ``max_model_len`` an engine serving ``model`` needs for a largest context budget of ``max_context``
    tokens: the budget plus `MODEL_LEN_MARGIN`, but no more than the model's own window (`model_window`). A model
    whose window is below the budget (SmolLM2's 8,192 positions against L's 11,000 context tokens) can never hold
    more than its window, whatever the budget allows: the window caps it. Its episodes play the level with the live
    context the window holds (`bapsql.rollout.agent.window_budget`), so the env's own accounting ends an episode
    that would overflow the window, as it ends one that would overflow the budget."""
    need = max_context + MODEL_LEN_MARGIN
    window = model_window(model)
    return need if window is None else min(need, window)


@dataclass(frozen=True)
class SamplingConfig:
    """How model policies sample (every model method of the sweep). ``template_kwargs``: chat-template options
    (e.g. ``enable_thinking: false``), the same a trained policy saw in SFT and GRPO; `validate` merges them into
    every engine's ``chat_template_kwargs`` (an engine may add its own), which its agent renders with and an
    ``openai_chat`` engine sends its server."""

    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    template_kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class WorkersConfig:
    """Actors and scheduling. CPUs are what each actor reserves on the cluster (fractions allowed).

    Placement on a cluster (cluster/README.md): ``env_resources`` / ``engine_resources`` are custom Ray resources
    each env worker / engine replica reserves, so only nodes started with them (``--resources``) host it (e.g.
    ``{engine_gpu: 1}`` on GPU nodes, none on the head); env workers are spread across nodes. ``writer``: ``driver``
    pins the trajectory writer to the driver's node (the run folder is a disk of that node), ``any`` lets it run on
    any node offering ``writer_resources`` (the run folder is on a volume every such node mounts at the same path;
    the writer then survives the loss of its node). On a multi-node cluster env workers stay off the head unless it
    offers the custom resources they ask for. An actor not placed on any node within ``placement_timeout_s`` fails
    the sweep at start (`bapsql.errors.PlacementError`). A vLLM engine actor reserves ``engine_gpus`` GPUs, which
    must equal its ``tensor_parallel_size`` (checked by `validate`). ``engine_phases``: run the sweep one engine at a
    time (`bapsql.rollout.phases`), each group of methods with its own actors, for a machine whose memory or cores
    do not hold every engine at once; the methods naming one engine always share its replicas."""

    env_workers: int = 2
    env_worker_cpus: float = 1.0
    engine_replicas: int = 1
    engine_cpus: float = 1.0
    engine_gpus: float = 0.0
    engine_threads: int = 1
    in_flight: int = 64
    scripted_batch: int = 4
    max_restarts: int = 3
    max_reruns: int = 3
    env_resources: dict[str, float] = field(default_factory=dict)
    engine_resources: dict[str, float] = field(default_factory=dict)
    writer: Literal["driver", "any"] = "driver"
    writer_resources: dict[str, float] = field(default_factory=dict)
    placement_timeout_s: float = 60.0  # an actor still not placed on any node after this fails the sweep
    engine_phases: bool = False

    def __post_init__(self) -> None:
        if self.placement_timeout_s <= 0:
            raise ConfigError(f"workers.placement_timeout_s: must be > 0, got {self.placement_timeout_s}")
        for name in ("env_workers", "engine_replicas", "engine_threads", "in_flight", "scripted_batch"):
            if getattr(self, name) < 1:
                raise ConfigError(f"workers.{name}: must be at least 1, got {getattr(self, name)}")
        for name in ("env_worker_cpus", "engine_cpus", "engine_gpus", "max_restarts", "max_reruns"):
            if getattr(self, name) < 0:
                raise ConfigError(f"workers.{name}: must be >= 0, got {getattr(self, name)}")
        if self.writer == "driver" and self.writer_resources:
            raise ConfigError("workers.writer_resources: only with workers.writer: any (a writer pinned to the "
                              "driver's node needs no resources to find it)")
        for name in ("env_resources", "engine_resources", "writer_resources"):
            for res, amount in getattr(self, name).items():
                if amount <= 0 or res in ("CPU", "GPU"):
                    raise ConfigError(f"workers.{name}.{res}: a custom resource with a positive amount "
                                      f"(CPUs and GPUs are *_cpus / *_gpus), got {amount}")


@dataclass(frozen=True)
class MethodScope:
    """The part of the sweep one method runs (module docstring): ``None`` keeps the sweep's budgets / seeds / tasks."""

    budgets: tuple[str, ...] | None = None
    seeds: tuple[int, ...] | None = None
    tasks_per_db: int | None = None

    def __post_init__(self) -> None:
        if self.budgets is not None and (not self.budgets or len(set(self.budgets)) != len(self.budgets)):
            raise ConfigError(f"budgets: a non-empty list of distinct levels (or null for the sweep's), got "
                              f"{list(self.budgets)}")
        if self.seeds is not None and (not self.seeds or len(set(self.seeds)) != len(self.seeds)):
            raise ConfigError(f"seeds: a non-empty list of distinct seeds (or null for the sweep's), got "
                              f"{list(self.seeds)}")
        if self.tasks_per_db is not None and self.tasks_per_db < 1:
            raise ConfigError(f"tasks_per_db: must be at least 1 (or null for every task), got {self.tasks_per_db}")

    def keeps(self, level: str, seed: int, rank_in_db: int) -> bool:
        """Whether the cell (``level``, ``seed``, the task that is ``rank_in_db``-th of its database) is in scope."""
        return ((self.budgets is None or level in self.budgets) and (self.seeds is None or seed in self.seeds)
                and (self.tasks_per_db is None or rank_in_db < self.tasks_per_db))


@dataclass(frozen=True)
class MonitorConfig:
    """Live metrics: ``wandb`` (offline when no API key is configured) or ``none``."""

    kind: Literal["wandb", "none"] = "none"
    project: str = "bapsql"


@dataclass(frozen=True)
class RayConfig:
    """Where to run. ``address`` None starts a private local Ray (own temp dir under the run's tmp folder, never
    ``ray stop``); ``auto`` or ``ray://…``/``host:port`` joins a cluster. ``num_cpus`` applies to a local Ray only
    (None: this machine's CPU count). ``preflight``: before any actor starts, check that every node of the cluster
    sees the benchmark folder and can write the run folder (`StorageError` naming the node otherwise)."""

    address: str | None = None
    num_cpus: int | None = None
    include_dashboard: bool = False
    preflight: bool = True  # at start: every node sees the benchmark and can write the run folder (StorageError)


@dataclass(frozen=True)
class ExperimentConfig:
    """One evaluation sweep (module docstring). ``limit``: first N tasks of the split, database by database;
    ``out_dir``: where the run's Parquet logs go (``{run}`` is replaced by the run name)."""

    run: str
    methods: tuple[str, ...]
    benchmark: str = "demo"
    demo_scale: Literal["small", "full"] = "small"
    split: str = "dev"
    limit: int | None = None
    budgets: tuple[str, ...] = ("XS", "S", "M", "L")
    seeds: tuple[int, ...] = (0, 1, 2)
    samples_per_group: int = 1
    engines: dict[str, Any] = field(default_factory=dict)
    sampling: SamplingConfig = SamplingConfig()
    workers: WorkersConfig = WorkersConfig()
    monitor: MonitorConfig = MonitorConfig()
    ray: RayConfig = RayConfig()
    token_counter: str = "default"
    out_dir: str = "runs/{run}"
    calibration: str | None = None  # estimator calibration JSON (`bapsql data calibrate`); None: the packaged one
    reference: str | None = None  # the analysis's reference method (one of methods); None: no reference sections
    prompt_style: Literal["full", "terse"] = "full"  # the env's system prompt (`EnvOptions.prompt_style`)
    # which episodes' turns keep their completion / observation text in the logs (`bapsql.logs.text`): all of them
    log_text: TextLogConfig = TextLogConfig()
    scopes: dict[str, MethodScope] = field(default_factory=dict)  # per-method subsets of the sweep (docstring)

    @property
    def model_methods(self) -> tuple[str, ...]:
        return tuple(m for m in self.methods if m.startswith(MODEL_PREFIX))

    def engine_of(self, method: str) -> str:
        """The engine name of a model method (``model.tiny@raw`` → ``tiny``)."""
        from bapsql.env.conditions import split_method

        return split_method(method)[0][len(MODEL_PREFIX):]

    def budgets_of(self, method: str) -> tuple[str, ...]:
        """The levels ``method`` runs (its scope's, else the sweep's)."""
        scope = self.scopes.get(method)
        return self.budgets if scope is None or scope.budgets is None else scope.budgets

    def scoped(self, specs: list[Any]) -> list[Any]:
        """The `EpisodeSpec` s the methods' scopes keep (order kept; methods without a scope keep every spec). A
        task's rank in its database is its position among the specs' tasks of that database in (db, task id)
        order — the split's order `load_tasks` gives."""
        if not self.scopes:
            return list(specs)
        by_db: dict[str, set[str]] = {}
        for s in specs:
            by_db.setdefault(s.db_id, set()).add(s.task_id)
        rank = {(db, t): i for db, ids in by_db.items() for i, t in enumerate(sorted(ids))}
        return [s for s in specs if (scope := self.scopes.get(s.method)) is None
                or scope.keeps(s.level, s.seed, rank[(s.db_id, s.task_id)])]

    @property
    def run_dir(self) -> Path:
        return Path(self.out_dir.replace("{run}", self.run))

    def to_dict(self) -> dict:
        """Plain data (for the monitor's config and the run's record)."""
        d = dataclasses.asdict(self)
        d["engines"] = {k: dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v
                        for k, v in self.engines.items()}
        return d


def _canonical_method(name: str, engines: dict[str, Any], where: str) -> str:
    from bapsql.env.conditions import split_method
    from bapsql.policies.registry import canonical_method, make_policy

    try:
        canon = canonical_method(name)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from exc
    policy = split_method(canon)[0]
    if policy.startswith(MODEL_PREFIX):
        engine = policy[len(MODEL_PREFIX):]
        if engine not in engines:
            raise ConfigError(f"{where}: model policy {name!r} names engine {engine!r}, but engines has "
                              f"{sorted(engines) or 'none'}; add it under engines:")
        return canon
    try:
        make_policy(policy)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from exc
    return canon


def with_template_kwargs(ec: Any, sampling: dict[str, Any], name: str) -> Any:
    """Engine ``name``'s config with ``sampling.template_kwargs`` merged into its ``chat_template_kwargs``: the
    options its agent renders prompts with and an ``openai_chat`` engine sends its server. `ConfigError` when both
    set one option to different values."""
    own = dict(ec.chat_template_kwargs)
    for key, value in sampling.items():
        if key in own and own[key] != value:
            raise ConfigError(f"engines.{name}.chat_template_kwargs.{key}: {own[key]!r} differs from "
                              f"sampling.template_kwargs.{key}: {value!r}; set it in one place")
    merged = {**own, **sampling}
    return ec if merged == own else dataclasses.replace(ec, chat_template_kwargs=merged)


def placebo_source_method(method: str) -> str | None:
    """For a placebo method ``P@C`` (``estimates: permuted``), the method whose logged estimates it permutes (the same
    policy under `bapsql.env.conditions.placebo_source`); None for any other method."""
    from bapsql.env.conditions import condition, method_name, placebo_source, split_method

    policy, cond = split_method(method)
    if condition(cond).estimates != "permuted":
        return None
    return method_name(policy, placebo_source(cond))


def validate(cfg: ExperimentConfig) -> ExperimentConfig:
    """Cross-field checks (module docstring); returns the config with canonical method names and typed engines."""
    from bapsql.budgets import load_ladder

    if not cfg.run or "/" in cfg.run:
        raise ConfigError(f"run: must be a non-empty name without '/', got {cfg.run!r}")
    if not cfg.methods:
        raise ConfigError("methods: list at least one policy (see `bapsql policies`) or model:<engine>")
    engines = {}
    if cfg.engines:
        try:
            from bapsql.rollout.engines.base import EngineConfig
        except ImportError as exc:  # pragma: no cover - the engines package ships with bapsql
            raise ConfigError(f"engines: the engine package is unavailable ({exc})") from exc
        for name, raw in cfg.engines.items():
            ec = raw if isinstance(raw, EngineConfig) else from_mapping(EngineConfig, raw, f"engines.{name}")
            engines[name] = with_template_kwargs(ec, cfg.sampling.template_kwargs, name)
            if ec.kind == "vllm":
                from bapsql.rollout.placement import check_engine_gpus

                check_engine_gpus(cfg.workers.engine_gpus, ec.tensor_parallel_size,
                                  ("workers.engine_gpus", f"engines.{name}.tensor_parallel_size"))
    methods = tuple(_canonical_method(m, engines, f"methods[{i}]") for i, m in enumerate(cfg.methods))
    if len(set(methods)) != len(methods):
        raise ConfigError(f"methods: duplicates after canonicalization: {list(methods)}")
    reference = None if cfg.reference is None else _canonical_method(cfg.reference, engines, "reference")
    if reference is not None and reference not in methods:
        raise ConfigError(f"reference: {cfg.reference!r} is not one of the methods {list(methods)}")
    ladder = load_ladder()
    for i, b in enumerate(cfg.budgets):
        if b not in ladder.levels:
            raise ConfigError(f"budgets[{i}]: unknown level {b!r}; levels are {list(ladder.levels)}")
    if not cfg.budgets:
        raise ConfigError("budgets: list at least one level, e.g. [XS, S, M, L]")
    scopes = {}
    for key, scope in cfg.scopes.items():
        where = f"scopes.{key}"
        method = _canonical_method(key, engines, where)
        if method not in methods:
            raise ConfigError(f"{where}: {key!r} is not one of the methods {list(methods)}")
        if method in scopes:
            raise ConfigError(f"{where}: a second scope for {method}")
        for i, b in enumerate(scope.budgets or ()):
            if b not in cfg.budgets:
                raise ConfigError(f"{where}.budgets[{i}]: {b!r} is not a swept level {list(cfg.budgets)}; a scope "
                                  "narrows the sweep")
        for i, s in enumerate(scope.seeds or ()):
            if s not in cfg.seeds:
                raise ConfigError(f"{where}.seeds[{i}]: {s} is not a swept seed {list(cfg.seeds)}; a scope narrows "
                                  "the sweep")
        scopes[method] = scope
    cfg = dataclasses.replace(cfg, scopes=scopes)
    for m in methods:
        if m.startswith(MODEL_PREFIX):
            name = cfg.engine_of(m)
            ec = engines[name]
            need = engine_len_need(max(ladder[b].context_tokens for b in cfg.budgets_of(m)), ec.model)
            if ec.max_model_len < need:
                raise ConfigError(f"engines.{name}.max_model_len: {ec.max_model_len} cannot hold the "
                                  f"largest context budget {m} runs; set it to at least {need}, or narrow its "
                                  "levels under scopes:")
    for m in methods:
        source = placebo_source_method(m)
        if source is not None and source not in methods:
            raise ConfigError(f"methods: {m} shows permuted estimates (the placebo); its payloads are recorded from "
                              f"{source}, which the sweep must run too — add it to methods")
    if cfg.calibration is not None and not Path(cfg.calibration).is_file():
        raise ConfigError(f"calibration: {cfg.calibration} is not a file; fit one with `bapsql data calibrate "
                          "--out FILE` or remove the key for the packaged calibration")
    if not cfg.seeds or len(set(cfg.seeds)) != len(cfg.seeds):
        raise ConfigError(f"seeds: must be a non-empty list of distinct integers, got {list(cfg.seeds)}")
    if cfg.samples_per_group < 1:
        raise ConfigError(f"samples_per_group: must be at least 1, got {cfg.samples_per_group}")
    if cfg.limit is not None and cfg.limit < 1:
        raise ConfigError(f"limit: must be at least 1 (or null for every task), got {cfg.limit}")
    return dataclasses.replace(cfg, methods=methods, engines=engines, reference=reference)


def load_experiment(path: str | Path, **overrides: Any) -> ExperimentConfig:
    """Read and validate an experiment YAML; ``overrides`` replace top-level keys (e.g. ``out_dir``)."""
    raw = read_yaml(path)
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: an experiment config is a mapping of keys (run, methods, budgets, ...)")
    raw = {**raw, **{k: v for k, v in overrides.items() if v is not None}}
    return validate(from_mapping(ExperimentConfig, raw))

