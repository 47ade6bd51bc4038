"""The protocol-only adapter of Table 2's prompting rows (issue 34). An instruct model that cannot act zero-shot
(SmolLM2-135M-Instruct: 120 of 120 turns invalid under `raw` and under `full`, README "SmolLM2-135M-Instruct") learns
the tool format and valid actions, and nothing of the budget-aware behaviour, before it is prompted under Raw,
Dashboard and Adaptive post-hoc.

What it is trained on (``ProtocolSettings``): SFT episodes of budget-blind workflows only (by default
``workflow.direct_aggregation`` — execute the gold query, answer citing it — and ``workflow.schema_first`` — inspect
the tables first), never those that estimate, rewrite, manage evidence or abstain, played in equal shares under each
prompting condition (so no row's prompt format is the one it saw more) at the listed budgets. The SFT itself is the
training config's (LoRA, learning rate, batch), with the settings below in place of ``sft.workflows``,
``sft.budgets``, ``sft.conditions``, ``sft.export_pairs`` and ``sft.epochs``; its run is
``<out_dir>/<name>-protocol-seed<k>`` (the first seed's with ``sft.shared``), its merged model ``.../sft/merged``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bapsql.errors import ConfigError
from bapsql.train.config import TrainConfig

# the workflows that adapt to the budget (paper "Training"): a protocol-only adapter must not see them
BUDGET_AWARE: frozenset[str] = frozenset({
    "workflow.estimate_rewrite", "workflow.drill_down", "workflow.evidence_compression",
    "workflow.justified_abstention", "workflow.restore_after_archive", "workflow.recover_after_rejection"})


@dataclass(frozen=True)
class ProtocolSettings:
    """The protocol-only SFT (module docstring). ``conditions``: the prompting conditions whose prompts it plays, in
    equal shares (``export_pairs`` split evenly); ``only_successes`` keeps budgeted successes only."""

    workflows: tuple[str, ...] = ("workflow.direct_aggregation", "workflow.schema_first")
    conditions: tuple[str, ...] = ("raw", "dashboard", "adaptive_posthoc")
    budgets: tuple[str, ...] = ("XS", "S", "M", "L")
    export_pairs: int = 96
    epochs: int = 1

    def __post_init__(self) -> None:
        from bapsql.budgets import LEVELS
        from bapsql.env.conditions import check_conditions
        from bapsql.policies.registry import WORKFLOW_NAMES

        for key in ("workflows", "conditions", "budgets"):
            if not getattr(self, key):
                raise ConfigError(f"protocol.{key}: list at least one")
        for i, w in enumerate(self.workflows):
            if w not in WORKFLOW_NAMES:
                raise ConfigError(f"protocol.workflows[{i}]: {w!r} is not a workflow; "
                                  f"use one of {list(WORKFLOW_NAMES)}")
            if w in BUDGET_AWARE:
                raise ConfigError(f"protocol.workflows[{i}]: {w} adapts to the budget; a protocol-only adapter trains "
                                  f"on budget-blind workflows ({sorted(set(WORKFLOW_NAMES) - BUDGET_AWARE)})")
        check_conditions(self.conditions, "protocol.conditions")
        for i, b in enumerate(self.budgets):
            if b not in LEVELS:
                raise ConfigError(f"protocol.budgets[{i}]: {b!r} is not a budget level; use one of {list(LEVELS)}")
        if self.export_pairs < len(self.conditions):
            raise ConfigError(f"protocol.export_pairs: {self.export_pairs} is fewer than one pair per condition "
                              f"({len(self.conditions)})")
        if self.epochs < 1:
            raise ConfigError(f"protocol.epochs: must be at least 1, got {self.epochs}")


def _own_run(train: TrainConfig) -> TrainConfig:
    """``train`` under the protocol SFT's own run name (``<name>-protocol``)."""
    return dataclasses.replace(train, name=f"{train.name}-protocol")


def protocol_train_config(train: TrainConfig, settings: ProtocolSettings) -> TrainConfig:
    """The training config of the protocol SFT: ``train`` with its own run name and the protocol's SFT settings."""
    sft = dataclasses.replace(train.sft, workflows=settings.workflows, budgets=settings.budgets,
                              conditions=settings.conditions, export_pairs=settings.export_pairs,
                              epochs=settings.epochs, data=None, slips=None, branch_tries=0)
    return dataclasses.replace(_own_run(train), sft=sft)


def protocol_model_dir(train: TrainConfig, seed: int) -> Path:
    """The merged protocol-only model of seed ``seed`` (a folder; it exists once the stage ran)."""
    from bapsql.train.recipe.pipeline import sft_dir

    return sft_dir(_own_run(train), seed) / "merged"


def run_protocol_stage(train: TrainConfig, settings: ProtocolSettings, seed: int, *, console: Any = None) -> Path:
    """Train the protocol SFT (`run_sft_stage` on `protocol_train_config`: its pairs exported under each condition in
    equal shares, `bapsql.policies.sft_export.export_sft_shares`; Ray must be up). Returns the merged model folder."""
    from bapsql.train.recipe.pipeline import run_sft_stage

    run_sft_stage(protocol_train_config(train, settings), seed, console=console)
    return protocol_model_dir(train, seed)
