"""Pipelined GRPO (grpo.max_staleness >= 1) with a recording learner and scripted rollouts: the version schedule,
the staleness gate, groups consumed once, and exact resume. The real learner and HF engine run in the slow tier
(tests/train/loop/test_overlap_engines.py)."""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from bapsql.errors import ConfigError
from bapsql.logs.monitor import MemoryMonitor
from bapsql.rollout.engines.base import AdapterRef, adapter_digest
from bapsql.rollout.groups import SegmentTokens
from bapsql.train.algo.filter import FilterConfig
from bapsql.train.algo.grpo import LossStats
from bapsql.train.algo.staleness import (dumps_pending, group_version, loads_pending, staleness_gate,
                                         staleness_histogram, staleness_metrics, PendingBatch)
from bapsql.train.config import (BudgetSection, CheckpointSection, GRPOSection, ModelSection, MonitorSection,
                                 TrainConfig)
from bapsql.train.learner.core import UpdateMetrics
from bapsql.train.learner.weight_sync import Probe
from bapsql.train.loop.overlap import PipelinedGRPOTrainer, ahead_targets, make_trainer
from bapsql.train.loop.trainer import GRPOTrainer

pytest.importorskip("torch")  # checkpoints save RNG states with torch

VOLATILE = ("time/", "throughput/", "sync/seconds")


# ----------------------------------------------------------------------------------------------------- fakes
@dataclass(frozen=True)
class Spec:
    task_id: str
    level: str
    episode_id: str
    policy_version: int


@dataclass(frozen=True)
class Traj:
    spec: Spec
    episode: dict
    segments: tuple
    turns: tuple = ()


def uid(episode_id: str) -> int:
    return zlib.crc32(episode_id.encode()) % 1_000_000 + 10


class ScriptedRollouts:
    """Groups of 4 whose successes depend on (task, level, seed, sample) only; token ids encode the episode and the
    policy version that sampled it. Also the engine side of weight sync: serves the adapter file's step."""

    def __init__(self):
        self.played: list[str] = []
        self.versions_played: list[int] = []
        self.loaded: list[int] = []
        self.step = None

    def play(self, prompts, policy_version):
        self.versions_played.append(policy_version)
        out = []
        for p in prompts:
            group = []
            for i in range(4):
                eid = f"{p.task_id}@{p.level}:s{p.seed}:v{policy_version}#{i}"
                self.played.append(eid)
                ok = zlib.crc32(f"{p.task_id}{p.level}{p.seed}{i}".encode()) % 3 == 0
                seg = SegmentTokens((1, uid(eid), 2000 + policy_version), (0, 1, 1), (0.0, -0.5, -0.7))
                group.append(Traj(Spec(p.task_id, p.level, eid, policy_version), {"success": ok}, (seg,)))
            out.append(group)
        return out

    def load_adapter(self, path, name, version):
        self.loaded.append(version)
        self.step = int((Path(path) / "step").read_text())
        self.serving = AdapterRef(name, version, str(path), 1, adapter_digest(path))  # what weight sync checks
        return (name, version)

    def served_adapter(self, adapter):
        return self.serving

    def logprobs_of(self, prompt_ids, completion_ids, *, adapter=None):
        return [-1.0 - 0.1 * self.step] * len(completion_ids)


class RecordingLearner:
    """Records what every update trained: (episode uid, version, advantage) per sample."""

    def __init__(self):
        self.step = 0
        self.trained: list[list[tuple[int, int, float]]] = []

    def grpo_update(self, samples, loss_cfg):
        self.trained.append([(s.input_ids[1], s.input_ids[2] - 2000, round(s.advantage, 9)) for s in samples])
        self.step += 1
        n = float(sum(sum(s.loss_mask) for s in samples))
        return UpdateMetrics(loss=0.1 * self.step, grad_norm=1.0, lr=1e-3, sequences=len(samples), tokens=3 * len(
            samples), loss_tokens=int(n), micro_batches=1, seconds=1e-3,
            stats=LossStats(n, 0.0, n, 0.0, 0.0, 0.0, 0.0, 1.0))

    def save_adapter(self, out):
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "step").write_text(str(self.step))
        (out / "adapter_model.safetensors").write_bytes(b"")
        return out

    def logprobs_of(self, prompt_ids, completion_ids):
        return [-1.0 - 0.1 * self.step] * len(completion_ids)

    def save_state(self, out):
        self.save_adapter(Path(out) / "adapter")

    def load_state(self, path, rng=True):
        self.step = int((Path(path) / "adapter" / "step").read_text())


