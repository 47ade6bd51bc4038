"""Sweeps on a simulated multi-node cluster (slow tier; `tests.rollout.ray_cluster.SimCluster`: raylets on this
machine). The head offers no env or engine resources; worker nodes offer ``env_node`` / ``engine_gpu`` (standing in
for GPU nodes) / ``storage`` (they mount the run folder). Actors land where their resources are, env workers spread
across nodes; when a node is lost in the middle of a sweep — with an env worker, an engine actor or the writer on it
— the sweep finishes with every episode written exactly once, and the restarts are counted. The CLI contract:
``bapsql sweep CONFIG --address ADDR --out RUN`` joins the cluster and survives a worker node's removal."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
import yaml

from tests.rollout.ray_cluster import REPO, sim_cluster_fixture  # noqa: F401  (fixture)
from tests.rollout.ray_fixtures import tiny_model_fixture  # noqa: F401  (fixture)
from tests.rollout.rollout_bench import build_rollout_bench
from tests.rollout.test_ray_sweep import _exactly_once

pytestmark = pytest.mark.slow
NODE = {"env_node": 1, "engine_gpu": 1, "storage": 1}


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    return build_rollout_bench(tmp_path_factory.mktemp("bench"))


def _config(bench, methods, *, engines=None, budgets=("XS",), seeds=(0, 1), **workers):
    from bapsql.experiment import ExperimentConfig, SamplingConfig, WorkersConfig, validate

    w = {"env_workers": 2, "env_worker_cpus": 0.25, "engine_cpus": 0.25, "in_flight": 16, "scripted_batch": 1,
         "env_resources": {"env_node": 1.0}, "engine_resources": {"engine_gpu": 1.0}}
    return validate(ExperimentConfig(run="cluster", methods=tuple(methods), benchmark=str(bench), split="dev",
                                     budgets=budgets, seeds=seeds, engines=engines or {},
                                     sampling=SamplingConfig(max_tokens=16),
                                     workers=WorkersConfig(**{**w, **workers})))


def test_actors_go_where_their_resources_are_and_survive_losing_the_engines_node(sim_cluster, bench, tiny_model,
                                                                                 tmp_path):
    from bapsql.rollout.engines.base import EngineConfig
    from bapsql.rollout.ray_shell import join_ray
    from bapsql.rollout.sweep import run_sweep

    a, b = sim_cluster.add(num_cpus=2, resources=NODE), sim_cluster.add(num_cpus=2, resources=NODE)
    engine = EngineConfig(kind="hf", model=str(tiny_model), max_model_len=12288, num_threads=1)
    cfg = _config(bench, ["workflow.estimate_rewrite", "model:tiny"], engines={"tiny": engine})
    seen: dict = {}

    def on_progress(done, total, be):
        if "nodes" not in seen:
            seen["nodes"] = be.nodes()
        pending = {key for _, key, _ in be._refs.values()}
        if "removed" not in seen and done >= 8 and ("engine", "tiny", 0) in pending:
            victim = be.nodes()[("engine", "tiny", 0)]
            sim_cluster.remove(victim)  # the engine's "GPU node" (and the env worker on it) is gone
            seen["removed"] = victim
            sim_cluster.add(num_cpus=2, resources=NODE)  # the autoscaler's replacement

    with join_ray(sim_cluster.address):
        s = run_sweep(cfg, out_dir=tmp_path / "run", on_progress=on_progress)
    nodes = seen["nodes"]
    assert {nodes[("env", 0)], nodes[("env", 1)]} == {a, b}  # sharded across the two env nodes, none on the head
    assert nodes[("engine", "tiny", 0)] in (a, b)
    assert nodes[("writer", 0)] == sim_cluster.head_id  # pinned to the driver's node (workers.writer: driver)
    assert seen["removed"] in (a, b)
    _exactly_once(tmp_path / "run", 2 * 1 * 2 * 12)
    assert s.actor_restarts.get("engine/tiny/0", 0) >= 1 and s.result.reruns >= 1
    record = json.loads((tmp_path / "run" / "sweep.json").read_text())
    assert record["actor_restarts"] == s.actor_restarts


def test_losing_the_writers_node_mid_sweep_loses_and_duplicates_nothing(sim_cluster, bench, tmp_path):
    from bapsql.rollout.ray_shell import join_ray
    from bapsql.rollout.sweep import run_sweep

    sim_cluster.add(num_cpus=2, resources=NODE), sim_cluster.add(num_cpus=2, resources=NODE)
    cfg = _config(bench, ["workflow.direct_aggregation", "scripted.drafter@dashboard"], budgets=("XS", "S"),
                  writer="any", writer_resources={"storage": 1.0})
    seen: dict = {}

    def on_progress(done, total, be):
        if "removed" not in seen and done >= 20:
            victim = be.nodes()[("writer", 0)]
            assert victim != sim_cluster.head_id
            sim_cluster.remove(victim)  # the writer (and an env worker) die with their node
            seen["removed"] = victim
            sim_cluster.add(num_cpus=2, resources=NODE)

    with join_ray(sim_cluster.address):
        s = run_sweep(cfg, out_dir=tmp_path / "run", on_progress=on_progress)
    assert "removed" in seen
    _exactly_once(tmp_path / "run", 2 * 2 * 2 * 12)
    assert s.actor_restarts.get("writer/0", 0) >= 1


def test_the_cli_joins_a_cluster_and_survives_losing_a_worker_node(sim_cluster, bench, tmp_path):
    """The contract: ``bapsql sweep CONFIG --address ADDR --out RUN`` exits 0 with every episode written once."""
    import ray

    from bapsql.rollout.ray_shell import join_ray

    sim_cluster.add(num_cpus=2, resources=NODE), sim_cluster.add(num_cpus=2, resources=NODE)
    methods = ["workflow.direct_aggregation", "workflow.estimate_rewrite", "scripted.drafter@dashboard"]
    config = tmp_path / "sweep.yaml"
    config.write_text(yaml.safe_dump({
        "run": "contract", "benchmark": str(bench), "split": "dev", "methods": methods, "budgets": ["XS", "S", "M"],
        "seeds": [0, 1, 2, 3], "workers": {"env_workers": 2, "env_worker_cpus": 0.25, "scripted_batch": 1,
                                        "in_flight": 4, "env_resources": {"env_node": 1.0}}}))
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONPATH": str(REPO)}
    bapsql = [sys.executable, "-c", "from bapsql.cli import main; main()"]  # the `bapsql` entry point
    proc = subprocess.Popen([*bapsql, "sweep", str(config), "--address",
                             sim_cluster.address, "--out", str(tmp_path / "run")], env=env, cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    removed = None
    with join_ray(sim_cluster.address):
        deadline = time.monotonic() + 240
        while removed is None and proc.poll() is None and time.monotonic() < deadline:
            live = [a for a in ray._private.state.actors().values()
                    if a["ActorClassName"] == "EnvWorker" and a["State"] == "ALIVE"]
            if len(live) == 2:  # both env workers up: the sweep is playing; take a worker node away
                removed = live[0]["Address"]["NodeID"]
                sim_cluster.remove(removed)
                sim_cluster.add(num_cpus=2, resources=NODE)
            time.sleep(0.2)
    out, _ = proc.communicate(timeout=600)
    assert removed is not None, out
    assert proc.returncode == 0, out
    total = len(methods) * 3 * 4 * 12
    _exactly_once(tmp_path / "run", total)
    record = json.loads((tmp_path / "run" / "sweep.json").read_text())
    assert record["episodes_run"] == total and sum(record["actor_restarts"].values()) >= 1, record


@pytest.fixture(scope="module")
def demo_bench(tmp_path_factory):
    """The embedded benchmark (small): six databases in dev, so four env workers each get their own."""
    from bapsql.data.demo import build_demo

    root = tmp_path_factory.mktemp("demo")
    build_demo(root, scale="small", seed=0, workers=1)
    return root


def _actors(cls_name):
    import ray

    return [a for a in ray._private.state.actors().values() if a["ActorClassName"] == cls_name]


def test_a_one_cpu_head_with_cpu_only_env_workers_completes_and_survives_losing_an_env_node(sim_cluster, demo_bench,
                                                                                          tmp_path):
    """Issue 35's scenario: a 1-CPU head and two 2-CPU workers, no custom resources, `bapsql sweep CFG --address
    ADDR --out RUN` with scripted methods and 4 env workers of 1 CPU. Before, one env worker took the head's only
    CPU and the writer pinned there stayed pending forever. Now the writer needs no CPU, env workers stay off the
    head, the sweep prints a placement progress line, finishes, and — losing an env worker's node mid-sweep — writes
    every episode exactly once."""
    from bapsql.rollout.ray_shell import join_ray

    sim_cluster.add(num_cpus=2), sim_cluster.add(num_cpus=2)
    methods = ["workflow:estimate_rewrite", "scripted.drafter@raw", "scripted.drafter@dashboard"]
    config = tmp_path / "sweep.yaml"
    config.write_text(yaml.safe_dump({
        "run": "issue35", "benchmark": str(demo_bench), "split": "dev", "methods": methods, "budgets": ["XS"],
        "seeds": [0], "workers": {"env_workers": 4, "env_worker_cpus": 1.0, "scripted_batch": 1, "in_flight": 4}}))
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONPATH": str(REPO)}
    bapsql = [sys.executable, "-c", "from bapsql.cli import main; main()"]
    proc = subprocess.Popen([*bapsql, "sweep", str(config), "--address", sim_cluster.address, "--out",
                             str(tmp_path / "run")], env=env, cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    removed, env_nodes, writer_nodes = None, set(), set()
    with join_ray(sim_cluster.address):
        deadline = time.monotonic() + 300
        while removed is None and proc.poll() is None and time.monotonic() < deadline:
            live = [a for a in _actors("EnvWorker") if a["State"] == "ALIVE"]
            writer_nodes |= {a["Address"]["NodeID"] for a in _actors("WriterHost") if a["State"] == "ALIVE"}
            if len(live) == 4:  # every env worker placed: the sweep is playing; take an env worker's node away
                env_nodes = {a["Address"]["NodeID"] for a in live}
                removed = live[0]["Address"]["NodeID"]
                sim_cluster.remove(removed)
                sim_cluster.add(num_cpus=2)  # the autoscaler's replacement
            time.sleep(0.2)
    out, _ = proc.communicate(timeout=600)
    assert removed is not None, out
    assert proc.returncode == 0, out
    assert sim_cluster.head_id not in env_nodes and len(env_nodes) == 2, out  # off the head, two per worker node
    assert writer_nodes == {sim_cluster.head_id}  # pinned to the driver's node, which it always fits
    assert "placing actors (all placed; starting): 5/5" in out, out
    total = len(methods) * 66
    _exactly_once(tmp_path / "run", total)
    record = json.loads((tmp_path / "run" / "sweep.json").read_text())
    assert record["episodes_run"] == total and sum(record["actor_restarts"].values()) >= 1, record


def test_an_actor_no_node_can_place_fails_the_sweep_within_60_s_naming_what_it_asked_for(sim_cluster, bench,
                                                                                         tmp_path):
    from bapsql.errors import PlacementError
    from bapsql.rollout.ray_shell import join_ray
    from bapsql.rollout.sweep import run_sweep

    worker = sim_cluster.add(num_cpus=2)
    cfg = _config(bench, ["workflow.estimate_rewrite"], env_worker_cpus=3.0, env_resources={},
                  placement_timeout_s=15.0)  # the largest node has 2 CPUs
    t0 = time.monotonic()
    with join_ray(sim_cluster.address), pytest.raises(PlacementError) as err:
        run_sweep(cfg, out_dir=tmp_path / "run")
    assert time.monotonic() - t0 < 60
    msg = str(err.value)
    assert msg.startswith("actor env/") and "within 15 s" in msg and "it asks for CPU 3" in msg
    assert "spread across nodes." in msg  # no node but the head could host it either: nothing to keep it off
    assert f"{sim_cluster.head_id[:8]} (head, " in msg and f"{worker[:8]} (" in msg and "CPU 2 (" in msg
    assert "workers.env_worker_cpus / workers.env_resources" in msg and "workers.placement_timeout_s" in msg
    with join_ray(sim_cluster.address):  # every actor of the failed start was released
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and any(a["State"] != "DEAD" for a in _actors("EnvWorker")):
            time.sleep(0.5)
        assert _actors("EnvWorker") and all(a["State"] == "DEAD" for a in (*_actors("EnvWorker"),
                                                                         *_actors("WriterHost")))
