"""The learner as a Ray actor, for clusters where the driver runs on a node without the learner's GPU.

`RemoteLearner(cfg, num_gpus=1, num_cpus=4)` starts `bapsql.train.learner.Learner` in an actor (Ray must be
initialized) and exposes the same methods the GRPO loop, weight sync and checkpoints call (``grpo_update``,
``sft_update``, ``token_logprobs``, ``logprobs_of``, ``save_adapter``, ``adapter_state``, ``load_adapter_state``,
``training_state``, ``load_training_state``, ``merge_and_save``), each a blocking call. Paths passed to it (adapter
folders, merged models, checkpoints) must be on storage the actor's node shares with the driver and the engines.
Ray is imported only here (inside the constructor), never by the plain learner.
"""

from __future__ import annotations

from typing import Any

from bapsql.train.config import LearnerConfig

_METHODS = ("grpo_update", "sft_update", "token_logprobs", "logprobs_of", "save_adapter", "adapter_state",
            "load_adapter_state", "training_state", "load_training_state", "merge_and_save")


class _Host:
    """Actor body: builds the learner in the actor's process and forwards calls to it."""

    def __init__(self, cfg: LearnerConfig):
        from bapsql.train.learner import Learner

        self.learner = Learner(cfg)

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.learner, method)(*args, **kwargs)

    def step(self) -> int:
        return self.learner.step


class RemoteLearner:
    """A `Learner` in a Ray actor with the same blocking interface (see the module docstring)."""

    def __init__(self, cfg: LearnerConfig, *, num_gpus: float = 1.0, num_cpus: float = 1.0):
        import ray

        self._ray = ray
        self.cfg = cfg
        self._actor = ray.remote(_Host).options(num_gpus=num_gpus, num_cpus=num_cpus, max_restarts=0).remote(cfg)
        ray.get(self._actor.__ray_ready__.remote())

    def __getattr__(self, name: str) -> Any:
        if name not in _METHODS:
            raise AttributeError(name)

        def call(*args: Any, **kwargs: Any) -> Any:
            return self._ray.get(self._actor.call.remote(name, *args, **kwargs))
        return call

    @property
    def step(self) -> int:
        return self._ray.get(self._actor.step.remote())

    def close(self) -> None:
        self._ray.kill(self._actor, no_restart=True)
