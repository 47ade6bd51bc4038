"""The learner as a Ray actor behaves like the plain learner (same losses, same probe logprobs)."""

import random

import pytest

from bapsql.train.learner.core import Sample


@pytest.mark.slow
def test_remote_learner_matches_the_local_one(make_learner, tiny_model_dir, tmp_path):
    pytest.importorskip("ray")
    from bapsql.errors import PlacementError
    from bapsql.rollout.ray_shell import local_ray
    from bapsql.rollout.ray_shell.learner import RemoteLearner

    rng = random.Random(0)
    batch = [Sample(tuple(rng.randrange(100, 8000) for _ in range(20)), tuple([0] * 10 + [1] * 10)) for _ in range(3)]
    local = make_learner(lr=1e-2)
    with local_ray(num_cpus=2):
        remote = RemoteLearner(local.cfg, num_gpus=0, num_cpus=1)
        a, b = local.sft_update(batch), remote.sft_update(batch)
        assert a.loss == pytest.approx(b.loss, rel=1e-6)
        assert local.logprobs_of([5, 6, 7], [8, 9]) == pytest.approx(remote.logprobs_of([5, 6, 7], [8, 9]), abs=1e-6)
        out = remote.save_adapter(tmp_path / "adapter")
        assert (out / "adapter_model.safetensors").is_file() and remote.step == 1
        with pytest.raises(AttributeError):
            remote.not_a_method  # noqa: B018
        assert remote.snapshot() == 1  # kept in the actor, restored there (pipelined GRPO's undo)
        remote.sft_update(batch)
        assert remote.step == 2 and remote.rollback() == 1 and remote.step == 1
        assert remote.sft_update(batch).loss == pytest.approx(local.sft_update(batch).loss, rel=1e-6)
        remote.close()
        # a learner no node can host (this cluster has no GPU) fails at once, not after a wait without end
        with pytest.raises(PlacementError, match=r"actor learner was not placed on any node within 2 s: it asks for "
                                                 r"CPU 1, GPU 1, on any node.*model.learner_gpus.*"
                                                 r"rollout.placement_timeout_s"):
            RemoteLearner(local.cfg, num_gpus=1, num_cpus=1, placement_timeout_s=2)
