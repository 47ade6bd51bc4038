"""Where rollout actors may go on a cluster, and what to say when they cannot go anywhere. Pure (no Ray).

`bapsql.rollout.ray_shell` reads the cluster (``ray.nodes()``, the free resources per node) into `NodeOffer` s and
asks this module:

- `avoid_head(asks, nodes)`: whether env workers must be kept off the head node. cluster/README.md promises that
  nothing heavy lands on the head. Env workers that ask for a custom resource the head does not offer stay off it
  anyway (Ray never places them there); env workers that ask only for CPUs would take the head's CPUs (the driver's,
  and those of anything pinned to the driver's node), so on a cluster of more than one node they are kept off the
  head — unless no other node could ever host one, or the head offers the custom resources they ask for (the
  operator gave it ``env_node``: it is meant to host them).
- `placement_message(...)`: the `PlacementError` text for an actor still unplaced after the bounded wait — the
  actor, the resources it asked for, where it had to go, what each node offers (total and free), and the config
  keys that change it (`ConfigKeys`: the sweep's `SWEEP_KEYS`, the training job's `TRAIN_KEYS`).
- `check_engine_gpus(engine_gpus, tensor_parallel_size, keys)`: an engine actor reserves the GPUs its vLLM splits
  the model over (tensor parallelism runs vLLM's ``mp`` executor inside the actor), so a config whose ``engine_gpus``
  differs from ``tensor_parallel_size`` is refused at load, with the fix in the message.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

from bapsql.errors import ConfigError

# resources Ray gives every node that say nothing about what an actor may use
_BOOKKEEPING = ("memory", "object_store_memory")


@dataclass(frozen=True)
class NodeOffer:
    """One alive node: its id, host, whether it is the head, and its resources (``total``; ``free`` now)."""

    node_id: str
    host: str
    head: bool
    total: Mapping[str, float]
    free: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class ConfigKeys:
    """The config keys that size or place each kind of actor (``actors``: actor kind → keys), and the one that bounds
    the wait for placement (``timeout``)."""

    actors: Mapping[str, str]
    timeout: str


SWEEP_KEYS = ConfigKeys({"env": "workers.env_worker_cpus / workers.env_resources",
                         "engine": "workers.engine_cpus / workers.engine_gpus / workers.engine_resources",
                         "writer": "workers.writer / workers.writer_resources"},
                        "workers.placement_timeout_s")
TRAIN_KEYS = ConfigKeys({"env": "rollout.env_worker_cpus / rollout.env_resources",
                         "engine": "rollout.engine_gpus / rollout.engine.tensor_parallel_size",
                         "writer": "rollout.write_trajectories",
                         "learner": "model.learner_gpus / model.learner_cpus"},
                        "rollout.placement_timeout_s")


def usable(resources: Mapping[str, float]) -> dict[str, float]:
    """The resources an actor can ask for (CPU, GPU, custom ones), without Ray's per-node bookkeeping entries."""
    return {k: float(v) for k, v in resources.items()
            if k not in _BOOKKEEPING and not k.startswith(("node:", "accelerator_type:"))}


def fits(asks: Mapping[str, float], offer: Mapping[str, float]) -> bool:
    """Whether ``offer`` holds every amount ``asks`` names (zero amounts always fit)."""
    return all(amount <= 0 or offer.get(name, 0.0) + 1e-9 >= amount for name, amount in asks.items())


def avoid_head(asks: Mapping[str, float], nodes: Sequence[NodeOffer]) -> str | None:
    """The head's node id when actors asking for ``asks`` (e.g. ``{"CPU": 1}``) must be kept off it, else None
    (module docstring)."""
    head = next((n for n in nodes if n.head), None)
    others = [n for n in nodes if not n.head]
    if head is None or not others or not any(fits(asks, n.total) for n in others):
        return None
    custom = {k: v for k, v in asks.items() if k not in ("CPU", "GPU") and v > 0}
    if custom:  # the head either offers them (meant to host these actors) or never gets one anyway
        return None
    return head.node_id


def _fmt(res: Mapping[str, float]) -> str:
    return ", ".join(f"{name} {amount:g}" for name, amount in sorted(res.items())) or "nothing"


def describe_node(node: NodeOffer) -> str:
    """``3f2a1b2c (head, host): CPU 1 (0 free), env_node 2 (1 free)``."""
    total = usable(node.total)
    parts = ", ".join(f"{name} {amount:g} ({node.free.get(name, 0.0):g} free)"
                      for name, amount in sorted(total.items()))
    role = "head, " if node.head else ""
    return f"{node.node_id[:8]} ({role}{node.host}): {parts or 'no resources'}"


def placement_message(actor: str, asks: Mapping[str, float], where: str, nodes: Sequence[NodeOffer],
                      keys: ConfigKeys, waited_s: float, *, others: Sequence[str] = ()) -> str:
    """The `PlacementError` text (module docstring). ``actor``: its key (``env/0``); ``asks``: the resources it
    asked for; ``where``: the constraint it was placed under (``anywhere``, ``pinned to the driver's node 3f2a``,
    ``spread, kept off the head 3f2a``); ``others``: further actors still unplaced."""
    kind = actor.split("/", 1)[0]
    change = keys.actors.get(kind, "the actor's resources")
    more = f" (also unplaced: {', '.join(others)})" if others else ""
    offered = "; ".join(describe_node(n) for n in nodes) or "no alive node"
    return (f"actor {actor} was not placed on any node within {waited_s:.0f} s{more}: it asks for "
            f"{_fmt({k: v for k, v in asks.items() if v > 0})}, {where}. The cluster's nodes offer: {offered}. "
            f"Lower what it asks for with {change}, or add a node that offers it; {keys.timeout} sets this wait.")


def check_engine_gpus(engine_gpus: float, tensor_parallel_size: int, keys: tuple[str, str]) -> None:
    """Refuse an engine whose actor would not reserve the GPUs its vLLM uses (module docstring). ``engine_gpus`` of
    0 (the GPUs the process sees, unreserved: a single machine) or a fraction (replicas sharing one GPU) is fine
    with ``tensor_parallel_size: 1``; otherwise the two must be equal. ``keys``: the two config keys, e.g.
    ``("workers.engine_gpus", "engines.qwen.tensor_parallel_size")``."""
    gpus_key, tp_key = keys
    tp = int(tensor_parallel_size)
    if tp == 1 and engine_gpus <= 1:
        return
    if float(engine_gpus) == float(tp):
        return
    raise ConfigError(
        f"{gpus_key} is {engine_gpus:g} but {tp_key} is {tp}: an engine actor reserves the GPUs its vLLM splits the "
        f"model over (tensor parallelism runs inside the actor), so the two must be equal. Set {gpus_key}: {tp} "
        f"(or {tp_key}: {max(1, int(engine_gpus))})")
