"""Nodes of a Ray cluster: where actors go, where they are, and whether every node sees the shared storage.

Placement (`actor_options`): an `ActorSpec` reserves ``num_cpus`` / ``num_gpus`` and any custom ``resources`` (a
node started with ``--resources '{"engine_gpu": 1}'`` offers them; a head started without them never gets such an
actor), and says where it goes with ``placement``:

- ``"default"``: wherever Ray finds the resources;
- ``"spread"``: Ray's ``SPREAD`` strategy (env workers: sharded across the nodes that offer their resources);
- ``"driver"``: hard node affinity to the driver's node (the trajectory writer when the run folder is a local
  disk of the driver's node; it then lives and dies with the driver). A restarted actor goes through the same
  strategy, so an env worker or engine whose node is lost comes back on another node that has its resources.

`actor_node_ids(handles)` says where live actors run; `actor_restarts(handles)` how often Ray restarted each (the
GCS's own count: `RayBackend.restarts`).

`preflight(benchmark, run_dir)` runs one zero-CPU task pinned to every alive node: each must see the benchmark
folder (present and not empty) and be able to create, write, read back and delete a file in the run folder.
A node that cannot raises `StorageError` naming the node, the path and what to mount (cluster/README.md).
"""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from bapsql.errors import StorageError
from bapsql.rollout.backend import ActorSpec

PLACEMENTS = ("default", "spread", "driver")


def driver_node_id() -> str:
    return ray.get_runtime_context().get_node_id()


def actor_options(spec: ActorSpec, *, max_restarts: int) -> dict[str, Any]:
    """``ray.remote(cls).options(**...)`` for ``spec`` (module docstring)."""
    opts: dict[str, Any] = dict(num_cpus=spec.num_cpus, num_gpus=spec.num_gpus, max_restarts=max_restarts,
                                max_task_retries=0, max_concurrency=1)
    if spec.resources:
        opts["resources"] = dict(spec.resources)
    if spec.placement == "spread":
        opts["scheduling_strategy"] = "SPREAD"
    elif spec.placement == "driver":
        opts["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id=driver_node_id(), soft=False)
    return opts


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
