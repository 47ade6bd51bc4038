"""Checkpoints restore the learner (adapter, optimizer, scheduler, step), RNG states and loop state exactly."""

import json
import random

import numpy as np
import pytest

from bapsql.errors import ConfigError
from bapsql.train.learner.checkpoint import (TrainState, latest_checkpoint, list_checkpoints, load_checkpoint, prune,
                                             read_state, save_checkpoint)
from bapsql.train.learner.core import Sample

torch = pytest.importorskip("torch")


def batch(seed):
    rng = random.Random(seed)
    return [Sample(tuple(rng.randrange(100, 8000) for _ in range(20)), tuple([0] * 10 + [1] * 10)) for _ in range(3)]


def test_resume_continues_exactly(make_learner, tmp_path):
    a = make_learner(lr=1e-2)
    a.sft_update(batch(0))
    a.sft_update(batch(1))
    path = save_checkpoint(tmp_path, a, TrainState(update=2, sampler={"pos": 5}, filter={"kept": 3},
                                                   extra={"policy_version": 2}))
    rand_after_save = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    cont_a = a.sft_update(batch(2))  # the uninterrupted run's next update

    b = make_learner(lr=1e-2, seed=123)  # a fresh process: different init seed, no history
    state = load_checkpoint(path, b)
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == rand_after_save
    assert state == TrainState(update=2, sampler={"pos": 5}, filter={"kept": 3}, extra={"policy_version": 2})
    assert b.step == 2
    cont_b = b.sft_update(batch(2))
    assert cont_b.loss == pytest.approx(cont_a.loss, rel=1e-6)
    assert cont_b.grad_norm == pytest.approx(cont_a.grad_norm, rel=1e-5)
    for k, v in a.adapter_state().items():
        torch.testing.assert_close(b.adapter_state()[k], v)


def test_atomic_listing_latest_and_prune(make_learner, tmp_path):
    learner = make_learner()
    for u in (1, 2, 3):
        save_checkpoint(tmp_path, learner, TrainState(update=u))
    (tmp_path / ".update-000004.tmp").mkdir()  # a crashed write is never picked
    (tmp_path / "update-000009").mkdir()  # nor a folder without state.json
    assert [p.name for p in list_checkpoints(tmp_path)] == ["update-000001", "update-000002", "update-000003"]
    assert latest_checkpoint(tmp_path).name == "update-000003"
    assert [p.name for p in prune(tmp_path, keep=2)] == ["update-000001"]
    assert read_state(latest_checkpoint(tmp_path)).update == 3
    assert json.loads((latest_checkpoint(tmp_path) / "state.json").read_text())["update"] == 3
    assert (latest_checkpoint(tmp_path) / "adapter" / "adapter_config.json").is_file()
    assert latest_checkpoint(tmp_path / "nothing") is None
    with pytest.raises(ConfigError):
        read_state(tmp_path / "update-000009")


class _Remote:
    """Stands in for a remote learner: only what crosses the driver/actor boundary is allowed."""

    def __init__(self, learner):
        self.learner, self.calls = learner, []

    def __getattr__(self, name):
        if name in ("training_state", "adapter_state", "load_training_state", "load_adapter_state"):
            raise AssertionError(f"the driver asked the learner for {name}: tensors would cross to the driver")
        self.calls.append(name)
        return getattr(self.learner, name)


def test_the_learner_saves_and_loads_its_own_state_so_no_tensor_crosses_to_the_driver(make_learner, tmp_path):
    a = make_learner(lr=1e-2)
    a.sft_update(batch(0))
    remote = _Remote(a)
    path = save_checkpoint(tmp_path, remote, TrainState(update=1))
    assert remote.calls == ["save_state"]
    trainer = torch.load(path / "trainer.pt", weights_only=False)  # no map_location needed: all on the CPU
    moments = [t for s in trainer["optimizer"]["state"].values() for t in s.values() if torch.is_tensor(t)]
    assert moments and all(t.device.type == "cpu" for t in moments)
    b = _Remote(make_learner(lr=1e-2, seed=7))
    assert load_checkpoint(path, b).update == 1 and b.calls == ["load_state"]
    assert b.learner.step == 1
