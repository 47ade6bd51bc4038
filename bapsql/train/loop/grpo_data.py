"""What a GRPO stage trains and validates on, chosen from the benchmark's tasks (`bapsql.data.tasks`) by the config:

- `grpo_prompt_tasks` (and `grpo_tasks`, its prompts alone): the tasks of ``data.split`` or ``grpo.prompt_rounds``
  rounds of fresh questions on its databases (``grpo.prompts``), the empty-gold ones set aside unless
  ``grpo.empty_gold: include``, the first ``data.limit``; `write_prompt_record` says which in ``prompts.json``;
- `validation_tasks`: ``grpo.validation_tasks`` fresh questions of the generator's templates on ``data.split``'s
  databases (`bapsql.data.augment`, seed ``seed + 3``: the corpus draws with + 1, GRPO's prompts with + 2), none a
  question of ``data.split``, ``data.eval_split`` or GRPO's prompts; taken database by database in turn. The
  in-loop validation (`bapsql.train.loop.validation.Validator`) plays them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from bapsql.errors import ConfigError
from bapsql.files import atomic_write_text
from bapsql.train.config import TrainConfig


def grpo_prompt_tasks(cfg: TrainConfig, seed: int, root: Path) -> tuple[list[Any], list[Any]]:
    """GRPO's prompts under ``grpo.prompts`` and the empty-gold tasks set aside: the tasks of ``data.split`` (SFT's
    own), or ``grpo.prompt_rounds`` rounds of augmented tasks on its databases (`bapsql.data.augment`, seed
    ``seed + 2``: the pretraining corpus draws with ``seed + 1``) with no question of ``data.split`` or
    ``data.eval_split``; tasks whose gold query returns no rows (`bapsql.data.benchmark.empty_gold`: ``[]`` is
    correct there without evidence) are set aside unless ``grpo.empty_gold: include``; ``data.limit`` then keeps
    the first N prompts. Raises `ConfigError` when none are left."""
    from bapsql.data.benchmark import empty_gold
    from bapsql.data.tasks import load_tasks

    split = load_tasks(root, cfg.data.split)
    if cfg.grpo.prompts == "split":
        tasks = split
    else:
        from bapsql.data.augment import augment_tasks

        tasks = augment_tasks(root, cfg.data.split, cfg.grpo.prompt_rounds, seed=seed + 2,
                              exclude=[*split, *load_tasks(root, cfg.data.eval_split)])
    empty = [t for t in tasks if empty_gold(t)]
    if cfg.grpo.empty_gold == "exclude":
        tasks = [t for t in tasks if not empty_gold(t)]
    tasks = tasks if cfg.data.limit is None else tasks[:cfg.data.limit]
    if not tasks:
        raise ConfigError(f"grpo.prompts {cfg.grpo.prompts!r}: data.split {cfg.data.split!r} gives no tasks"
                          + (" (the embedded generator knows none of its databases)"
                             if cfg.grpo.prompts == "augmented" else "")
                          + (f" ({len(empty)} with an empty gold answer left out: grpo.empty_gold: include)"
                             if empty and cfg.grpo.empty_gold == "exclude" else ""))
    return tasks, empty


def grpo_tasks(cfg: TrainConfig, seed: int, root: Path) -> list[Any]:
    """GRPO's prompts (`grpo_prompt_tasks`)."""
    return grpo_prompt_tasks(cfg, seed, root)[0]


def write_prompt_record(cfg: TrainConfig, tasks: Sequence[Any], empty: Sequence[Any], grpo_dir: Path) -> Path:
    """``<grpo_dir>/prompts.json``: how many prompts GRPO draws from (``tasks``) and how many empty-gold tasks
    (``empty``, `grpo_prompt_tasks`) it left out under ``grpo.empty_gold``; returns the path."""
    record = {"source": cfg.grpo.prompts, "prompts": len(tasks), "empty_gold": cfg.grpo.empty_gold,
              "empty_gold_tasks": len(empty), "empty_gold_left_out": len(empty) if cfg.grpo.empty_gold == "exclude"
              else 0, "task_ids": [t.task_id for t in tasks]}
    path = Path(grpo_dir) / "prompts.json"
    atomic_write_text(path, json.dumps(record, indent=1) + "\n")
    return path



def validation_tasks(cfg: Any, seed: int, root: Path, *, exclude: Sequence[Any]) -> list[Any]:
    """``cfg.grpo.validation_tasks`` held-out questions (see the module docstring). ``exclude``: tasks whose
    questions must not appear (GRPO's prompts; ``data.split`` and ``data.eval_split`` are excluded here).
    `ConfigError` when the generator gives none."""
    from bapsql.data.augment import augment_tasks
    from bapsql.data.tasks import load_tasks

    banned = [*load_tasks(root, cfg.data.split), *load_tasks(root, cfg.data.eval_split), *exclude]
    pool = augment_tasks(root, cfg.data.split, 1, seed=seed + 3, exclude=banned)
    if not pool:
        raise ConfigError(f"grpo.validate_every: data.split {cfg.data.split!r} gives no validation questions (the "
                          "embedded generator knows none of its databases); set grpo.validate_every: 0")
    rng = np.random.default_rng(seed + 3)
    by_db: dict[str, list[Any]] = {}
    for t in pool:
        by_db.setdefault(t.db_id, []).append(t)
    queues = [[q[i] for i in rng.permutation(len(q))] for _, q in sorted(by_db.items())]
    out: list[Any] = []
    while len(out) < cfg.grpo.validation_tasks and any(queues):
        for q in queues:
            if q and len(out) < cfg.grpo.validation_tasks:
                out.append(q.pop(0))
    return out