def make_cfg(tmp_path, k, *, updates=5, mini_batches=1):
    return TrainConfig(name="ov", model=ModelSection(base="unused"), out_dir=str(tmp_path),
                       grpo=GRPOSection(updates=updates, max_staleness=k, sft_init="none", mini_batches=mini_batches),
                       filter=FilterConfig(group_size=4, min_success=1, max_success=3, groups_per_update=2,
                                           max_rounds=3, max_groups_per_round=4),
                       budgets=BudgetSection(levels=("XS", "S")), checkpoint=CheckpointSection(every=1, keep=10),
                       monitor=MonitorSection(kind="memory"))


TASKS = [type("T", (), {"task_id": f"t{i}"})() for i in range(7)]


def build(cfg, run_dir, learner=None, rollouts=None):
    learner, rollouts = learner or RecordingLearner(), rollouts or ScriptedRollouts()
    trainer = make_trainer(cfg, seed=0, learner=learner, rollouts=rollouts, tasks=TASKS,
                           probe=Probe((1, 2, 3), (4, 5)), run_dir=run_dir, monitor=MemoryMonitor(),
                           reward_fn=lambda g: np.array([float(t.episode["success"]) for t in g]))
    return trainer, learner, rollouts


def stable(m):
    return {k: v for k, v in m.items() if not k.startswith(VOLATILE)}


# ------------------------------------------------------------------------------------------------ pure parts
def test_gate_histogram_and_metrics():
    v = np.array([5, 4, 3, 2, 5])
    assert staleness_gate(v, 5, 2).tolist() == [True, True, True, False, True]
    assert staleness_gate(v, 5, 0).tolist() == [True, False, False, False, True]
    with pytest.raises(ValueError, match="newer"):
        staleness_gate(np.array([6]), 5, 1)
    assert staleness_histogram(np.array([0, 2, 2, 1]), 2).tolist() == [1, 1, 2]
    m = staleness_metrics(v, 5, 2)
    assert (m["staleness/groups_0"], m["staleness/groups_1"], m["staleness/groups_2"]) == (2.0, 1.0, 1.0)
    assert m["staleness/dropped_groups"] == 1.0 and m["staleness/max"] == 2.0 and m["staleness/mean"] == 0.75
    assert staleness_metrics(np.array([], dtype=np.int64), 3, 1)["staleness/mean"] == 0.0
    group = [Traj(Spec("t", "XS", "a", 3), {}, ()), Traj(Spec("t", "XS", "b", 2), {}, ())]
    assert group_version(group) == 2


def test_pending_batches_round_trip():
    b = PendingBatch(3, 2, {"kept": [1]}, (("g",),), 1.5, 7)
    assert loads_pending(dumps_pending([b])) == [b]


def test_make_trainer_picks_the_loop_and_the_sync_loop_refuses_a_pipelined_checkpoint(tmp_path):
    t0, _, _ = build(make_cfg(tmp_path, 0), tmp_path / "a")
    t1, _, _ = build(make_cfg(tmp_path, 1), tmp_path / "b")
    assert type(t0) is GRPOTrainer and type(t1) is PipelinedGRPOTrainer
    t1.start()
    t1.run(1)
    again, _, _ = build(make_cfg(tmp_path, 0), tmp_path / "b")
    with pytest.raises(ConfigError, match="max_staleness"):
        again.start(resume=True)
    with pytest.raises(ConfigError, match="max_staleness"):
        GRPOSection(max_staleness=-1)


# ------------------------------------------------------------------------------------------------- the loop
@pytest.mark.parametrize("k", [1, 2])
def test_batches_follow_the_version_schedule_and_every_group_is_trained_once(tmp_path, k):
    trainer, learner, rollouts = build(make_cfg(tmp_path, k), tmp_path / "run")
    trainer.start()
    records = trainer.run(5)
    assert rollouts.loaded == [0, 1, 2, 3, 4, 5]  # every update synced (and checked)
    for t, (trained, rec) in enumerate(zip(learner.trained, records)):
        want = max(0, t - k)  # the batch of update t is sampled by version max(0, t − k)
        assert trained and {v for _, v, _ in trained} == {want}, (t, trained)
        m = rec.metrics
        assert m["staleness/batch_version"] == want and m["staleness/dropped_groups"] == 0.0
        assert m[f"staleness/groups_{t - want}"] == m["filter/kept_groups"] > 0
        assert "learner/is_weight_max" in m and 0.0 <= m["time/engine_idle_share"] <= 1.0
    uids = [u for trained in learner.trained for u, _, _ in trained]
    assert len(uids) == len(set(uids))  # no trajectory trained twice
    assert len(rollouts.played) == len(set(rollouts.played))  # no group played twice
    assert not trainer.pending  # nothing generated past the last update (grpo.updates = 5)


