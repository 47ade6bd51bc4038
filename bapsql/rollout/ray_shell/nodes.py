"""Nodes of a Ray cluster: where actors go, where they are, and whether every node sees the shared storage.

Placement (`actor_options`): an `ActorSpec` reserves ``num_cpus`` / ``num_gpus`` and any custom ``resources`` (a
node started with ``--resources '{"engine_gpu": 1}'`` offers them; a head started without them never gets such an
actor), and says where it goes with ``placement``:

- ``"default"``: wherever Ray finds the resources;
- ``"spread"``: Ray's ``SPREAD`` strategy (env workers: sharded across the nodes that offer their resources),
  kept off the head node on a multi-node cluster when `bapsql.rollout.placement.avoid_head` says so (a label
  selector ``ray.io/node-id: !HEAD``: env workers asking only for CPUs would otherwise take the head's, which the
  driver and everything pinned to its node need);
- ``"driver"``: hard node affinity to the driver's node (the trajectory writer when the run folder is a local
  disk of the driver's node; it then lives and dies with the driver). A restarted actor goes through the same
  strategy, so an env worker or engine whose node is lost comes back on another node that has its resources.

`actor_node_ids(handles)` says where live actors run; `actor_restarts(handles)` how often Ray restarted each (the
GCS's own count: `RayBackend.restarts`); `node_offers()` what each alive node offers (total and free).

`await_actors(handles, ...)` waits, with a bound, until every actor is placed (and its constructor has run): an
actor counts as placed once the GCS's actor table shows it ALIVE or with a worker process leased for it (a pid or a
worker port; a pending actor has neither). One still unplaced after ``placement_timeout_s`` raises `PlacementError`
(`bapsql.rollout.placement.placement_message`: the actor, what it asked for, what each node offers, the config keys
that change it) — a cluster that can never host an actor fails the job at start instead of leaving it pending
forever. A progress line (``progress.update(placed, description=...)``) names the actors still waited for.

`preflight(benchmark, run_dir)` runs one zero-CPU task pinned to every alive node: each must see the benchmark
folder (present and not empty) and be able to create, write, read back and delete a file in the run folder.
A node that cannot raises `StorageError` naming the node, the path and what to mount (cluster/README.md).
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import ray
from ray import exceptions as rex
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from bapsql.errors import PlacementError, RolloutError, StorageError
from bapsql.rollout.backend import ActorSpec
from bapsql.rollout.placement import ConfigKeys, NodeOffer, placement_message

PLACEMENTS = ("default", "spread", "driver")


def driver_node_id() -> str:
    return ray.get_runtime_context().get_node_id()


def spec_asks(spec: ActorSpec) -> dict[str, float]:
    """The resources ``spec`` reserves (CPU, GPU, custom)."""
    return {"CPU": float(spec.num_cpus), "GPU": float(spec.num_gpus),
            **{k: float(v) for k, v in spec.resources.items()}}


def actor_options(spec: ActorSpec, *, max_restarts: int, avoid_node: str | None = None) -> dict[str, Any]:
    """``ray.remote(cls).options(**...)`` for ``spec`` (module docstring); ``avoid_node``: a node a ``spread`` actor
    must not be placed on (the head, `bapsql.rollout.placement.avoid_head`)."""
    opts: dict[str, Any] = dict(num_cpus=spec.num_cpus, num_gpus=spec.num_gpus, max_restarts=max_restarts,
                                max_task_retries=0, max_concurrency=1)
    if spec.resources:
        opts["resources"] = dict(spec.resources)
    if spec.placement == "spread":
        opts["scheduling_strategy"] = "SPREAD"
        if avoid_node:
            opts["label_selector"] = {"ray.io/node-id": f"!{avoid_node}"}
    elif spec.placement == "driver":
        opts["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id=driver_node_id(), soft=False)
    return opts


def where_text(spec: ActorSpec, avoid_node: str | None = None) -> str:
    """Where ``spec`` had to go, as a placement error says it."""
    if spec.placement == "driver":
        return f"pinned to the driver's node {driver_node_id()[:8]}"
    if spec.placement == "spread":
        return ("spread across nodes" + (f" and kept off the head {avoid_node[:8]} (a head that offers the custom "
                                         "resources env workers ask for may host them)" if avoid_node else ""))
    return "on any node"


def node_offers() -> list[NodeOffer]:
    """What each alive node offers: its resources in total and free now (the GCS's view)."""
    try:
        free = ray._private.state.available_resources_per_node()
    except Exception:  # an older GCS API: totals only
        free = {}
    return [NodeOffer(n["NodeID"], n.get("NodeManagerHostname") or n.get("NodeManagerAddress", "?"),
                      "node:__internal_head__" in n.get("Resources", {}), dict(n.get("Resources", {})),
                      dict(free.get(n["NodeID"], {}))) for n in alive_nodes()]


def is_placed(handle: Any) -> bool:
    """Whether the actor has a node and a worker there: ALIVE, or pending with a worker leased (module docstring)."""
    info = _actor_info(handle)
    if info.get("State") in ("ALIVE", "DEAD"):  # DEAD: its ready call says why
        return True
    return bool(info.get("Pid")) or bool(info.get("Address", {}).get("Port"))


def await_actors(handles: Mapping[Any, Any], *, asks: Mapping[Any, Mapping[str, float]], where: Mapping[Any, str],
                 keys: ConfigKeys, placement_timeout_s: float, timeout_s: float | None = None, ready: bool = True,
                 started: float | None = None, progress: Any = None) -> None:
    """Wait until every actor of ``handles`` (key → actor handle) is placed and, with ``ready``, has run its
    constructor (module docstring). ``asks`` / ``where``: per key, what it reserves and where it had to go (for the
    error); ``started``: the ``time.monotonic()`` the bounds count from (default now); ``timeout_s``: the bound on
    the constructors (`RolloutError`). A constructor that raised, or an actor Ray calls unschedulable, fails here."""
    t0 = time.monotonic() if started is None else started
    refs = {h.__ray_ready__.remote(): key for key, h in handles.items()}
    waiting, placed = set(refs), set()
    while True:
        done: list = []
        if waiting:
            done, _ = ray.wait(list(waiting), num_returns=len(waiting), timeout=0.5)
        for ref in done:
            waiting.discard(ref)
            placed.add(refs[ref])
            _raise_if_failed(ref, refs[ref], asks, where, keys, time.monotonic() - t0)
        unplaced = [k for k in handles if k not in placed and not is_placed(handles[k])]
        placed.update(k for k in handles if k not in unplaced)
        if progress is not None:
            names = ", ".join(_name(k) for k in unplaced[:3]) + (" ..." if len(unplaced) > 3 else "")
            progress.update(len(placed), description=f"placing actors (waiting for {names})" if unplaced
                            else "placing actors (all placed; starting)")
        if not (waiting if ready else unplaced):
            return
        elapsed = time.monotonic() - t0
        if unplaced and elapsed >= placement_timeout_s:
            first = unplaced[0]
            raise PlacementError(placement_message(_name(first), asks[first], where[first], node_offers(), keys,
                                                   elapsed, others=[_name(k) for k in unplaced[1:]]))
        if timeout_s is not None and elapsed >= timeout_s:
            raise RolloutError(f"actors {[_name(refs[r]) for r in waiting]} did not finish starting within "
                               f"{timeout_s:.0f} s (their constructors: model loading, engine start-up)")


def _name(key: Any) -> str:
    return "/".join(map(str, key)) if isinstance(key, tuple) else str(key)


def _raise_if_failed(ref: Any, key: Any, asks: Mapping, where: Mapping, keys: ConfigKeys, elapsed: float) -> None:
    try:
        ray.get(ref)
    except rex.ActorUnschedulableError as exc:  # e.g. pinned to a node that left, or asking what no node has
        raise PlacementError(placement_message(_name(key), asks[key], where[key], node_offers(), keys, elapsed)
                             + f" (Ray: {exc})") from exc
    except rex.RayActorError as exc:  # its constructor raised: the actor never came up
        raise RolloutError(f"actor {_name(key)} failed to start: {exc}") from exc


def _actor_info(handle: Any) -> dict:
    return ray._private.state.actors(handle._actor_id.hex()) or {}  # the GCS's actor table entry


def actor_node_ids(handles: dict) -> dict:
    """Key → the node id its actor runs on now (empty string while it has none)."""
    return {k: _actor_info(h).get("Address", {}).get("NodeID", "") for k, h in handles.items()}


def actor_restarts(handles: dict) -> dict:
    """Key → how many times Ray restarted its actor (the GCS's ``NumRestarts``)."""
    return {k: int(_actor_info(h).get("NumRestarts", 0)) for k, h in handles.items()}


def alive_nodes() -> list[dict]:
    """``ray.nodes()`` entries of the alive nodes."""
    return [n for n in ray.nodes() if n.get("Alive")]


@dataclass(frozen=True)
class NodeCheck:
    """What one node saw: its id and host, and the problems (empty: it sees the benchmark and writes the run)."""

    node_id: str
    host: str
    problems: tuple[str, ...]


def check_storage(benchmark: str, run_dir: str) -> tuple[str, tuple[str, ...]]:
    """On this host: (host name, problems) for reading ``benchmark`` and writing ``run_dir`` (plain; the task body)."""
    problems = []
    bench = Path(benchmark)
    try:
        seen = bench.is_dir() and any(bench.iterdir())
    except OSError:
        seen = False
    if not seen:
        problems.append(f"cannot see the benchmark folder {bench} (missing or empty there)")
    probe = Path(run_dir) / f".preflight-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        probe.parent.mkdir(parents=True, exist_ok=True)
        probe.write_text("ok")
        if probe.read_text() != "ok":
            problems.append(f"wrote {probe} but read back something else")
        probe.unlink()
    except OSError as exc:
        problems.append(f"cannot write the run folder {run_dir}: {exc}")
    return socket.gethostname(), tuple(problems)


@ray.remote(num_cpus=0, max_retries=0)
def _check_on_node(benchmark: str, run_dir: str) -> tuple[str, tuple[str, ...]]:
    return check_storage(benchmark, run_dir)


def preflight(benchmark: str | Path, run_dir: str | Path, *, timeout_s: float = 120.0) -> list[NodeCheck]:
    """Check every alive node (module docstring); returns the per-node checks, raises `StorageError` if any fails."""
    nodes = alive_nodes()
    refs = {nid: _check_on_node.options(scheduling_strategy=NodeAffinitySchedulingStrategy(nid, soft=False)).remote(
        str(Path(benchmark).resolve()), str(Path(run_dir).resolve())) for nid in (n["NodeID"] for n in nodes)}
    ready, waiting = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s)
    checks = []
    for nid, ref in refs.items():
        if ref in waiting:
            checks.append(NodeCheck(nid, "?", (f"no answer within {timeout_s:.0f} s",)))
            continue
        try:
            host, problems = ray.get(ref)
        except ray.exceptions.RayError as exc:  # the node went away during the check
            host, problems = "?", (f"check failed: {type(exc).__name__}",)
        checks.append(NodeCheck(nid, host, problems))
    bad = [c for c in checks if c.problems]
    if bad:
        lines = "; ".join(f"node {c.node_id[:12]} ({c.host}): {', '.join(c.problems)}" for c in bad)
        raise StorageError(f"storage preflight failed on {len(bad)} of {len(checks)} nodes: {lines}. Every node "
                           "must mount the same shared volume at the same path for the benchmark and the run folder "
                           "(cluster/README.md, 'Shared storage').")
    return checks
