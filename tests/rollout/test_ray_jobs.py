"""A real `ray job submit` (slow tier): the test starts its own head node (`ray start --head --block`, own temp dir,
free ports, loopback only), submits a small sweep with `python -m jobs.submit` (Ray's JobSubmissionClient), follows
it to SUCCEEDED, checks the Parquet logs, and stops only the processes it started — never `ray stop`."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest
import yaml

from bapsql.logs.reader import read_episodes
from tests.rollout.ray_fixtures import REPO
from tests.rollout.rollout_bench import build_rollout_bench

pytestmark = pytest.mark.slow


def _free_ports(n: int) -> list[int]:
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


@pytest.fixture
def head(tmp_path):
    pytest.importorskip("ray")
    from bapsql.rollout.ray_shell import short_temp_dir

    gcs, dash, client, agent, agent_grpc, rt_agent, metrics, nm, om = _free_ports(9)
    temp = short_temp_dir(tmp_path)
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    cmd = ["ray", "start", "--head", "--block", "--node-ip-address", "127.0.0.1", "--port", str(gcs),
           "--dashboard-host", "127.0.0.1", "--dashboard-port", str(dash), "--include-dashboard=true",
           "--ray-client-server-port", str(client), "--dashboard-agent-listen-port", str(agent),
           "--dashboard-agent-grpc-port", str(agent_grpc), "--runtime-env-agent-port", str(rt_agent),
           "--metrics-export-port", str(metrics), "--node-manager-port", str(nm), "--object-manager-port", str(om),
           "--temp-dir", temp, "--num-cpus", "2", "--disable-usage-stats"]
    log = open(tmp_path / "head.log", "w")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    address = f"http://127.0.0.1:{dash}"
    try:
        from ray.job_submission import JobSubmissionClient

        deadline = time.monotonic() + 180
        while True:
            try:
                JobSubmissionClient(address).list_jobs()
                break
            except Exception:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the test's Ray head did not come up: {(tmp_path / 'head.log').read_text()}")
                time.sleep(2)
        yield address
    finally:
        # stop exactly what this test started: the `ray start --block` process and its session's children
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # any straggler of this session (none normally)
        except ProcessLookupError:
            pass
        log.close()


def test_a_small_sweep_submitted_as_a_ray_job_succeeds_and_logs_every_episode(head, tmp_path):
    bench = build_rollout_bench(tmp_path / "bench")
    exp = tmp_path / "exp.yaml"
    exp.write_text(yaml.safe_dump({
        "run": "job", "benchmark": str(bench), "split": "dev", "methods": ["workflow:estimate_rewrite", "scripted.drafter@raw"],
        "budgets": ["XS", "S"], "seeds": [0],
        "workers": {"env_workers": 2, "env_worker_cpus": 0.5, "in_flight": 16}}))
    runtime_env = tmp_path / "runtime_env.yaml"
    runtime_env.write_text(yaml.safe_dump({"working_dir": str(REPO), "excludes": [".git", "runs", ".venv",
                                                                               "**/__pycache__"]}))
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "jobs.submit", "--address", head, "--runtime-env", str(runtime_env), "--follow",
         "--timeout", "400", "--", "python", "-m", "jobs.sweep", str(exp), "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=600,
        env={**os.environ, "RAY_AUTH_MODE": "disabled"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "submitted job " in proc.stdout and "SUCCEEDED" in proc.stdout
    eps = read_episodes(out)
    assert len(eps) == 2 * 2 * 1 * 12 and eps["episode_id"].is_unique
    assert (out / "sweep.json").is_file()
