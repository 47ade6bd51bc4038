"""The GRPO loop end to end in-process (LocalBackend + HF engine + tiny model + mini benchmark): metrics, starving
filter, and exact resume (same next batch, same metrics, same adapter as an uninterrupted run)."""

import numpy as np
import pytest

from bapsql.logs.monitor import MemoryMonitor
from bapsql.train.algo.filter import FilterConfig
from bapsql.train.config import (CheckpointSection, GRPOSection, ModelSection, RolloutSection, SyncSection,
                                 TrainConfig, BudgetSection, DataSection, MonitorSection)

torch = pytest.importorskip("torch")

VOLATILE = ("time/", "throughput/", "sync/seconds")


def token_reward(group):
    """A toy reward that depends on what was sampled: the share of even token ids the policy emitted."""
    out = []
    for t in group:
        toks = [i for s in t.segments for i, m in zip(s.input_ids, s.loss_mask) if m]
        out.append(sum(1 for i in toks if i % 2 == 0) / max(1, len(toks)))
    return np.array(out)


def make_cfg(tiny, bench, out, *, filter_enabled=False):
    return TrainConfig(
        name="loop", model=ModelSection(base=str(tiny), dtype="float32", device="cpu", threads=1), out_dir=str(out),
        data=DataSection(benchmark=str(bench), split="train"),
        grpo=GRPOSection(lr=1e-2, updates=3, max_new_tokens=6, temperature=1.0, top_p=1.0, sft_init="none"),
        filter=FilterConfig(group_size=4, min_success=1, max_success=3, groups_per_update=2, max_rounds=2,
                            enabled=filter_enabled),
        budgets=BudgetSection(levels=("XS", "S")),
        rollout=RolloutSection(engine={"kind": "hf", "dtype": "float32", "device": "cpu", "num_threads": 1,
                                       "max_model_len": 4096}, use_ray=False, env_workers=1),
        sync=SyncSection(tolerance=1e-3), checkpoint=CheckpointSection(every=1, keep=5),
        monitor=MonitorSection(kind="memory"))


def build(cfg, tiny, run_dir, learner=None):
    from bapsql.data.load import load_benchmark
    from bapsql.env.records import EnvOptions
    from bapsql.models.chat_template import ChatTemplate
    from bapsql.rollout.agent import AgentConfig
    from bapsql.rollout.backend import LocalBackend
    from bapsql.train.learner.core import Learner
    from bapsql.train.learner.weight_sync import make_probe
    from bapsql.train.loop.engine_setup import engine_config
    from bapsql.train.loop.rollouts import TrainingRollouts
    from bapsql.train.loop.trainer import GRPOTrainer

    tasks = sorted(load_benchmark(cfg.data.benchmark, split="train").tasks, key=lambda t: t.task_id)
    learner = learner or Learner(cfg.learner_config(tiny, "grpo", seed=0, total_steps=3))
    rollouts = TrainingRollouts(LocalBackend(), run_name="loop", method="model.policy",
                                agent=AgentConfig(model_dir=str(tiny), max_tokens=6), engine=engine_config(
                                    cfg, tiny, lora=True), tasks=tasks, group_size=4,
                                env_options=EnvOptions(prompt_style=cfg.prompt_style).under(cfg.condition),
                                writer_dir=str(run_dir / "rollouts"))
    monitor = MemoryMonitor()
    trainer = GRPOTrainer(cfg, seed=0, learner=learner, rollouts=rollouts, tasks=tasks,
                          probe=make_probe(ChatTemplate.from_dir(tiny)), run_dir=run_dir, monitor=monitor,
                          reward_fn=token_reward)
    return trainer, rollouts, monitor


def stable(metrics):
    return {k: v for k, v in metrics.items() if not k.startswith(VOLATILE)}


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    from tests.policies.minibench import build_minibench

    return build_minibench(tmp_path_factory.mktemp("minibench"))


@pytest.mark.slow
def test_resume_equals_an_uninterrupted_run(tiny_model_dir, bench, tmp_path):
    cfg = make_cfg(tiny_model_dir, bench, tmp_path)
    full, ro, mon = build(cfg, tiny_model_dir, tmp_path / "full")
    full.start()
    records = full.run(3)
    ro.close()
    assert [r.update for r in records] == [1, 2, 3]
    m = records[0].metrics
    for key in ("reward/mean", "learner/loss", "learner/grad_norm", "filter/kept_share", "filter/successes_0",
                "mismatch/logprob_abs_mean", "sync/logprob_mismatch_mean", "time/rollout_share",
                "throughput/learner_tokens_per_s", "success/all"):
        assert key in m, key
    assert m["learner/skipped"] == 0.0 and m["mismatch/logprob_abs_mean"] < 1e-4
    assert [step for step, _ in mon.history] == [1, 2, 3]
    assert sorted(p.name for p in (tmp_path / "full" / "rollouts" / "episodes").rglob("*.parquet"))

    part, ro, _ = build(cfg, tiny_model_dir, tmp_path / "part")
    part.start()
    part.run(2)
    ro.close()
    resumed, ro, _ = build(cfg, tiny_model_dir, tmp_path / "part")  # a new process: fresh learner and engine
    resumed.start(resume=True)
    assert resumed.update == 2
    assert resumed.sampler.state_dict() == full_sampler_after(cfg, tiny_model_dir, bench, tmp_path, 2)
    last = resumed.step()
    ro.close()
    assert last.update == 3
    assert stable(last.metrics) == pytest.approx(stable(records[2].metrics), rel=1e-6, abs=1e-9)
    for k, v in full.learner.adapter_state().items():
        torch.testing.assert_close(resumed.learner.adapter_state()[k], v)


def full_sampler_after(cfg, tiny, bench, tmp_path, updates):
    """The sampler state an uninterrupted run reaches after ``updates`` updates (read from its checkpoint)."""
    from bapsql.train.learner.checkpoint import checkpoint_path, read_state

    return read_state(checkpoint_path(tmp_path / "full" / "checkpoints", updates)).sampler


@pytest.mark.slow
def test_a_starving_filter_skips_the_update_and_says_so(tiny_model_dir, bench, tmp_path):
    cfg = make_cfg(tiny_model_dir, bench, tmp_path, filter_enabled=True)  # a random model never succeeds
    trainer, ro, _ = build(cfg, tiny_model_dir, tmp_path / "starve")
    trainer.start()
    rec = trainer.step()
    ro.close()
    m = rec.metrics
    assert m["filter/starved"] == 1.0 and m["learner/skipped"] == 1.0 and m["filter/kept_groups"] == 0.0
    assert m["filter/successes_0"] == m["filter/drawn_groups"] > 0 and m["filter/rounds"] == 2.0
    assert rec.sync.mean_abs < 1e-4  # the engine still serves the (unchanged) policy


@pytest.mark.slow
def test_policy_drift_from_sft_starts_at_zero_and_grows(tiny_model_dir, bench, tmp_path):
    import dataclasses

    cfg = make_cfg(tiny_model_dir, bench, tmp_path)
    cfg = dataclasses.replace(cfg, prompt_style="terse", grpo=dataclasses.replace(cfg.grpo, log_drift=True))
    trainer, ro, _ = build(cfg, tiny_model_dir, tmp_path / "drift")
    trainer.start()
    first, second = trainer.step(), trainer.step()
    ro.close()
    # version 0 is the reference itself (fresh LoRA): only engine-vs-learner numerics remain
    assert 0.0 <= first.metrics["drift/kl_k3"] < 1e-4
    assert second.metrics["drift/kl_k3"] > 10 * max(first.metrics["drift/kl_k3"], 1e-7)
