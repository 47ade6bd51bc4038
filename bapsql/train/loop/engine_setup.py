"""The rollout engine of a training stage: the recipe's ``rollout.engine`` mapping made into an `EngineConfig` for one
model folder, sized for the largest context budget it will serve (GRPO: the training levels; evaluation: its own)
or the model's own window when that is smaller (`bapsql.experiment.engine_len_need`),
with the recipe's ``model.chat_template_kwargs`` (the only place a recipe sets them)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bapsql.budgets import load_ladder
from bapsql.errors import ConfigError
from bapsql.experiment import engine_len_need
from bapsql.train.config import TrainConfig


def engine_config(cfg: TrainConfig, model: Path, *, lora: bool, levels: tuple[str, ...] | None = None) -> Any:
    """The rollout engine's `EngineConfig` serving ``model`` (with LoRA slots when ``lora``, unless the engine merges
    adapters into its weights: ``adapter_mode: merge``), long enough for the
    largest context budget of ``levels`` (default: the training levels; the evaluation passes its own)."""
    from bapsql.rollout.engines.base import load_engine_config

    ladder = load_ladder()
    need = engine_len_need(max(ladder[b].context_tokens for b in (levels or cfg.budgets.levels)), model)
    options = dict(cfg.model.chat_template_kwargs)
    own = cfg.rollout.engine.get("chat_template_kwargs")
    if own is not None and own != options:
        raise ConfigError(f"rollout.engine.chat_template_kwargs: {own} differs from model.chat_template_kwargs "
                          f"{options}; set the chat-template options once, under model.chat_template_kwargs (SFT "
                          "export, rollouts, the sync probe and evaluation all render with them)")
    raw = {"max_model_len": need, **cfg.rollout.engine, "model": str(model), "chat_template_kwargs": options}
    if lora and raw.get("adapter_mode", "lora") == "merge":
        if cfg.grpo.max_staleness > 0:
            raise ConfigError(f"rollout.engine.adapter_mode: merge serves one adapter version at a time, but "
                              f"grpo.max_staleness is {cfg.grpo.max_staleness} (pipelined rollouts sample with "
                              "older versions); use adapter_mode: lora, or max_staleness: 0")
    elif lora:
        raw.update(enable_lora=True, max_lora_rank=max(cfg.lora.rank, int(raw.get("max_lora_rank", 0) or 0)),
                   max_loras=max(cfg.grpo.max_staleness + 1, int(raw.get("max_loras", 1) or 1)))  # k+1 versions
    ec = load_engine_config(raw, "rollout.engine")
    if ec.max_model_len < need:
        raise ConfigError(f"rollout.engine.max_model_len: {ec.max_model_len} cannot hold the largest budget's "
                          f"context; set at least {need}")
    return ec
