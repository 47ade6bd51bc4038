"""A simulated multi-node Ray cluster for the slow tier: several raylets on this machine (`ray.cluster_utils.Cluster`).

`SimCluster` starts a head with one CPU and no GPU or custom resources (like a cluster's CPU-only head: the driver,
and the writer when it is pinned to the driver's node) and adds worker nodes with the custom resources that stand in
for GPU nodes (``engine_gpu``, ``learner_gpu``) or env nodes (``env_node``). Every node shares one short temp dir
under the test's tmp path, and dead nodes are detected within about five seconds (fast health checks), so a removed
node (`remove`: its raylet and every worker process on it killed, not gracefully — a lost spot instance) is noticed
quickly. The cluster's address is never written where ``address="auto"`` would find it (other users' jobs). The driver (this process) joins with `bapsql.rollout.ray_shell.join_ray`. `close` kills every process of
the cluster; never ``ray stop``.

Fixtures: ``sim_cluster`` (function scope; each test shapes its own nodes) and ``sim_cluster_module`` (one per
test module).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import pytest

REPO = Path(__file__).resolve().parents[2]
HEALTH = {"health_check_period_ms": 1000, "health_check_failure_threshold": 5, "health_check_initial_delay_ms": 0}


class SimCluster:
    """Head (no resources) + worker nodes on this machine (module docstring)."""

    def __init__(self, temp_dir: str):
        import ray._private.utils
        from ray.cluster_utils import Cluster

        self._write_address = ray._private.utils.write_ray_address
        ray._private.utils.write_ray_address = lambda *a, **k: None  # never advertise it as the machine's "auto"
        self.temp_dir = temp_dir
        self.cluster = Cluster(initialize_head=True, head_node_args={
            "num_cpus": 1, "temp_dir": temp_dir, "include_dashboard": False,
            "_system_config": HEALTH, "object_store_memory": 80 * 1024 * 1024})
        self.address = self.cluster.address
        self.head_id = self.cluster.head_node.node_id

    def add(self, *, num_cpus: float = 1, resources: dict[str, float] | None = None) -> str:
        """Add a worker node; returns its node id."""
        node = self.cluster.add_node(num_cpus=num_cpus, resources=resources or {}, temp_dir=self.temp_dir,
                                     object_store_memory=80 * 1024 * 1024)
        self.cluster.wait_for_nodes()
        return node.node_id

    def remove(self, node_id: str) -> None:
        """Kill a worker node at once (raylet and its workers), as a lost machine."""
        node = next(n for n in self.cluster.worker_nodes if n.node_id == node_id)
        self.cluster.remove_node(node, allow_graceful=False)

    def close(self) -> None:
        import ray._private.utils

        self.cluster.shutdown()
        ray._private.utils.write_ray_address = self._write_address


def _started(tmp) -> Iterator[SimCluster]:
    pytest.importorskip("ray")
    from bapsql.rollout.ray_shell import short_temp_dir

    saved = {k: os.environ.get(k) for k in ("RAY_AUTH_MODE", "RAY_USAGE_STATS_ENABLED", "PYTHONPATH", "RAY_ADDRESS")}
    os.environ.update(RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0",
                      PYTHONPATH=os.pathsep.join([str(REPO), saved["PYTHONPATH"] or ""]))
    os.environ.pop("RAY_ADDRESS", None)
    c = SimCluster(short_temp_dir(tmp))
    try:
        yield c
    finally:
        c.close()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture(name="sim_cluster")
def sim_cluster_fixture(tmp_path):
    yield from _started(tmp_path)


@pytest.fixture(name="sim_cluster_module", scope="module")
def sim_cluster_module_fixture(tmp_path_factory):
    yield from _started(tmp_path_factory.mktemp("cluster"))
