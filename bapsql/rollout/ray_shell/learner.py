"""The learner as a Ray actor, for clusters where the driver runs on a node without the learner's GPU.

`RemoteLearner(cfg, num_gpus=1, num_cpus=4, resources=...)` starts `bapsql.train.learner.core.Learner` in an actor and
exposes the methods the GRPO loop, weight sync and checkpoints call (``grpo_update``, ``sft_update``,
``token_logprobs``, ``logprobs_of``, ``save_adapter``, ``adapter_state``, ``load_adapter_state``, ``training_state``,
``load_training_state``, ``save_state``, ``load_state``, ``merge_and_save``, ``snapshot``, ``rollback``), each a
blocking call. An actor no node can host fails the constructor with `PlacementError` after ``placement_timeout_s``
(`bapsql.rollout.ray_shell.nodes.await_actors`), not a wait without end.

Checkpoints: the actor writes and reads its own state (``save_state`` / ``load_state``: adapter, optimizer,
scheduler, step, its process's RNG; tensors moved to the CPU, loaded with ``map_location``), so no GPU tensor is ever
deserialised by the driver. Paths passed to it (adapter folders, merged models, checkpoints) must be on storage the
actor's node shares with the driver and the engines.

The actor is not restarted by Ray (``max_restarts=0``: a restarted learner would have lost its weights silently).
When its node is lost, calls raise `LearnerLost`; the job resumes from its last checkpoint with a new
`RemoteLearner`, which Ray places on any node with the resources asked for.
"""

from __future__ import annotations

from typing import Any

import ray
from ray import exceptions as rex

from bapsql.errors import RolloutError
from bapsql.train.learner.config import LearnerConfig

_METHODS = ("grpo_update", "sft_update", "token_logprobs", "logprobs_of", "save_adapter", "adapter_state",
            "load_adapter_state", "training_state", "load_training_state", "save_state", "load_state",
            "merge_and_save", "snapshot", "rollback")


class LearnerLost(RolloutError):
    """Raised when the remote learner's actor died (its process crashed or its node was lost): resume from the last
    checkpoint with a new `RemoteLearner`."""


class _Host:
    """Actor body: builds the learner in the actor's process and forwards calls to it."""

    def __init__(self, cfg: LearnerConfig):
        from bapsql.train.learner.core import Learner

        self.learner = Learner(cfg)

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.learner, method)(*args, **kwargs)

    def step(self) -> int:
        return self.learner.step

    def node_id(self) -> str:
        return ray.get_runtime_context().get_node_id()


class RemoteLearner:
    """A `Learner` in a Ray actor with the same blocking interface (see the module docstring). ``resources``:
    custom resources the actor needs (e.g. ``{"learner_gpu": 1}``: only nodes that offer it can host it)."""

    def __init__(self, cfg: LearnerConfig, *, num_gpus: float = 1.0, num_cpus: float = 1.0,
                 resources: dict[str, float] | None = None, placement_timeout_s: float = 60.0):
        from bapsql.rollout.placement import TRAIN_KEYS
        from bapsql.rollout.ray_shell.nodes import await_actors

        self.cfg = cfg
        self._actor = ray.remote(_Host).options(num_gpus=num_gpus, num_cpus=num_cpus, resources=resources or None,
                                                max_restarts=0).remote(cfg)
        asks = {"CPU": float(num_cpus), "GPU": float(num_gpus), **(resources or {})}
        try:  # placed within the bound (else PlacementError), then its constructor (the model load) is awaited
            await_actors({"learner": self._actor}, asks={"learner": asks}, where={"learner": "on any node"},
                         keys=TRAIN_KEYS, placement_timeout_s=placement_timeout_s, ready=False)
        except BaseException:
            ray.kill(self._actor, no_restart=True)
            raise
        self._get(self._actor.__ray_ready__.remote())

    def _get(self, ref: Any) -> Any:
        try:
            return ray.get(ref)
        except (rex.RayActorError, rex.WorkerCrashedError, rex.NodeDiedError) as exc:
            raise LearnerLost(f"the remote learner died ({type(exc).__name__}); resume from the last checkpoint "
                              "with a new learner") from exc

    def __getattr__(self, name: str) -> Any:
        if name not in _METHODS:
            raise AttributeError(name)

        def call(*args: Any, **kwargs: Any) -> Any:
            return self._get(self._actor.call.remote(name, *args, **kwargs))
        return call

    @property
    def step(self) -> int:
        return self._get(self._actor.step.remote())

    def node_id(self) -> str:
        """The Ray node the learner runs on."""
        return self._get(self._actor.node_id.remote())

    def close(self) -> None:
        ray.kill(self._actor, no_restart=True)