def test_a_group_older_than_k_is_never_trained(tmp_path):
    """A k=2 run resumed with k=1: its pending batches, sampled 2 versions behind, are dropped by the gate."""
    first, _, _ = build(make_cfg(tmp_path, 2), tmp_path / "run")
    first.start()
    first.run(3)
    assert [(b.target, b.version) for b in first.pending] == [(3, 1), (4, 2)]
    resumed, learner, rollouts = build(make_cfg(tmp_path, 1), tmp_path / "run")
    resumed.start(resume=True)
    records = resumed.run(6)
    m3, m4, m5 = (r.metrics for r in records)
    for m in (m3, m4):
        assert m["staleness/dropped_groups"] == m["filter/kept_groups"] > 0
        assert m["learner/skipped"] == 1.0 and m["staleness/groups_0"] == m["staleness/groups_1"] == 0.0
    assert m5["staleness/dropped_groups"] == 0.0 and m5["staleness/groups_1"] > 0
    assert [{v for _, v, _ in t} for t in learner.trained] == [{4}]  # only update 5's batch (version 4) trained
    assert rollouts.loaded == [3, 4, 5, 6]


def test_resume_with_max_staleness_1_is_exact(tmp_path):
    full, full_learner, full_rollouts = build(make_cfg(tmp_path, 1), tmp_path / "full")
    full.start()
    full_records = full.run(5)

    part, part_learner, part_rollouts = build(make_cfg(tmp_path, 1), tmp_path / "part")
    part.start()
    part.run(2)
    resumed, res_learner, res_rollouts = build(make_cfg(tmp_path, 1), tmp_path / "part")  # a new process
    resumed.start(resume=True)
    assert resumed.update == 2 and [b.target for b in resumed.pending] == [2]
    res_records = resumed.run(5)

    assert part_learner.trained + res_learner.trained == full_learner.trained
    assert [stable(r.metrics) for r in res_records] == [stable(r.metrics) for r in full_records[2:]]
    # the pending batch came from the checkpoint: nothing was played or judged twice
    assert part_rollouts.played + res_rollouts.played == full_rollouts.played
    assert resumed.filter.state_dict() == full.filter.state_dict()
    assert resumed.sampler.state_dict() == full.sampler.state_dict()


def test_a_learner_error_surfaces_after_the_rollouts(tmp_path):
    trainer, learner, rollouts = build(make_cfg(tmp_path, 1), tmp_path / "run")

    def broken(samples, cfg):
        raise RuntimeError("out of memory")

    learner.grpo_update = broken
    trainer.start()
    with pytest.raises(RuntimeError, match="out of memory"):
        trainer.step()
    assert trainer.update == 0 and [b.target for b in trainer.pending] == [0, 1]  # nothing lost
    learner.grpo_update = RecordingLearner().grpo_update
    assert trainer.step().update == 1


def test_max_staleness_zero_changes_nothing(tmp_path):
    """At k = 0 the loop is the synchronous one: every batch is sampled by the version that trains it."""
    trainer, learner, _ = build(make_cfg(tmp_path, 0), tmp_path / "sync")
    trainer.start()
    trainer.run(3)
    assert [{v for _, v, _ in t} for t in learner.trained] == [{0}, {1}, {2}]
    assert not (tmp_path / "sync" / "checkpoints" / "update-000003" / "pending.pkl").exists()


# ---------------------------------------------------------------------------------- bounds, failures, versions
def test_batches_are_generated_ahead_up_to_the_last_update_only(tmp_path):
    assert list(ahead_targets(0, 0, 2, 5)) == [1, 2]
    assert list(ahead_targets(2, 1, 2, 5)) == [3]
    assert list(ahead_targets(4, 3, 2, 5)) == []  # update 4 is the last one: nothing for 5 or 6
    assert list(ahead_targets(0, 0, 3, 1)) == []
    trainer, _, _ = build(make_cfg(tmp_path, 2, updates=4), tmp_path / "run")
    targets = []
    generate = trainer._generate
    trainer._generate = lambda target, version: targets.append(target) or generate(target, version)
    trainer.start()
    trainer.run()
    assert sorted(targets) == [0, 1, 2, 3] and not trainer.pending
    trainer.run(6)  # asked for more updates: the bound moves with them
    assert sorted(targets) == [0, 1, 2, 3, 4, 5] and trainer.update == 6 and not trainer.pending


