"""Training across nodes of a simulated cluster (slow tier; `tests.rollout.ray_cluster.SimCluster`).

The learner runs in an actor on a worker node offering ``learner_gpu`` (the head offers none). It writes and reads
its own checkpoint state, so: save → its node is lost → a new learner on another node loads the checkpoint → the
next update is identical to the one the lost learner made; and a GRPO run interrupted by losing the learner's node
resumes from its last checkpoint with the next update identical to an uninterrupted run's."""

from __future__ import annotations

import random
import time

import pytest

from bapsql.train.learner.core import Sample
from tests.rollout.ray_cluster import sim_cluster_module_fixture  # noqa: F401  (fixture)
from tests.train.loop.test_trainer import bench, build, make_cfg, stable  # noqa: F401  (bench is a fixture)

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.slow
NODE = {"learner_gpu": 1}


@pytest.fixture(scope="module")
def cluster(sim_cluster_module):
    from bapsql.rollout.ray_shell import join_ray

    sim_cluster_module.add(num_cpus=1, resources=NODE)
    sim_cluster_module.add(num_cpus=1, resources=NODE)
    with join_ray(sim_cluster_module.address):
        yield sim_cluster_module


def _remote(cfg):
    from bapsql.rollout.ray_shell.learner import RemoteLearner

    return RemoteLearner(cfg, num_gpus=0, num_cpus=1, resources=NODE)


def _lose_node_of(cluster, learner):
    """Kill the learner's node (and replace it, as an autoscaler would); the learner is gone."""
    from bapsql.rollout.ray_shell.learner import LearnerLost

    node = learner.node_id()
    cluster.remove(node)
    deadline = time.monotonic() + 120
    with pytest.raises(LearnerLost):  # as soon as Ray knows the node (and its worker processes) are gone
        while time.monotonic() < deadline:
            learner.step  # noqa: B018
            time.sleep(1)
    cluster.add(num_cpus=1, resources=NODE)
    return node


def test_a_remote_learner_resumes_on_another_node_with_an_identical_next_update(cluster, make_learner, tmp_path):
    from bapsql.train.learner.checkpoint import TrainState, load_checkpoint, save_checkpoint

    rng = random.Random(0)
    batches = [[Sample(tuple(rng.randrange(100, 8000) for _ in range(16)), tuple([0] * 8 + [1] * 8))
                for _ in range(3)] for _ in range(2)]
    cfg = make_learner(lr=1e-2).cfg
    first = _remote(cfg)
    first.sft_update(batches[0])
    ckpt = save_checkpoint(tmp_path / "ckpt", first, TrainState(update=1))
    assert {p.name for p in ckpt.iterdir()} == {"adapter", "trainer.pt", "rng.pt", "driver_rng.pt", "state.json"}
    expected = first.sft_update(batches[1])
    expected_adapter = first.adapter_state()
    lost = _lose_node_of(cluster, first)

    second = _remote(cfg)
    assert second.node_id() != lost
    assert load_checkpoint(ckpt, second).update == 1 and second.step == 1
    again = second.sft_update(batches[1])
    assert (again.loss, again.grad_norm, again.lr) == (expected.loss, expected.grad_norm, expected.lr)
    for k, v in expected_adapter.items():
        torch.testing.assert_close(second.adapter_state()[k], v, rtol=0, atol=0)
    second.close()


def test_grpo_resumes_after_losing_the_learners_node_as_if_uninterrupted(cluster, tiny_model_dir, bench, tmp_path):
    cfg = make_cfg(tiny_model_dir, bench, tmp_path)
    lcfg = cfg.learner_config(tiny_model_dir, "grpo", seed=0, total_steps=3)
    full, ro, _ = build(cfg, tiny_model_dir, tmp_path / "full", learner=_remote(lcfg))
    full.start()
    records = full.run(3)
    ro.close()
    full.learner.close()

    part, ro, _ = build(cfg, tiny_model_dir, tmp_path / "part", learner=_remote(lcfg))
    part.start()
    part.run(2)
    ro.close()
    lost = _lose_node_of(cluster, part.learner)  # mid-run: the learner's node goes away after update 2

    resumed, ro, _ = build(cfg, tiny_model_dir, tmp_path / "part", learner=_remote(lcfg))
    assert resumed.learner.node_id() != lost
    resumed.start(resume=True)
    assert resumed.update == 2
    last = resumed.step()
    ro.close()
    assert last.update == 3
    assert stable(last.metrics) == pytest.approx(stable(records[2].metrics), rel=1e-6, abs=1e-9)
    for k, v in full_adapter(tmp_path / "full").items():
        torch.testing.assert_close(resumed.learner.adapter_state()[k], v)
    resumed.learner.close()


def full_adapter(run_dir):
    """The uninterrupted run's adapter after update 3 (its last checkpoint)."""
    from safetensors.torch import load_file

    from bapsql.train.learner.checkpoint import latest_checkpoint

    return load_file(str(latest_checkpoint(run_dir / "checkpoints") / "adapter" / "adapter_model.safetensors"))
