"""The GRPO update loop (DESIGN §5): budget sampling → rollouts → filter/refill → learner → sync → check → log →
checkpoint.

`GRPOTrainer` wires plain parts together; it knows nothing about Ray (the rollouts object may run on Ray):

- ``learner``: `bapsql.train.learner.core.Learner` (LoRA on the SFT-merged base);
- ``rollouts``: `bapsql.train.loop.rollouts.TrainingRollouts` — or anything with ``play(prompts, policy_version) ->
  groups`` plus the engine side of weight sync (``load_adapter``, ``logprobs_of``);
- ``tasks``: the training tasks; a `TaskBudgetSampler` draws (task, budget level, seed) prompts across the ladder;
- a `DifficultyFilter` keeps groups with 2–6 successes of 8 and refills (`fill_update`);
- a `WeightSync` pushes the adapter to every engine after each update and checks the probe logprobs.

Update ``u`` (0-based) samples with policy version ``u`` (the adapter after ``u`` updates), trains, syncs version
``u + 1``, logs one metrics dict at step ``u + 1`` and checkpoints every ``checkpoint.every`` updates and at the end.
Each batch is checked after it is played (`GRPOTrainer._check_served`): its trajectories carry policy version ``u``
and every engine replica served adapter version ``u`` (``rollouts.replica_served_adapters``), else
`WeightSyncError`.
`start(resume=True)` restores the latest checkpoint (adapter, optimizer, scheduler, RNG, sampler, filter, counter)
and re-syncs it, so the continued run draws the same prompts and — with a deterministic engine — produces the same
metrics as an uninterrupted run. A starving filter never stops training: the update trains on the groups it kept
(or skips the learner step when none), and says so in the metrics (``filter/starved``, ``learner/skipped``).

``reward_fn(group) -> [G]`` defaults to the configured BAP-SQL reward of the episode rows; tests and toy tasks may
pass another.

This is the synchronous loop (``grpo.max_staleness: 0``); `bapsql.train.loop.overlap.PipelinedGRPOTrainer` overlaps
rollouts with the learner and `bapsql.train.loop.overlap.make_trainer` picks one by the config.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from bapsql.errors import ConfigError, WeightSyncError
from bapsql.logs.monitor import Monitor, NullMonitor
from bapsql.train.algo.filter import DifficultyFilter, fill_update, histogram_metrics
from bapsql.train.algo.grpo import policy_drift
from bapsql.train.algo.sampler import TaskBudgetSampler
from bapsql.train.algo.staleness import PENDING_FILE
from bapsql.train.config import TrainConfig
from bapsql.train.learner.checkpoint import TrainState, latest_checkpoint, load_checkpoint, prune, save_checkpoint
from bapsql.train.learner.core import Sample
from bapsql.train.learner.minibatch import grpo_steps
from bapsql.train.learner.weight_sync import Probe, SyncReport, WeightSync
from bapsql.train.loop.batch import build_samples, group_outcome, group_reward_array


@dataclass(frozen=True)
class UpdateRecord:
    """One finished update: its index (1-based), the metrics logged, and the sync report."""

    update: int
    metrics: dict[str, float]
    sync: SyncReport | None


def add_idle_shares(m: dict[str, float]) -> None:
    """Add ``time/engine_idle_share`` and ``time/learner_idle_share`` to an update's metrics: the share of its wall
    time (``time/update_s``) the engines were not generating (``time/rollout_s``) and the learner was not working
    (``time/learner_s`` + ``time/drift_s``)."""
    wall = m["time/update_s"] or 1.0
    m["time/engine_idle_share"] = max(0.0, 1.0 - m["time/rollout_s"] / wall)
    m["time/learner_idle_share"] = max(0.0, 1.0 - (m["time/learner_s"] + m.get("time/drift_s", 0.0)) / wall)


class GRPOTrainer:
    """See the module docstring."""

    def __init__(self, cfg: TrainConfig, *, seed: int, learner: Any, rollouts: Any, tasks: Sequence[Any],
                 probe: Probe, run_dir: str | Path, monitor: Monitor | None = None,
                 reward_fn: Callable[[Sequence[Any]], np.ndarray] | None = None):
        self.cfg = cfg
        self.seed = seed
        self.learner = learner
        self.rollouts = rollouts
        self.run_dir = Path(run_dir)
        self.monitor = monitor or NullMonitor()
        self.sampler = TaskBudgetSampler([t.task_id for t in tasks], cfg.budgets.levels, weights=cfg.budgets.weights,
                                         seed=seed)
        self.filter = DifficultyFilter(cfg.filter)
        self.sync = WeightSync(rollouts, learner, probe, self.run_dir / "adapters", settings=cfg.sync)
        self.reward_fn = reward_fn or (lambda group: group_reward_array(group, cfg.reward))
        self.update = 0
        self.total_updates = cfg.grpo.updates  # the last update of the run (`run` raises it; pipelining stops there)
        self.history: list[UpdateRecord] = []
        self.started = False

    @property
    def checkpoint_dir(self) -> Path:
        return self.run_dir / "checkpoints"

    # --------------------------------------------------------------------------------------------------- start
    def start(self, *, resume: bool = False) -> SyncReport:
        """Restore the latest checkpoint when ``resume`` (and one exists), then sync the engines to the learner."""
        ckpt = latest_checkpoint(self.checkpoint_dir) if resume else None
        if ckpt is not None:
            self._check_resumable(ckpt)
            state = load_checkpoint(ckpt, self.learner)
            self.sampler.load_state_dict(state.sampler)
            self.filter.load_state_dict(state.filter)
            self.update = state.update
        self.started = True
        return self.sync.sync(self.update)

    def _check_resumable(self, ckpt: Path) -> None:
        """The synchronous loop cannot continue a pipelined run: rollouts that run generated for later updates
        (``pending.pkl``) would never be trained, and its data order would differ."""
        if (ckpt / PENDING_FILE).is_file():
            raise ConfigError(f"{ckpt} was written by a pipelined run (grpo.max_staleness >= 1) and holds rollouts for "
                              "later updates; resume it with the same grpo.max_staleness")

    # -------------------------------------------------------------------------------------------------- update
    def step(self) -> UpdateRecord:
        """Run one update (see the module docstring)."""
        if not self.started:
            raise RuntimeError("call start() before step()")
        t0 = time.perf_counter()
        fill, drawn_groups, rollout_s, generated = self._fill(self.update)
        t_filter = time.perf_counter()
        samples, info = self._samples(fill.kept)
        filter_s = (t_filter - t0 - rollout_s) + (time.perf_counter() - t_filter)

        drift = self._drift(samples)
        t_learn = time.perf_counter()
        learner_metrics = None
        if samples:
            learner_metrics = self._learn(samples)
        learner_s = time.perf_counter() - t_learn

        return self._finish(drawn_groups, fill, info, learner_metrics, generated,
                            {"rollout": rollout_s, "filter": filter_s, "learner": learner_s}, t0, drift)

    def _finish(self, drawn: Sequence[Sequence[Any]], fill: Any, info: Any, lm: Any, generated: int,
                times: dict[str, float], t0: float, extra: dict[str, float]) -> UpdateRecord:
        """Close an update: sync the new version to the engines, log its metrics (``times`` plus the sync and the
        whole update's seconds since ``t0``, then ``extra``), checkpoint when due."""
        self.update += 1
        report = self.sync.sync(self.update)
        metrics = self._metrics(drawn, fill, info, lm, report, generated,
                                {**times, "sync": report.seconds, "update": time.perf_counter() - t0})
        metrics.update(extra)
        add_idle_shares(metrics)
        self.monitor.log(metrics, step=self.update)
        if self.update % self.cfg.checkpoint.every == 0:
            self.checkpoint()
        record = UpdateRecord(self.update, metrics, report)
        self.history.append(record)
        return record

    def _fill(self, version: int) -> tuple[Any, list[list[Any]], float, int]:
        """One update's groups sampled with policy ``version``: draw prompts, play them, judge and refill
        (`fill_update`). Returns (fill result, every drawn group, seconds spent in rollouts, tokens generated)."""
        rollout_s = 0.0
        drawn_groups: list[list[Any]] = []
        generated = 0

        def draw(k: int) -> list[list[Any]]:
            nonlocal rollout_s, generated
            t = time.perf_counter()
            groups = self.rollouts.play(self.sampler.draw(k), version)
            rollout_s += time.perf_counter() - t
            last = getattr(self.rollouts, "last", None)
            generated += int(getattr(last, "generated_tokens", 0) or 0)
            drawn_groups.extend(groups)
            return groups

        fill = fill_update(self.filter, draw, group_outcome)
        self._check_served(drawn_groups, version)
        return fill, drawn_groups, rollout_s, generated

    def _check_served(self, groups: Sequence[Sequence[Any]], version: int) -> None:
        """Every trajectory sampled for policy ``version`` carries that version, and the adapter every engine replica
        served them with (``rollouts.replica_served_adapters(rollouts.adapter)``, when the rollouts report it:
        `Engine.served_adapter` per replica) is that version; else `WeightSyncError` — a trajectory labelled with one
        version but sampled by another would be trained with the wrong behaviour policy."""
        labels = sorted({int(t.spec.policy_version) for g in groups for t in g} - {int(version)})
        if labels:
            raise WeightSyncError(f"rollouts of policy version {version} came back labelled with versions {labels}")
        served = getattr(self.rollouts, "replica_served_adapters", None)
        if served is None or not groups:
            return
        reports = served(getattr(self.rollouts, "adapter", None))
        wrong = {r: getattr(ref, "version", None) for r, ref in enumerate(reports)
                 if getattr(ref, "version", None) != version}
        if wrong:
            raise WeightSyncError(f"trajectories of policy version {version} were sampled while engine replicas "
                                  f"served adapter versions {wrong}: a trajectory's policy version must be the "
                                  "adapter version the engine served it with")

    def _learn(self, samples: Sequence[Sample]) -> Any:
        """The optimizer steps of update ``self.update`` on ``samples`` (`bapsql.train.learner.minibatch.grpo_steps`);
        the mini-batch order is seeded by (seed, update), so a resumed run takes the same steps."""
        g = self.cfg.grpo
        return grpo_steps(self.learner, samples, g.loss, epochs=g.epochs, mini_batches=g.mini_batches,
                          rng=np.random.default_rng([self.seed, self.update]))

    def _drift(self, samples: Sequence[Sample]) -> dict[str, float]:
        """Policy drift from the SFT model on this update's samples (`bapsql.train.algo.grpo.policy_drift`): the
        engine's logprobs of the sampled tokens against the learner's base with the adapter disabled."""
        if not self.cfg.grpo.log_drift or not samples or not hasattr(self.learner, "token_logprobs"):
            return {}
        usable = [s for s in samples if s.engine_logprobs is not None]
        if not usable:
            return {}
        t = time.perf_counter()
        ref = self.learner.token_logprobs(usable, reference=True, masked_only=True)
        out = policy_drift([np.asarray(s.engine_logprobs) for s in usable], ref, [s.loss_mask for s in usable])
        out["time/drift_s"] = time.perf_counter() - t
        return out

    def _samples(self, kept: Sequence[Sequence[Any]]) -> tuple[list[Sample], Any]:
        """Learner samples of the kept groups with ``reward_fn`` rewards (the configured reward by default)."""
        rewards = [np.asarray(self.reward_fn(g), dtype=np.float64) for g in kept]
        return build_samples(kept, self.cfg.reward, scale=self.cfg.grpo.advantage_scale,
                             trainable_actions=self.cfg.grpo.trainable_actions, rewards=rewards)

    def run(self, updates: int | None = None) -> list[UpdateRecord]:
        """Run until ``updates`` (default ``grpo.updates``) updates are done in total; checkpoint at the end."""
        target = self.cfg.grpo.updates if updates is None else updates
        self.total_updates = max(self.total_updates, target)
        out = []
        while self.update < target:
            out.append(self.step())
        if self.update and self.update % self.cfg.checkpoint.every != 0:
            self.checkpoint()
        return out

    def checkpoint(self) -> Path:
        """Save the checkpoint of the current update and prune old ones."""
        path = save_checkpoint(self.checkpoint_dir, self.learner, TrainState(
            update=self.update, sampler=self.sampler.state_dict(), filter=self.filter.state_dict(),
            extra={"policy_version": self.update, "max_staleness": self.cfg.grpo.max_staleness}),
            files=self._checkpoint_files())
        prune(self.checkpoint_dir, self.cfg.checkpoint.keep)
        return path

    def _checkpoint_files(self) -> dict[str, bytes]:
        """Extra files of a checkpoint (none here; the pipelined loop saves its pending rollouts)."""
        return {}

    # ------------------------------------------------------------------------------------------------- metrics
    def _metrics(self, drawn: Sequence[Sequence[Any]], fill: Any, info: Any, lm: Any, report: SyncReport,
                 generated: int, times: dict[str, float]) -> dict[str, float]:
        m: dict[str, float] = {"update": float(self.update)}
        by_level: dict[str, list[bool]] = defaultdict(list)
        all_rewards = []
        for g in drawn:
            all_rewards.extend(np.asarray(self.reward_fn(g), dtype=np.float64).tolist())
            for t in g:
                by_level[t.spec.level].append(bool(t.episode["success"]))
        for level, succ in by_level.items():
            m[f"success/{level}"] = float(np.mean(succ))
        flat = [s for v in by_level.values() for s in v]
        m["success/all"] = float(np.mean(flat)) if flat else 0.0
        m["reward/mean"] = float(np.mean(all_rewards)) if all_rewards else 0.0
        m["reward/kept_mean"] = float(info.rewards.mean()) if len(info.rewards) else 0.0
        m["batch/misaligned_dropped"] = float(info.misaligned)
        m.update({"filter/kept_groups": float(len(fill.kept)), "filter/drawn_groups": float(fill.drawn),
                  "filter/kept_share": fill.kept_share, "filter/rounds": float(fill.rounds),
                  "filter/starved": float(fill.starved), "filter/keep_rate_total": self.filter.keep_rate,
                  **histogram_metrics(fill.histogram),
                  **histogram_metrics(self.filter.total_histogram, "filter/total_successes_")})
        m["learner/skipped"] = float(lm is None)
        if lm is not None:
            st = lm.stats
            n = max(st.tokens, 1.0)
            m.update({"learner/loss": lm.loss, "learner/grad_norm": lm.grad_norm, "learner/lr": lm.lr,
                      "learner/sequences": float(lm.sequences), "learner/policy_tokens": st.tokens,
                      "learner/clip_frac": st.clipped / n, "learner/is_weight_mean": st.is_weight / n,
                      "learner/is_truncated_frac": st.is_truncated / n, "learner/is_weight_max": st.is_weight_max,
                      "learner/kl": st.kl / n,
                      "mismatch/logprob_abs_mean": st.mismatch / n,
                      "throughput/learner_tokens_per_s": lm.tokens_per_s})
        m["throughput/rollout_tokens_per_s"] = generated / times["rollout"] if times["rollout"] > 0 else 0.0
        m["rollout/generated_tokens"] = float(generated)
        for k, v in times.items():
            m[f"time/{k}_s"] = v
        total = sum(times[k] for k in ("rollout", "filter", "learner", "sync")) or 1.0
        for k in ("rollout", "filter", "learner", "sync"):
            m[f"time/{k}_share"] = times[k] / total
        m.update(report.metrics())
        return m

