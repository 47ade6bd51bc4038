"""``bapsql serve``: argument errors (fast), and the README's two commands end to end in a real process (slow):
serve a file with an openai_chat engine, ask over HTTP with curl, stop it, and `bapsql analyze` the logged traffic."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from click.testing import CliRunner

from bapsql.cli import cli
from tests.serve.conftest import COUNT_Q, N_ORDERS, free_port, make_shop
from tests.serve.chat_server import ScriptedChatServer
from tests.serve.conftest import plans

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("args, words", [
    (["--engine", "openai_chat:http://127.0.0.1:9/v1", "--model", "m"], "Missing option '--db'"),
    (["--db", "{shop}", "--engine", "openai_chat:http://127.0.0.1:9/v1"], "--model"),
    (["--db", "{shop}", "--engine", "nope.yaml", "--model", "m"], "engine YAML"),
    (["--db", "{tmp}/missing.db", "--engine", "openai_chat:http://127.0.0.1:9/v1", "--model", "m"], "no such file"),
    (["--db", "{shop}", "--db", "{shop}", "--engine", "openai_chat:http://127.0.0.1:9/v1", "--model", "m"],
     "already taken"),
    (["--db", "{shop}", "--engine", "openai_chat:http://127.0.0.1:9/v1", "--model", "m", "--host", "0.0.0.0"],
     "--api-key-env"),
    (["--db", "{shop}", "--engine", "openai_chat:http://127.0.0.1:9/v1", "--model", "m", "--api-key-env",
      "BAPSQL_SURELY_UNSET"], "not set"),
    (["--db", "{shop}", "--engine", "openai_chat:http://127.0.0.1:9/v1", "--model", "m", "--condition", "bogus"],
     "unknown condition"),
    (["--db", "{shop}", "--engine", "openai_chat:http://127.0.0.1:9/v1", "--model", "m", "--chat-template-kwargs",
      "enable_thinking=false"], "--chat-template-kwargs: not JSON"),
    (["--db", "{shop}", "--engine", "openai_chat:http://127.0.0.1:9/v1", "--model", "m", "--chat-template-kwargs",
      "[false]"], "pass a JSON object"),
    (["--db", "{shop}"], "pass --model NAME"),
    (["--db", "{shop}", "--engine", "hf"], "name the model to run with --model"),
    (["--db", "{shop}", "--model", "{tmp}/no-such-model"], "not a registry name"),
    (["--db", "{shop}", "--engine", "openai_chat:http://127.0.0.1:9/v1", "--model", "m", "--request-timeout", "0"],
     "--request-timeout"),
])
def test_serve_refuses_bad_arguments_with_what_to_pass(tmp_path, args, words):
    shop = make_shop(tmp_path / "shop.db")
    argv = [a.format(shop=shop, tmp=tmp_path) for a in args]
    result = CliRunner().invoke(cli, ["serve", *argv])
    assert result.exit_code != 0 and words in result.output, result.output


@pytest.mark.slow
def test_the_readme_commands_serve_ask_and_analyze(tmp_path):
    shop = make_shop(tmp_path / "shop.db")
    port = free_port()
    logs = tmp_path / "logs"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with ScriptedChatServer(plans()) as chat:
        proc = subprocess.Popen([sys.executable, "-m", "bapsql", "serve", "--db", str(shop), "--engine",
                                 f"openai_chat:{chat.base_url}", "--model", "scripted", "--port", str(port),
                                 "--log-dir", str(logs)], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 120
            while True:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
                        if r.status == 200:
                            break
                except OSError:
                    pass
                assert proc.poll() is None, proc.communicate()
                assert time.monotonic() < deadline, "bapsql serve did not come up"
                time.sleep(0.2)
            body = json.dumps({"db": "shop", "question": COUNT_Q, "budget": "S"})
            if shutil.which("curl"):
                out = subprocess.run(["curl", "-s", f"http://127.0.0.1:{port}/v1/ask", "-H",
                                      "Content-Type: application/json", "-d", body],
                                     capture_output=True, text=True, timeout=60, check=True).stdout
            else:
                req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/ask", data=body.encode(), method="POST",
                                             headers={"Content-Type": "application/json"})
                out = urllib.request.urlopen(req, timeout=60).read().decode()
            answer = json.loads(out)
        finally:
            proc.send_signal(signal.SIGINT)
            stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr
    assert answer["status"] == "answered" and answer["answer"] == {"kind": "scalar", "values": [N_ORDERS]}
    assert "1 episodes logged" in stderr
    result = subprocess.run([sys.executable, "-m", "bapsql", "analyze", str(logs), "--out", str(tmp_path / "report"),
                             "--replicates", "50"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    assert "model.scripted@full" in json.dumps(summary)
