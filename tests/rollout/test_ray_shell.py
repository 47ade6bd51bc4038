"""The Ray shell's pieces that need no running cluster: temp dirs short enough for Ray's sockets, runtime_env
loading for job submission, and `ray_session` choosing to join rather than start a cluster inside a job."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import yaml

pytest.importorskip("ray")

from bapsql.errors import ConfigError  # noqa: E402
from bapsql.rollout import ray_shell  # noqa: E402
from tests.rollout.ray_fixtures import local_ray_fixture  # noqa: E402,F401  (fixture)

SOCKET_SUFFIX = "/session_2026-11-30_08-16-19_406177_86720/sockets/plasma_store"


def test_temp_dirs_leave_room_for_rays_socket_paths(tmp_path):
    short = ray_shell.short_temp_dir(Path("/tmp"))
    assert Path(short).is_dir() and len(short + SOCKET_SUFFIX) <= 107
    deep = tmp_path / ("x" * 60) / "run" / "tmp"
    chosen = ray_shell.short_temp_dir(deep)
    assert not chosen.startswith(str(deep)) and len(chosen + SOCKET_SUFFIX) <= 107  # fell back to the system tmp
    assert not deep.exists()
    for d in (short, chosen):
        shutil.rmtree(d)


def test_runtime_env_resolves_the_working_dir_against_the_repo(tmp_path):
    f = tmp_path / "env.yaml"
    f.write_text(yaml.safe_dump({"working_dir": ".", "excludes": [".git"], "env_vars": {"A": "1"}}))
    env = ray_shell.load_runtime_env(f, tmp_path / "repo")
    assert env == {"working_dir": str((tmp_path / "repo").resolve()), "excludes": [".git"], "env_vars": {"A": "1"}}
    assert ray_shell.load_runtime_env(None, "/abs/repo") == {"working_dir": "/abs/repo"}
    shipped = ray_shell.load_runtime_env(Path(__file__).resolve().parents[2] / "cluster" / "runtime_env.yaml", "/r")
    assert shipped["working_dir"] == "/r" and ".git" in shipped["excludes"] and "runs" in shipped["excludes"]
    f.write_text("- not\n- a mapping\n")
    with pytest.raises(ConfigError):
        ray_shell.load_runtime_env(f, tmp_path)


def test_a_job_driver_joins_its_cluster_instead_of_starting_one(monkeypatch):
    seen = {}
    monkeypatch.setattr(ray_shell.session, "join_ray", lambda address: seen.setdefault("join", address))
    monkeypatch.setattr(ray_shell.session, "local_ray", lambda **kw: seen.setdefault("local", kw))
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6390")
    ray_shell.ray_session(None, num_cpus=2)
    assert seen == {"join": "127.0.0.1:6390"}
    monkeypatch.delenv("RAY_ADDRESS")
    ray_shell.ray_session(None, num_cpus=2, temp_dir="/tmp/x")
    assert seen["local"] == {"num_cpus": 2, "temp_dir": "/tmp/x", "include_dashboard": False}


def test_a_head_that_does_not_come_up_is_started_once_more_in_a_fresh_temp_dir(monkeypatch, tmp_path):
    """Ray's GCS process once died before writing its port (a crash inside Ray): local_ray retries that once, in a
    new temp dir; any other start error, or a second failure, reaches the caller."""
    from types import SimpleNamespace

    calls, shut = [], []
    fail = {"times": 1, "message": "Timed out waiting for file /tmp/x/gcs_server_port_abc"}

    def fake_init(**kw):
        calls.append(kw["_temp_dir"])
        if len(calls) <= fail["times"]:
            raise RuntimeError(fail["message"])
        return SimpleNamespace(address_info={"address": "127.0.0.1:1"})

    monkeypatch.setattr(ray_shell.session.ray, "init", fake_init)
    monkeypatch.setattr(ray_shell.session.ray, "shutdown", lambda: shut.append(1))
    first = ray_shell.short_temp_dir(tmp_path / "r")
    with ray_shell.local_ray(num_cpus=1, temp_dir=first) as info:
        assert len(calls) == 2 and calls[0] == first and calls[1] != first and info["temp_dir"] == calls[1]
    assert len(shut) == 2  # after the failed start, and on exit
    calls.clear()
    fail["times"] = 2
    with pytest.raises(RuntimeError, match="Timed out"):
        with ray_shell.local_ray(num_cpus=1, temp_dir=ray_shell.short_temp_dir(tmp_path / "r")):
            pass
    calls.clear()
    fail.update(times=1, message="some other start error")
    with pytest.raises(RuntimeError, match="some other"):
        with ray_shell.local_ray(num_cpus=1):
            pass
    assert len(calls) == 1


def test_the_storage_check_names_what_a_node_cannot_see_or_write(tmp_path):
    from bapsql.rollout.ray_shell.nodes import check_storage

    bench = tmp_path / "bench"
    bench.mkdir()
    (bench / "benchmark.json").write_text("{}")
    host, problems = check_storage(str(bench), str(tmp_path / "run"))
    assert host and problems == () and list((tmp_path / "run").iterdir()) == []  # the probe file is removed
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        _, problems = check_storage(str(tmp_path / "elsewhere"), str(ro / "run"))
    finally:
        ro.chmod(0o700)
    assert any("cannot see the benchmark folder" in p for p in problems)
    if os.geteuid() != 0:  # root writes anywhere
        assert any("cannot write the run folder" in p for p in problems)


@pytest.mark.slow
def test_the_preflight_fails_with_a_clear_message_when_a_node_lacks_the_shared_folders(local_ray, tmp_path):
    from bapsql.errors import StorageError
    from bapsql.rollout.ray_shell.nodes import preflight

    bench = tmp_path / "bench"
    bench.mkdir()
    (bench / "tasks.json").write_text("[]")
    checks = preflight(bench, tmp_path / "run")
    assert len(checks) == 1 and checks[0].problems == ()
    with pytest.raises(StorageError, match=r"1 of 1 nodes: node .*cannot see the benchmark folder .*Shared storage"):
        preflight(tmp_path / "not-mounted", tmp_path / "run")


def test_actor_options_reserve_custom_resources_and_spread_env_workers():
    from bapsql.rollout.backend import ActorSpec
    from bapsql.rollout.ray_shell.nodes import actor_options
    from bapsql.rollout.workers import EnvWorker

    spec = ActorSpec(("env", 0), EnvWorker, num_cpus=0.5, resources={"env_node": 1.0}, placement="spread")
    opts = actor_options(spec, max_restarts=3)
    assert opts["resources"] == {"env_node": 1.0} and opts["scheduling_strategy"] == "SPREAD"
    assert (opts["num_cpus"], opts["num_gpus"], opts["max_restarts"], opts["max_task_retries"]) == (0.5, 0.0, 3, 0)
    plain = actor_options(ActorSpec(("writer", 0), EnvWorker), max_restarts=1)
    assert "resources" not in plain and "scheduling_strategy" not in plain and "label_selector" not in plain
    assert "label_selector" not in opts
    off_head = actor_options(spec, max_restarts=3, avoid_node="ab12")  # env workers kept off the head node
    assert off_head["label_selector"] == {"ray.io/node-id": "!ab12"} and off_head["scheduling_strategy"] == "SPREAD"
    assert "label_selector" not in actor_options(ActorSpec(("engine", "m", 0), EnvWorker), max_restarts=1,
                                                 avoid_node="ab12")  # only spread (env) actors avoid it
