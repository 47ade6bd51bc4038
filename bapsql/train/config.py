"""Strict training configuration (DESIGN §5): one YAML file per run family, loaded with `load_train_config`.

Layout (every key is checked by `bapsql.config.from_mapping`; unknown or ill-typed keys raise `ConfigError` naming
the key path; ``extends: main_4b.yaml`` inherits another config and overrides keys)::

    name: main-4b                 # run family name; a run is <name>-seed<k>
    seeds: [0, 1, 2]              # one adapter per seed
    out_dir: runs/train           # <out_dir>/<name>-seed<k>/{sft,grpo,eval}
    model: {base: PATH | builtin:tiny | REGISTRY-NAME (smollm2-135m-instruct), dtype, device, threads,
            gradient_checkpointing, remote_learner, ...}
    lora: {rank: 32, alpha: 64, dropout: 0.0, target_modules: null (attention + MLP projections) | [q_proj, ...]}
    data: {benchmark: demo | PATH, split: train, eval_split: dev}
    pretrain: {enabled, hidden_size, num_layers, ..., augment_rounds, corpus_episodes, steps, batch, lr}
    prompt_style: full | terse    # the env's system prompt in SFT export, rollouts and evaluation
    sft: {enabled, data: PARQUET, export_pairs, lr: 1e-4, effective_batch: 128, micro_batch_tokens, max_length:
          8192, epochs: 1, warmup_steps, num_workers, use_gpu, strategy: ddp | fsdp, workflows, budgets,
          per_episode, only_successes, shared, slips: JSONL | null (a policy's own failed first queries,
          `python -m jobs.harvest_slips`, replayed by workflow.recover_from_error), branch_tries: 0,
          gradient_checkpointing: null (model's)}
    grpo: {enabled, lr: 1e-6, updates: 120, temperature: 1.0, top_p: 0.95, max_new_tokens, advantage_scale,
           loss: {clip_low, clip_high, is_cap, kl_coef}, micro_batch_tokens, max_grad_norm, trainable_actions,
           sft_init: merged | none, max_staleness: 0 (k >= 1: pipelined, bapsql.train.loop.overlap),
           epochs: 1, mini_batches: 1 (optimizer steps per update: their product, bapsql.train.learner.minibatch),
           prompts: split | augmented (fresh questions, bapsql.train.loop.grpo_data.grpo_tasks), prompt_rounds: 4,
           empty_gold: exclude | include (tasks whose gold query returns no rows: [] is correct without evidence),
           schedule: constant | linear | cosine (over updates x epochs x mini_batches optimizer steps),
           validate_every: 0 (N: greedy validation every N updates, bapsql.train.loop.validation), validation_tasks: 64,
           keep: last | best (the validated best update is the stage's policy),
           keep_validated: best | all (validated adapters left when the stage ends),
           gradient_checkpointing: null (model's)}
    condition: full               # the condition (bapsql.env.conditions) of SFT export, rollouts and evaluation
    calibration: PATH | null      # estimator calibration JSON (`bapsql data calibrate --out`); null: the packaged one
    reward: {variant: full | no_efficiency | correctness, evidence_weight: 0.4, otc_c: 1.0}
    filter: {group_size: 8, min_success: 2, max_success: 6, groups_per_update: 16, max_rounds, ...}
    budgets: {levels: [XS, S, M, L], weights: null}
    rollout: {engine: {...}, env_workers, env_resources, engine_replicas, engine_gpus (= engine.tensor_parallel_size
              for vllm), in_flight, placement_timeout_s: 60, ray_address, num_cpus, use_ray, ...,
              log_text: {mode: sample, share: 0.1}}   # turn text of training rollouts' logs (bapsql.logs.text)
    sync: {tolerance: null (measured at the first sync), tolerance_factor, tolerance_floor, tolerance_ceiling,
           max_tolerance, delta_tolerance, probe_completion_tokens}
    checkpoint: {every: 10, keep: 3}
    monitor: {kind: wandb | none | memory, project}
    eval: {enabled, budgets, seeds, limit, conditions: [] (default: the training condition),
           log_text: {mode: all}}   # turn text of the evaluation sweep's logs

``rollout.engine`` is the engine helper's `EngineConfig` mapping (kind vllm | hf, ...) without the model path,
which the training stage fills in (the SFT-merged model; the adapter is loaded by weight sync).

The learner's own settings (`LearnerConfig` with its `OptimConfig` and `LoraSpec`, `Dtype`, `LORA_TARGETS`), which
`TrainConfig.learner_config` derives, live in `bapsql.train.learner.config`; the ``extends:`` merging
(`resolve_extends`) in `bapsql.train.extends`; the ``sync:`` section (`SyncSection`) in
`bapsql.train.learner.weight_sync`; the ``pretrain:`` section (`PretrainSection`) in `bapsql.train.pretrain_config`.
All are re-exported here, so those names keep this import path. The generic strict loader (`from_mapping`,
`read_yaml`) is `bapsql.config`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from bapsql.budgets import LEVELS
from bapsql.config import from_mapping
from bapsql.errors import ConfigError
from bapsql.logs.text import TextLogConfig
from bapsql.train.algo.filter import FilterConfig
from bapsql.train.algo.grpo import LossConfig
from bapsql.train.algo.reward import RewardConfig
from bapsql.train.extends import read_raw, resolve_extends  # noqa: F401 (re-exported)
from bapsql.train.learner.config import (  # noqa: F401 (LORA_TARGETS: re-exported)
    LORA_TARGETS,
    Dtype,
    LearnerConfig,
    LoraSpec,
    OptimConfig,
)
from bapsql.train.learner.weight_sync import SyncSection  # noqa: F401 (re-exported)
from bapsql.train.pretrain_config import PretrainSection  # noqa: F401 (re-exported)


@dataclass(frozen=True)
class ModelSection:
    base: str  # a transformers folder, "builtin:tiny" or a registry name (bapsql.models.resolve.resolve_model)
    dtype: Dtype = "auto"  # 16-bit on a GPU, float32 on the CPU (bapsql.models.dtype)
    device: str = "auto"
    threads: int | None = None
    gradient_checkpointing: bool = False
    remote_learner: bool = False  # run the GRPO learner in a Ray actor (a GPU node on a cluster)
    learner_gpus: float = 0.0
    learner_cpus: float = 1.0
    logprob_chunk_tokens: int | None = None  # learner: positions per LM-head chunk (null: auto; 0: full logits)
    # chat-template options (e.g. {enable_thinking: false} for Qwen3-class templates), used alike by the SFT export,
    # the rollouts and the weight-sync probe
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class DataSection:
    benchmark: str = "demo"
    split: str = "train"
    eval_split: str = "dev"
    limit: int | None = None  # first N training tasks (smoke runs)


@dataclass(frozen=True)
class SFTSection:
    enabled: bool = True
    data: str | None = None  # Parquet from `bapsql sft-data`; exported into the run dir when missing
    export_pairs: int = 8192
    lr: float = 1e-4
    effective_batch: int = 128
    micro_batch_tokens: int = 16_384
    max_length: int = 8192
    epochs: int = 1
    warmup_steps: int = 0
    schedule: Literal["constant", "linear", "cosine"] = "constant"
    num_workers: int = 1
    use_gpu: bool = False
    strategy: Literal["ddp", "fsdp"] = "ddp"
    workflows: tuple[str, ...] | None = None  # null: all nine workflows
    budgets: tuple[str, ...] = LEVELS  # the levels episodes are drawn at
    per_episode: bool = False  # one sequence per episode, every completion in the loss (else turn pairs)
    only_successes: bool = False  # keep budgeted successes only (no justified abstentions)
    # k >= 1: estimate_rewrite, justified_abstention and recover_after_rejection play up to k episodes for one that
    # takes their budget-aware branch (a rewrite, an abstention) before the rotation moves on (bapsql.policies.
    # sft_export); 0: every episode counts, and most of theirs play the plain path
    branch_tries: int = 0
    # a slip bank (`python -m jobs.harvest_slips`): workflow.recover_from_error episodes play its tasks with a
    # policy's own failed first queries instead of synthetic misnamed columns
    slips: str | None = None
    # one SFT model for every seed: the first seed's, trained once (<out_dir>/<name>-seed<seeds[0]>/sft); the
    # seeds then differ in GRPO only, so a pooled GRPO − SFT comparison measures GRPO's variance, not SFT's
    shared: bool = False
    # export under each of these conditions in equal shares, with a `condition` column (empty: the recipe's
    # `condition`); e.g. Table 2's protocol-only adapter plays raw, dashboard and adaptive_posthoc alike
    conditions: tuple[str, ...] = ()
    # recompute each layer in the backward pass instead of keeping its activations (null: model.gradient_checkpointing):
    # the same gradients at about 1.3-1.5x the time, for sequences too long for memory
    gradient_checkpointing: bool | None = None

    def __post_init__(self) -> None:
        if self.effective_batch < 1 or self.epochs < 1 or self.num_workers < 1 or self.max_length < 2:
            raise ConfigError("sft: effective_batch, epochs and num_workers must be >= 1, max_length >= 2")
        if self.branch_tries < 0:
            raise ConfigError(f"sft.branch_tries: must be >= 0 (0: off), got {self.branch_tries}")
        if self.effective_batch % self.num_workers:
            raise ConfigError(f"sft.effective_batch ({self.effective_batch}) must divide by num_workers "
                              f"({self.num_workers})")


@dataclass(frozen=True)
class GRPOSection:
    enabled: bool = True
    lr: float = 1e-6
    updates: int = 120
    temperature: float = 1.0
    top_p: float = 0.95
    max_new_tokens: int = 512
    advantage_scale: Literal["std", "none"] = "std"
    loss: LossConfig = LossConfig()
    micro_batch_tokens: int = 16_384
    max_grad_norm: float = 1.0
    warmup_steps: int = 0
    # Context-only RL: the loss covers only turns whose action is listed (null = every policy turn).
    trainable_actions: tuple[str, ...] | None = None
    sft_init: Literal["merged", "none"] = "merged"
    log_drift: bool = False  # log KL(policy ‖ SFT) on each update's samples (one extra no-grad forward)
    # 0: synchronous updates. k >= 1: rollouts for the next k updates overlap the learner; groups sampled more than
    # k versions ago are never trained (bapsql.train.loop.overlap)
    max_staleness: int = 0
    # optimizer steps per update = epochs x mini_batches over the update's batch (bapsql.train.learner.minibatch);
    # 1 x 1: one step, the ratio to the rollout policy is 1 in value
    epochs: int = 1
    mini_batches: int = 1
    # where GRPO's prompts come from: "split" = data.split's tasks (the tasks SFT was fit on); "augmented" = fresh
    # questions of the same templates on the same databases (bapsql.data.augment, prompt_rounds rounds, never a
    # data.eval_split question), so the reward pays for copying this episode's values, not for recalling answers
    # SFT memorised (bapsql.train.loop.grpo_data.grpo_tasks)
    prompts: Literal["split", "augmented"] = "split"
    prompt_rounds: int = 4
    # tasks whose gold query returns no rows (bapsql.data.benchmark.empty_gold): an answer of [] is correct there
    # without any evidence, which RL learns to exploit; "exclude" leaves them out of GRPO's prompts (how many:
    # <grpo>/prompts.json), "include" puts them back
    empty_gold: Literal["exclude", "include"] = "exclude"
    # the learning rate over the run's optimizer steps (updates x epochs x mini_batches), after warmup_steps;
    # "cosine" ends near 0, so the last updates' few noisy groups cannot throw the final policy far
    schedule: Literal["constant", "linear", "cosine"] = "constant"
    # in-loop validation (bapsql.train.loop.validation): every validate_every updates (and before the first) the policy
    # plays validation_tasks fresh questions on data.split's databases, as the evaluation plays (eval.temperature,
    # eval.max_new_tokens), at budgets.levels; 0 = off. keep: which policy the stage saves as grpo/{adapter,merged}:
    # "last" (after grpo.updates) or "best" (the validated update with the highest success, the earliest on a tie;
    # update 0 is the SFT policy itself). keep_validated: which validated adapters (<grpo>/validated/update-N) stay
    # once the stage has finished: "best" (the best validated update's; records stay in validation.jsonl) or "all"
    validate_every: int = 0
    validation_tasks: int = 64
    keep: Literal["last", "best"] = "last"
    keep_validated: Literal["best", "all"] = "best"
    gradient_checkpointing: bool | None = None  # null: model.gradient_checkpointing (as SFTSection's)

    def __post_init__(self) -> None:
        if self.validate_every < 0 or self.validation_tasks < 1:
            raise ConfigError(f"grpo.validate_every must be >= 0 (0 = off) and grpo.validation_tasks >= 1, got "
                              f"{self.validate_every} and {self.validation_tasks}")
        if self.keep == "best" and not self.validate_every:
            raise ConfigError("grpo.keep: best needs validation to choose by; set grpo.validate_every (e.g. 5) or "
                              "keep: last")
        if self.validate_every and self.max_staleness:
            raise ConfigError("grpo.validate_every: validation runs between synchronous updates; with "
                              "grpo.max_staleness >= 1 rollouts of later updates are in flight. Set one of them to 0")
        if self.prompt_rounds < 1:
            raise ConfigError(f"grpo.prompt_rounds: must be >= 1, got {self.prompt_rounds}")
        if self.epochs < 1 or self.mini_batches < 1:
            raise ConfigError(f"grpo.epochs and grpo.mini_batches must be >= 1 (optimizer steps per update = their "
                              f"product), got {self.epochs} and {self.mini_batches}")
        if self.max_staleness < 0:
            raise ConfigError(f"grpo.max_staleness: must be >= 0 (0 = synchronous), got {self.max_staleness}")
        if self.updates < 0 or self.max_new_tokens < 1 or self.lr <= 0:
            raise ConfigError("grpo: updates must be >= 0, max_new_tokens >= 1, lr > 0")
        if not 0 < self.top_p <= 1 or self.temperature < 0:
            raise ConfigError("grpo: top_p must be in (0, 1] and temperature >= 0")


@dataclass(frozen=True)
class BudgetSection:
    levels: tuple[str, ...] = LEVELS
    weights: tuple[float, ...] | None = None


@dataclass(frozen=True)
class RolloutSection:
    engine: dict[str, Any] = field(default_factory=lambda: {"kind": "vllm"})
    env_workers: int = 2
    env_worker_cpus: float = 1.0
    # custom Ray resources each env worker reserves (e.g. {env_node: 1}: only nodes offering it host one; on a
    # multi-node cluster env workers stay off the head unless it offers them, cluster/README.md)
    env_resources: dict[str, float] = field(default_factory=dict)
    engine_replicas: int = 1
    engine_gpus: float = 0.0  # GPUs each engine actor reserves: engine.tensor_parallel_size of them for vLLM
    engine_threads: int = 1
    in_flight: int = 64
    placement_timeout_s: float = 60.0  # an actor (env worker, engine, writer, learner) unplaced longer fails the job
    ray_address: str | None = None  # None: a private local Ray started by the job; "auto": join the cluster
    num_cpus: int | None = None  # CPUs of a private local Ray
    use_ray: bool = True  # False: the same actors in-process (tests, debugging)
    write_trajectories: bool = True  # log every training trajectory as Parquet under <run>/grpo/rollouts
    method: str = "model.policy"  # the method name rollouts are logged under
    # which training episodes' turns keep their completion / observation text (bapsql.logs.text): a deterministic
    # tenth by episode id — rollouts are many (groups x samples x updates) and mostly read in aggregate, while a
    # tenth still shows every update's failure modes; set {mode: all} to debug a run, {mode: none} to save space
    log_text: TextLogConfig = TextLogConfig(mode="sample", share=0.1)

    def __post_init__(self) -> None:
        if self.env_workers < 1 or self.engine_replicas < 1 or self.in_flight < 1:
            raise ConfigError("rollout: env_workers, engine_replicas and in_flight must be >= 1")
        if "model" in self.engine:
            raise ConfigError("rollout.engine.model: leave it out; the training stage serves its own model")
        if self.placement_timeout_s <= 0:
            raise ConfigError(f"rollout.placement_timeout_s: must be > 0, got {self.placement_timeout_s}")
        for res, amount in self.env_resources.items():
            if amount <= 0 or res in ("CPU", "GPU"):
                raise ConfigError(f"rollout.env_resources.{res}: a custom resource with a positive amount (CPUs are "
                                  f"rollout.env_worker_cpus), got {amount}")
        if self.engine.get("kind", "vllm") == "vllm":
            from bapsql.rollout.placement import check_engine_gpus

            check_engine_gpus(self.engine_gpus, int(self.engine.get("tensor_parallel_size", 1)),
                              ("rollout.engine_gpus", "rollout.engine.tensor_parallel_size"))


@dataclass(frozen=True)
class CheckpointSection:
    every: int = 10
    keep: int = 3

    def __post_init__(self) -> None:
        if self.every < 1 or self.keep < 1:
            raise ConfigError("checkpoint: every and keep must be >= 1")


@dataclass(frozen=True)
class MonitorSection:
    kind: Literal["wandb", "none", "memory"] = "wandb"
    project: str = "bapsql"


@dataclass(frozen=True)
class EvalSection:
    """The evaluation sweep after training: the SFT and the GRPO policy (merged folders) on ``data.eval_split``,
    then the analysis report (bapsql.analysis) over that sweep."""

    enabled: bool = False
    budgets: tuple[str, ...] = LEVELS
    seeds: tuple[int, ...] = (0,)
    limit: int | None = None
    max_new_tokens: int = 256
    temperature: float = 0.0
    replicates: int = 1000  # bootstrap replicates of the analysis
    conditions: tuple[str, ...] = ()  # conditions to evaluate under (empty: the training condition only)
    reference: str | None = "sft"  # the evaluated policy (sft / grpo) the report compares the other against
    extra_splits: tuple[str, ...] = ()  # more splits swept and reported separately (report_<split>/), e.g. [dev]
    samples_per_group: int = 1  # episodes per (task, budget, seed): >1 with temperature > 0
    top_p: float = 1.0
    log_text: TextLogConfig = TextLogConfig()  # the sweep's turn text (bapsql.logs.text): every episode's
    # one model at a time (`bapsql.rollout.phases`): for a machine whose memory or cores do not hold every engine
    engine_phases: bool = False


@dataclass(frozen=True)
class TrainConfig:
    """One training recipe (see the module docstring)."""

    name: str
    model: ModelSection
    seeds: tuple[int, ...] = (0,)
    out_dir: str = "runs/train"
    lora: LoraSpec = LoraSpec()
    data: DataSection = DataSection()
    sft: SFTSection = SFTSection()
    grpo: GRPOSection = GRPOSection()
    reward: RewardConfig = RewardConfig()
    filter: FilterConfig = FilterConfig()
    budgets: BudgetSection = BudgetSection()
    rollout: RolloutSection = RolloutSection()
    sync: SyncSection = SyncSection()
    checkpoint: CheckpointSection = CheckpointSection()
    monitor: MonitorSection = MonitorSection()
    eval: EvalSection = EvalSection()
    condition: str = "full"  # the condition SFT export, GRPO rollouts and (by default) evaluation run under
    calibration: str | None = None  # estimator calibration JSON of rollouts and evaluation (None: the packaged one)
    pretrain: PretrainSection = PretrainSection()
    prompt_style: Literal["full", "terse"] = "full"  # `EnvOptions.prompt_style`, in SFT export, rollouts and eval
    description: str = ""

    def __post_init__(self) -> None:
        from bapsql.env.conditions import check_conditions

        check_conditions(self.condition, "condition")
        for key in ("eval", "sft", "pretrain"):
            check_conditions(getattr(self, key).conditions, f"{key}.conditions")
        if self.calibration is not None and not Path(self.calibration).is_file():
            raise ConfigError(f"calibration: {self.calibration} is not a file; fit one with `bapsql data calibrate "
                              "--out FILE` or remove the key for the packaged calibration")
        if not self.seeds:
            raise ConfigError("seeds: list at least one seed")
        if not self.name or "/" in self.name:
            raise ConfigError(f"name: must be a non-empty path-safe name, got {self.name!r}")
        unknown = sorted(set(self.budgets.levels) - set(LEVELS))
        if unknown:
            raise ConfigError(f"budgets.levels: unknown level(s) {unknown}; use {list(LEVELS)}")

    def run_dir(self, seed: int) -> Path:
        return Path(self.out_dir) / f"{self.name}-seed{seed}"

    def learner_config(self, model_path: str | Path, stage: Literal["sft", "grpo"], *, seed: int,
                       total_steps: int, adapter_path: str | None = None) -> LearnerConfig:
        """The learner settings of ``stage`` on ``model_path``. ``total_steps``: SFT's optimizer steps, or GRPO's
        updates (each ``grpo.epochs`` x ``grpo.mini_batches`` optimizer steps, the schedule's unit)."""
        s = self.sft if stage == "sft" else self.grpo
        checkpointing = self.model.gradient_checkpointing if s.gradient_checkpointing is None else \
            s.gradient_checkpointing
        if stage == "grpo":
            total_steps *= self.grpo.epochs * self.grpo.mini_batches
        # GRPO's learner scores the tokens under the distribution they were sampled from: logits / T over the top-p
        # nucleus (the engines' processed logprobs); greedy rollouts report the raw distribution (T = 1, no nucleus)
        sampled = stage == "grpo" and self.grpo.temperature > 0
        temperature = self.grpo.temperature if sampled else 1.0
        top_p = self.grpo.top_p if sampled else 1.0
        optim = OptimConfig(lr=s.lr, warmup_steps=s.warmup_steps,
                            schedule=self.sft.schedule if stage == "sft" else self.grpo.schedule,
                            total_steps=max(1, total_steps),
                            max_grad_norm=self.grpo.max_grad_norm if stage == "grpo" else 1.0)
        return LearnerConfig(model_path=str(model_path), lora=self.lora, optim=optim, adapter_path=adapter_path,
                             micro_batch_tokens=s.micro_batch_tokens, dtype=self.model.dtype,
                             device=self.model.device, threads=self.model.threads,
                             gradient_checkpointing=checkpointing, seed=seed,
                             temperature=temperature, top_p=top_p,
                             logprob_chunk_tokens=self.model.logprob_chunk_tokens)


def load_train_config(path: str | Path, overrides: dict[str, Any] | None = None) -> TrainConfig:
    """Load a training YAML strictly. ``extends: other.yaml`` (relative to the file) inherits every key of that
    config and overrides what this file sets (mappings merge key by key; lists and values replace).
    ``overrides`` (dotted keys → values) are applied last."""
    raw = read_raw(Path(path))
    for dotted, value in (overrides or {}).items():
        node = raw
        *parents, leaf = dotted.split(".")
        for p in parents:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {dotted}: {p} is not a mapping")
        node[leaf] = value
    try:
        return from_mapping(TrainConfig, raw)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from exc
