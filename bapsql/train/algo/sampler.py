"""Training-time prompt sampling: which (task, budget) groups the next rollouts play (DESIGN §5).

The paper trains one policy for all budgets, so every group draws its budget level from the ladder (uniform over
XS/S/M/L unless ``weights`` say otherwise), independently of the task. Tasks are visited in a seeded order: each
epoch is a fresh permutation of the training tasks, walked without replacement, so every task is seen once per epoch.

`TaskBudgetSampler.draw(k)` returns the next ``k`` ``(task_id, level, group_seed)`` prompts; ``group_seed`` is a
fresh 31-bit seed for the group's rollouts (each trajectory of the group derives its own sampling seed from it).
The whole state — epoch, position, permutation and the generator's bit state — is JSON (`state_dict` /
`load_state_dict`), so a resumed run draws exactly the prompts an uninterrupted run would.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from bapsql.errors import ConfigError


@dataclass(frozen=True)
class Prompt:
    """One group to roll out: task, budget level and the group's base seed."""

    task_id: str
    level: str
    seed: int


class TaskBudgetSampler:
    """Seeded (task, budget) prompt stream (see the module docstring)."""

    def __init__(self, task_ids: Sequence[str], levels: Sequence[str], *, weights: Sequence[float] | None = None,
                 seed: int = 0):
        if not task_ids:
            raise ConfigError("sampler: no training tasks")
        if not levels:
            raise ConfigError("sampler: no budget levels")
        self.task_ids = tuple(task_ids)
        self.levels = tuple(levels)
        w = np.ones(len(self.levels)) if weights is None else np.asarray(weights, dtype=np.float64)
        if w.shape != (len(self.levels),) or np.any(w < 0) or w.sum() <= 0:
            raise ConfigError(f"sampler: weights {list(w)} must be {len(self.levels)} non-negative numbers, not all 0")
        self.weights = w / w.sum()
        self.rng = np.random.default_rng(seed)
        self.epoch = 0
        self.pos = 0
        self.order = self.rng.permutation(len(self.task_ids)).tolist()
        self.drawn = 0

    def draw(self, k: int) -> list[Prompt]:
        """The next ``k`` prompts."""
        out = []
        for _ in range(k):
            if self.pos >= len(self.order):
                self.epoch += 1
                self.pos = 0
                self.order = self.rng.permutation(len(self.task_ids)).tolist()
            task = self.task_ids[self.order[self.pos]]
            self.pos += 1
            level = self.levels[int(self.rng.choice(len(self.levels), p=self.weights))]
            out.append(Prompt(task, level, int(self.rng.integers(0, 2**31 - 1))))
            self.drawn += 1
        return out

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "pos": self.pos, "order": list(self.order), "drawn": self.drawn,
                "rng": self.rng.bit_generator.state, "task_ids": list(self.task_ids), "levels": list(self.levels)}

    def load_state_dict(self, state: dict) -> None:
        if list(state["task_ids"]) != list(self.task_ids) or list(state["levels"]) != list(self.levels):
            raise ConfigError("sampler state was saved for a different task list or budget ladder; resume with the "
                              "same benchmark split and levels")
        self.epoch = int(state["epoch"])
        self.pos = int(state["pos"])
        self.order = [int(i) for i in state["order"]]
        self.drawn = int(state["drawn"])
        self.rng.bit_generator.state = state["rng"]
