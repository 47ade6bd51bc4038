"""In-loop validation of GRPO (``grpo.validate_every``): the policy plays held-out questions as the evaluation plays
them, every N updates, and the stage can keep the validated best policy (``grpo.keep: best``).

Why: GRPO on few groups per update random-walks between updates, and which update is best differs by seed. A
validation set that no SFT pair, GRPO prompt or evaluation task came from picks the update to keep without touching
the evaluation split; update 0 (before any update: the SFT policy itself) is validated too, so "best" may be SFT.
The held-out questions themselves are chosen by `bapsql.train.loop.grpo_data.validation_tasks`.

- `best_record`: the record with the highest success over all its episodes, the earliest on a tie. Pure.
- `keep_best`: loads the best record's adapter into the learner (what the stage then saves as its policy).
- `Validator`: plays every (task, level) once per validation with the rollouts' ``eval_agent``
  (`bapsql.train.loop.rollouts.TrainingRollouts.validate`; the prompt seed is the update, so episode ids never
  repeat), saves the learner's adapter of that update under ``<grpo>/validated/update-NNNNN`` (while the stage runs
  every validated update keeps its adapter, so a resumed run can still choose any of them), and appends one JSON
  line per validation to ``<grpo>/validation.jsonl``. With a ``monitor`` it also logs, at the update's step, the table
  ``val/trajectories``: a few of the round's episodes per level (2 successes, 2 failures where there are), one row
  per turn with the completion and observation text (`bapsql.logs.samples.trajectory_table`).
  `Validator.resume(u)` drops the records past update ``u`` (they run again), ``resume(None)`` all of them.
  `Validator.prune` (``grpo.keep_validated: best``, once the stage has ended at its final checkpoint) deletes every
  validated adapter but the best record's; the records stay. A later resume (from that final checkpoint, to run
  more updates) can then still only choose the best one or a new update.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from bapsql.errors import ConfigError
from bapsql.files import atomic_write_text
from bapsql.train.algo.sampler import Prompt

VALIDATION_FILE = "validation.jsonl"


@dataclass(frozen=True)
class ValidationRecord:
    """One validation: the update validated (0 = before the first), success rate by level and over all episodes,
    the episodes played and the seconds it took."""

    update: int
    success: dict[str, float]
    mean: float
    episodes: int
    seconds: float

    def metrics(self) -> dict[str, float]:
        """Monitor metrics: ``val/success/<level>``, ``val/success/all``, ``val/seconds``."""
        return {**{f"val/success/{lv}": v for lv, v in self.success.items()}, "val/success/all": self.mean,
                "val/seconds": self.seconds}


def best_record(records: Sequence[ValidationRecord]) -> ValidationRecord:
    """The record with the highest ``mean`` success; the earliest update on a tie. `ValueError` when empty."""
    if not records:
        raise ValueError("no validation records to choose from")
    return min(records, key=lambda r: (-r.mean, r.update))


class Validator:
    """Validates the policy the rollouts' engines hold (see the module docstring)."""

    def __init__(self, rollouts: Any, learner: Any, tasks: Sequence[Any], levels: Sequence[str], out_dir: Path,
                 monitor: Any = None):
        if not tasks or not levels:
            raise ConfigError("validation needs at least one task and one budget level")
        self.rollouts = rollouts
        self.learner = learner
        self.tasks = list(tasks)
        self.levels = tuple(levels)
        self.out_dir = Path(out_dir)
        self.path = self.out_dir / VALIDATION_FILE
        self.records: list[ValidationRecord] = []
        self.monitor = monitor

    def adapter_dir(self, update: int) -> Path:
        return self.out_dir / "validated" / f"update-{update:05d}"

    def resume(self, update: int | None) -> None:
        """Keep the records of updates ``<= update`` (those past it run again); ``None`` (a fresh run, not resumed)
        drops every record an earlier run in this folder left. A kept record's adapter may have been pruned
        (`prune`); the best record's never is, and `keep_best` names the folder if it is gone."""
        self.records = [] if update is None else [r for r in read_validation(self.path) if r.update <= update]
        self._write()

    def validated(self, update: int) -> bool:
        return any(r.update == update for r in self.records)

    def run(self, update: int) -> ValidationRecord:
        """Validate the current policy as update ``update``; record it and save its adapter."""
        t0 = time.perf_counter()
        prompts = [Prompt(t.task_id, lv, update) for t in self.tasks for lv in self.levels]
        episodes = self.rollouts.validate(prompts, update)
        by_level: dict[str, list[bool]] = {lv: [] for lv in self.levels}
        for p, ep in zip(prompts, episodes):
            by_level[p.level].append(bool(ep.episode["success"]))
        flat = [s for v in by_level.values() for s in v]
        if self.monitor is not None:
            from bapsql.logs.samples import VALIDATION_TABLE_NAME, trajectory_table

            self.monitor.log_table(VALIDATION_TABLE_NAME, trajectory_table((ep.episode, ep.turns) for ep in episodes),
                                   step=update)
        self.learner.save_adapter(self.adapter_dir(update))
        rec = ValidationRecord(update=update, success={lv: float(np.mean(v)) for lv, v in by_level.items()},
                               mean=float(np.mean(flat)), episodes=len(flat), seconds=time.perf_counter() - t0)
        self.records = [r for r in self.records if r.update != update] + [rec]
        self._write()
        return rec

    def best(self) -> ValidationRecord:
        return best_record(self.records)

    def prune(self) -> list[Path]:
        """Delete the validated adapters of every record but the best one; returns the folders deleted. Call it only
        when the stage has ended: a record that is not the best now may become it after a resume to an earlier
        checkpoint drops the better one."""
        keep = self.best().update
        gone = [self.adapter_dir(r.update) for r in self.records
                if r.update != keep and self.adapter_dir(r.update).is_dir()]
        for d in gone:
            shutil.rmtree(d)
        return gone

    def _write(self) -> None:
        atomic_write_text(self.path, "".join(json.dumps(asdict(r)) + "\n" for r in self.records))


def keep_best(validator: Validator, learner: Any) -> ValidationRecord:
    """Load the validated best update's adapter into ``learner`` (``grpo.keep: best``); returns its record. The
    optimizer state is left as it is: the stage saves this adapter as its policy after the last checkpoint."""
    best = validator.best()
    learner.load_adapter(validator.adapter_dir(best.update))
    return best


def read_validation(path: str | Path) -> list[ValidationRecord]:
    """The records of a ``validation.jsonl`` (empty when there is none)."""
    p = Path(path)
    if not p.is_file():
        return []
    return [ValidationRecord(**json.loads(line)) for line in p.read_text().splitlines() if line.strip()]
