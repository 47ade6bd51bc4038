"""Pipelined GRPO (DESIGN §5 "Pipelining"): rollouts for the next ``k`` updates overlap the learner.

`PipelinedGRPOTrainer` is `bapsql.train.loop.trainer.GRPOTrainer` with ``grpo.max_staleness: k`` ≥ 1 (`make_trainer`
picks the synchronous loop at ``k = 0``, which stays exactly what it was). The parts are the same (learner, rollouts,
sampler, difficulty filter, weight sync, monitor, checkpoints); what changes is when rollouts are generated.

Schedule (fixed, not timing-dependent, so runs reproduce and resume exactly): the batch of update ``t`` (0-based) is
sampled with policy version ``max(0, t − k)``. Step ``u``:

1. take the pending batch of update ``u`` (generated ahead; generated now when none is pending — the first update,
   a resume from a synchronous run's checkpoint, or a retry after a learner failure dropped it);
2. gate its kept groups by staleness (`bapsql.train.algo.staleness.staleness_gate`: a group whose version is more than
   ``k`` behind the learner's ``u`` is dropped and counted, never trained) and build the learner samples;
3. train in a learner thread (policy drift, then the update's optimizer steps, `bapsql.train.learner.minibatch`; the
   loss's truncated importance weight ``min(π_u / π_v, is_cap)`` corrects for the behaviour policy ``v``,
   `bapsql.train.algo.grpo`), while this thread generates the batches of updates ``u+1 … u+k`` not yet pending —
   draw, play, judge and refill with the difficulty filter — with the version the engines serve, ``u`` — but
   never a batch past the run's last update (`ahead_targets`; ``total_updates``, `GRPOTrainer.run` raises it);
4. join, then sync version ``u+1`` to every engine replica (save, load, the probe logprob check: every sync is
   checked, as in the synchronous loop);
5. log and checkpoint.

Weight sync happens between batches, when no request is in flight: every trajectory of a batch is sampled by one
version, which the schedule fixes. (Engines can also swap with requests in flight — `EngineHost` keeps up to
``max_loras`` versions, old requests finish on their adapter, new ones take the new — but this loop does not rely
on it, because the version a request got would then depend on timing.)

Learner failures: before a batch's optimizer steps the learner keeps a `snapshot` of its state (adapter,
optimizer, scheduler, step; `bapsql.train.learner.state`). When it fails part-way (say after one of two
mini-batch steps), it is rolled back to that snapshot and the batch is put back, so a retry of the update trains it
once from the same state; a learner that took none of the batch's steps keeps the batch as well. A learner that
cannot roll back (no snapshot support, or its actor is gone) drops the batch instead, counted in
``learner/dropped_batches``: training it again would take some of its steps twice. Every batch is also checked for
the version it was sampled with (`GRPOTrainer._check_served`: the trajectories' labels and the adapter version each
engine replica serves).

Threads: only the learner runs in the second thread (a `Learner`, or a `RemoteLearner` whose calls block on its Ray
actor). The rollout backend (Ray or in-process), sampler, filter, weight sync, monitor and checkpoints are used by the
calling thread alone. Torch releases the GIL in its kernels, so an in-process learner overlaps with engines and env
workers in Ray actors, and (with more GIL contention) with an in-process engine.

Filter and checkpoints: every drawn group is judged once, when its batch is generated; groups the filter kept are
trained at most once. The pending batches (at most ``k``, already generated and judged) are **saved** in each
checkpoint (``pending.pkl``: trajectories with token ids and engine logprobs), not regenerated: a resumed run trains
exactly them, with the sampler and filter states that already account for them, so it continues as the uninterrupted
run would (bit for bit with a deterministic engine) and never plays or judges a group twice.

Metrics per update: the synchronous loop's, for the batch trained (success, reward, filter histogram of that batch),
plus ``staleness/groups_0 … groups_k`` (trained groups by staleness), ``staleness/mean``, ``staleness/max``,
``staleness/dropped_groups``, ``staleness/batch_version``, and the importance-weight statistics of the loss
(``learner/is_weight_mean``, ``learner/is_weight_max``, ``learner/is_truncated_frac``,
``mismatch/logprob_abs_mean``). ``time/rollout_s`` and ``rollout/generated_tokens`` are the rollouts generated
during this update (for the next ones), ``time/update_s`` its wall time, and the idle shares are of that wall time.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np

from bapsql.errors import ConfigError
from bapsql.train.algo.staleness import (PENDING_FILE, PendingBatch, dumps_pending, group_version, loads_pending,
                                         staleness_gate, staleness_metrics)
from bapsql.train.config import TrainConfig
from bapsql.train.learner.checkpoint import latest_checkpoint
from bapsql.train.learner.weight_sync import SyncReport
from bapsql.train.loop.trainer import GRPOTrainer, UpdateRecord


def ahead_targets(last_pending: int, update: int, max_staleness: int, total_updates: int) -> range:
    """The updates whose batches step ``update`` generates ahead: those after ``last_pending`` (the last batch
    already pending, or ``update`` itself) up to ``update + max_staleness`` — and never past the last update of the
    run (``total_updates`` updates: the last target is ``total_updates - 1``)."""
    return range(last_pending + 1, min(update + max_staleness, total_updates - 1) + 1)


def make_trainer(cfg: TrainConfig, **kwargs: Any) -> GRPOTrainer:
    """The GRPO loop ``cfg`` asks for: synchronous at ``grpo.max_staleness: 0``, else pipelined (same arguments as
    `GRPOTrainer`)."""
    cls = PipelinedGRPOTrainer if cfg.grpo.max_staleness > 0 else GRPOTrainer
    return cls(cfg, **kwargs)


class PipelinedGRPOTrainer(GRPOTrainer):
    """See the module docstring."""

    def __init__(self, cfg: TrainConfig, **kwargs: Any):
        if cfg.grpo.max_staleness < 1:
            raise ConfigError("PipelinedGRPOTrainer needs grpo.max_staleness >= 1 (0 is the synchronous GRPOTrainer)")
        super().__init__(cfg, **kwargs)
        self.max_staleness = cfg.grpo.max_staleness
        self.pending: deque[PendingBatch] = deque()
        self.dropped_batches = 0  # batches a learner failure left half-trained and no rollback could undo
        self._can_rollback = hasattr(self.learner, "snapshot") and hasattr(self.learner, "rollback")

    # --------------------------------------------------------------------------------------------------- start
    def start(self, *, resume: bool = False) -> SyncReport:
        """`GRPOTrainer.start`, and the pending batches of the checkpoint resumed from (none for a synchronous
        run's checkpoint: the first update then generates its batch)."""
        ckpt = latest_checkpoint(self.checkpoint_dir) if resume else None
        report = super().start(resume=resume)
        self.pending.clear()
        if ckpt is not None and (ckpt / PENDING_FILE).is_file():
            batches = loads_pending((ckpt / PENDING_FILE).read_bytes())
            want = list(range(self.update, self.update + len(batches)))
            if [b.target for b in batches] != want:
                raise ConfigError(f"{ckpt}/{PENDING_FILE} holds batches for updates {[b.target for b in batches]}, "
                                  f"expected {want}")
            self.pending.extend(batches)
        return report

    def _check_resumable(self, ckpt: Path) -> None:
        """Any checkpoint continues: a pipelined one with its pending batches (those sampled more than
        ``max_staleness`` versions ago are dropped by the gate), a synchronous one with none."""

    def _checkpoint_files(self) -> dict[str, bytes]:
        return {PENDING_FILE: dumps_pending(list(self.pending))}

    # -------------------------------------------------------------------------------------------------- update
    def _learner_step(self) -> int | None:
        """The learner's optimizer step count (None when it keeps none, or cannot say: its actor is gone)."""
        try:
            step = getattr(self.learner, "step", None)
        except Exception:  # a RemoteLearner whose actor died
            return None
        return int(step) if isinstance(step, (int, np.integer)) else None

    def _after_learner_error(self, batch: PendingBatch, step0: int | None, *, snapshot: bool) -> None:
        """The learner failed on ``batch``: put the batch back for a retry of this update when the learner took
        none of its optimizer steps or was rolled back to the ``snapshot`` taken before them; else drop it (counted
        in ``learner/dropped_batches``) — training it again would take some of its steps twice. The retry then
        generates a fresh batch for the update."""
        now = self._learner_step()
        untouched = step0 is not None and now == step0
        if not untouched and snapshot:
            try:
                self.learner.rollback()
                untouched = True
            except Exception:  # the learner is gone (its actor died): nothing to restore, the job resumes anyway
                untouched = False
        if untouched:
            self.pending.appendleft(batch)
        else:
            self.dropped_batches += 1

    def _generate(self, target: int, version: int) -> PendingBatch:
        fill, drawn, rollout_s, generated = self._fill(version)
        return PendingBatch(target, version, fill, tuple(drawn), rollout_s, generated)

    def step(self) -> UpdateRecord:
        """Run one update (see the module docstring)."""
        if not self.started:
            raise RuntimeError("call start() before step()")
        t0 = time.perf_counter()
        u, k = self.update, self.max_staleness
        rollout_s, generated = 0.0, 0
        if not self.pending or self.pending[0].target > u:  # none yet, or this update's batch was dropped
            first = self._generate(u, u)
            rollout_s, generated = first.rollout_s, first.generated
            self.pending.appendleft(first)
        batch = self.pending.popleft()
        if batch.target != u:
            raise RuntimeError(f"the pending batch is for update {batch.target}, the learner is at update {u}")

        t_filter = time.perf_counter()
        versions = np.array([group_version(g) for g in batch.fill.kept], dtype=np.int64)
        keep = staleness_gate(versions, u, k)
        samples, info = self._samples([g for g, ok in zip(batch.fill.kept, keep) if ok])
        filter_s = time.perf_counter() - t_filter

        box: dict[str, Any] = {}

        def learn() -> None:
            try:
                box["step0"] = self._learner_step()
                box["drift"] = self._drift(samples)
                if samples and self._can_rollback:
                    self.learner.snapshot()  # the state before this batch: a failure part-way is undone
                    box["snapshot"] = True
                t = time.perf_counter()
                box["lm"] = self._learn(samples) if samples else None
                box["learner_s"] = time.perf_counter() - t
            except BaseException as exc:  # re-raised in the calling thread after the join
                box["error"] = exc

        learner = threading.Thread(target=learn, name="grpo-learner", daemon=True)
        learner.start()
        try:
            last = self.pending[-1].target if self.pending else u
            for target in ahead_targets(last, u, k, self.total_updates):
                ahead = self._generate(target, u)
                rollout_s += ahead.rollout_s
                generated += ahead.generated
                self.pending.append(ahead)
        finally:
            learner.join()
        if "error" in box:
            self._after_learner_error(batch, box.get("step0"), snapshot=bool(box.get("snapshot")))
            raise box["error"]

        extra = {**box["drift"], **staleness_metrics(versions, u, k), "staleness/batch_version": float(batch.version),
                 "learner/dropped_batches": float(self.dropped_batches)}
        return self._finish(batch.drawn, batch.fill, info, box["lm"], generated,
                            {"rollout": rollout_s, "filter": filter_s, "learner": box["learner_s"]}, t0, extra)