class SteppingLearner(RecordingLearner):
    """A recording learner taking several optimizer steps per update (grpo.mini_batches) that fails on the
    ``fail_at``-th call of grpo_update; with ``rollback`` it keeps and restores snapshots as `Learner` does."""

    def __init__(self, fail_at=None, rollback=True):
        super().__init__()
        self.calls, self.fail_at = 0, fail_at
        if rollback:
            self.snapshot = lambda: setattr(self, "_snap", (self.step, list(self.trained))) or self.step
            self.rollback = self._rollback

    def _rollback(self):
        self.step, self.trained = self._snap[0], list(self._snap[1])
        return self.step

    def token_logprobs(self, samples, masked_only=False):
        return [np.zeros(len(s.input_ids)) for s in samples]

    def grpo_update(self, samples, loss_cfg, old_logprobs=None):
        self.calls += 1
        if self.calls == self.fail_at:
            raise RuntimeError("out of memory")
        return super().grpo_update(samples, loss_cfg)


def test_a_learner_failing_after_some_of_a_batchs_steps_is_rolled_back_and_trains_it_once(tmp_path):
    clean, clean_learner, _ = build(make_cfg(tmp_path, 1, mini_batches=2), tmp_path / "clean", SteppingLearner())
    clean.start()
    clean.run(3)
    trainer, learner, _ = build(make_cfg(tmp_path, 1, mini_batches=2), tmp_path / "run", SteppingLearner(fail_at=4))
    trainer.start()
    trainer.step()
    with pytest.raises(RuntimeError, match="out of memory"):
        trainer.step()  # update 1: its first optimizer step was taken, the second failed
    assert trainer.update == 1 and learner.step == 2 and [b.target for b in trainer.pending] == [1, 2]
    trainer.run(3)
    assert learner.trained == clean_learner.trained  # the batch trained once, as if nothing had failed
    assert trainer.dropped_batches == 0 and trainer.history[-1].metrics["learner/dropped_batches"] == 0.0


def test_a_learner_that_cannot_roll_back_drops_the_half_trained_batch_and_counts_it(tmp_path):
    trainer, learner, _ = build(make_cfg(tmp_path, 1, mini_batches=2), tmp_path / "run",
                                SteppingLearner(fail_at=2, rollback=False))
    trainer.start()
    with pytest.raises(RuntimeError, match="out of memory"):
        trainer.step()  # update 0: one of its two steps taken
    half = {u for u, _, _ in learner.trained[0]}
    assert trainer.dropped_batches == 1 and [b.target for b in trainer.pending] == [1]
    rec = trainer.step()  # update 0 again, on a freshly generated batch
    assert rec.update == 1 and rec.metrics["learner/dropped_batches"] == 1.0
    retrained = {u for t in learner.trained[1:] for u, _, _ in t}
    assert retrained and not half & retrained  # nothing of the dropped batch is trained a second time


class ServedRollouts(ScriptedRollouts):
    """Scripted rollouts whose engine replicas report the adapter they serve (name, version, digest of the files
    loaded). With ``swap``, replica 0 moves to the next version while a batch is played (after the sync checked
    it); with ``relabel``, trajectories come back labelled with another version than the one asked for."""

    def __init__(self, swap=False, relabel=0):
        super().__init__()
        self.swap, self.relabel, self.adapter, self.moved = swap, relabel, None, False

    def load_adapter(self, path, name, version):
        from bapsql.rollout.engines.base import AdapterRef, adapter_digest

        super().load_adapter(path, name, version)
        self.adapter, self.moved = AdapterRef(name, version, str(path), 1, adapter_digest(path)), False
        return self.adapter

    def replica_served_adapters(self, adapter):
        import dataclasses

        moved = dataclasses.replace(self.adapter, version=self.adapter.version + 1) if self.moved else self.adapter
        return [moved, self.adapter]

    def play(self, prompts, policy_version):
        self.moved = self.swap
        return super().play(prompts, policy_version + self.relabel)


@pytest.mark.parametrize("k", [0, 1])
def test_a_trajectorys_version_must_be_the_adapter_version_the_engine_served(tmp_path, k):
    from bapsql.errors import WeightSyncError

    ok, learner, _ = build(make_cfg(tmp_path, k), tmp_path / "ok", rollouts=ServedRollouts())
    ok.start()
    ok.run(3)
    assert len(learner.trained) == 3
    swapped, _, _ = build(make_cfg(tmp_path, k), tmp_path / "swap", rollouts=ServedRollouts(swap=True))
    swapped.start()
    with pytest.raises(WeightSyncError, match=r"replicas served adapter versions \{0: 1\}"):
        swapped.step()
    relabelled, _, _ = build(make_cfg(tmp_path, k), tmp_path / "relabel", rollouts=ServedRollouts(relabel=1))
    relabelled.start()
    with pytest.raises(WeightSyncError, match="labelled with versions"):
        relabelled.step()
