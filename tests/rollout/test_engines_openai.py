"""The OpenAI-compatible HTTP engine against a local server (127.0.0.1, bounded) that serves the HF engine."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from bapsql.errors import EngineError  # noqa: E402
from bapsql.rollout.engines.base import AdapterRef, EngineConfig, SamplingParams  # noqa: E402
from bapsql.rollout.engines.codec import ModelCodec  # noqa: E402
from bapsql.rollout.engines.factory import make_engine  # noqa: E402
from bapsql.models.tiny import make_tiny_model  # noqa: E402
from tests.rollout.engine_helpers import EngineServer, prompt_ids  # noqa: E402

GREEDY = SamplingParams(max_tokens=8, temperature=0.0)
SERVED = "tiny"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0).out_dir


@pytest.fixture(scope="module")
def hf(model_dir):
    eng = make_engine(EngineConfig(kind="hf", model=str(model_dir), max_model_len=512, num_threads=1))
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def codec(model_dir):
    return ModelCodec.from_dir(model_dir)


def _client(model_dir, url, **kw):
    return make_engine(EngineConfig(kind="openai", model=SERVED, base_url=url, tokenizer=str(model_dir),
                                    max_num_seqs=4, timeout_s=30, **kw))


def test_token_prompts_give_the_served_engines_tokens_and_logprobs(model_dir, hf, codec):
    prompts = prompt_ids(model_dir)
    params = [GREEDY, SamplingParams(max_tokens=8, seed=3), GREEDY, SamplingParams(max_tokens=8, seed=4)]
    direct = hf.generate(prompts, params)
    with EngineServer(hf, codec, SERVED) as server:
        client = _client(model_dir, server.base_url)
        try:
            remote = client.generate(prompts, params)
            again = client.generate(prompts[1:2], params[1:2])
            # continuous batching: requests stay in flight across step() calls, each comes back as generate gives it
            stepped = dict(client.step([(f"r{i}", p, sp) for i, (p, sp) in enumerate(zip(prompts[:3], params[:3]))]))
            stepped.update(client.step([("r3", prompts[3], params[3])]))
            with pytest.raises(EngineError, match="already in flight"):
                client.step([("x", prompts[0], GREEDY), ("x", prompts[1], GREEDY)])
            while client.in_flight():
                stepped.update(client.step([]))
            assert client.step([]) == []
        finally:
            client.close()
    assert sorted(stepped) == ["r0", "r1", "r2", "r3"]
    assert [stepped[f"r{i}"].completion_ids for i in range(4)] == [g.completion_ids for g in direct]
    assert [g.completion_ids for g in remote] == [g.completion_ids for g in direct]
    assert [g.text for g in remote] == [g.text for g in direct]
    assert [g.finish_reason for g in remote] == [g.finish_reason for g in direct]
    for r, d in zip(remote, direct):
        assert max(abs(a - b) for a, b in zip(r.logprobs, d.logprobs)) < 1e-6
    assert again[0].completion_ids == direct[1].completion_ids  # the request seed travels
    assert all(isinstance(req["prompt"], list) and req["return_token_ids"] for req in server.requests)


def test_falls_back_to_text_prompts_when_the_server_takes_none(model_dir, hf, codec):
    prompts = prompt_ids(model_dir)[:2]
    with EngineServer(hf, codec, SERVED, token_prompts=False) as server:
        client = _client(model_dir, server.base_url)
        try:
            remote = client.generate(prompts, [GREEDY, GREEDY])
        finally:
            client.close()
    kinds = [type(req["prompt"]).__name__ for req in server.requests]
    assert kinds == ["list", "str", "str"]  # one refused probe, then text for good
    direct = hf.generate([codec.encode(codec.decode_raw(p)) for p in prompts], [GREEDY, GREEDY])
    assert [g.completion_ids for g in remote] == [g.completion_ids for g in direct]


def test_without_token_ids_the_text_is_tokenized(model_dir, hf, codec):
    prompts = prompt_ids(model_dir)[:1]
    with EngineServer(hf, codec, SERVED, token_ids=False) as server:
        client = _client(model_dir, server.base_url, token_prompts="always")
        try:
            [remote] = client.generate(prompts, [GREEDY])
            with pytest.raises(EngineError, match="prompt_logprobs"):
                client.logprobs_of(prompts[0], remote.completion_ids)
        finally:
            client.close()
    [direct] = hf.generate(prompts, [GREEDY])
    assert remote.text == direct.text and remote.completion_ids == tuple(codec.encode(direct.text))


def test_never_sends_token_prompts_when_told(model_dir, hf, codec):
    prompts = prompt_ids(model_dir)[:1]
    with EngineServer(hf, codec, SERVED) as server:
        client = _client(model_dir, server.base_url, token_prompts="never")
        try:
            client.generate(prompts, [GREEDY])
        finally:
            client.close()
    assert [type(r["prompt"]) for r in server.requests] == [str]


def test_logprobs_of_uses_prompt_logprobs(model_dir, hf, codec):
    prompt = prompt_ids(model_dir)[0]
    [g] = hf.generate([prompt], [GREEDY])
    with EngineServer(hf, codec, SERVED) as server:
        client = _client(model_dir, server.base_url)
        try:
            remote = client.logprobs_of(prompt, g.completion_ids)
        finally:
            client.close()
    assert max(abs(a - b) for a, b in zip(remote, g.logprobs)) < 1e-5


def test_errors_are_engine_errors(model_dir, hf, codec):
    prompt = prompt_ids(model_dir)[0]
    with EngineServer(hf, codec, SERVED, max_requests=3) as server:
        client = _client(model_dir, server.base_url)
        try:
            with pytest.raises(EngineError, match="404"):  # an adapter the server does not serve
                client.generate([prompt], [GREEDY], adapter=AdapterRef("unknown-lora", 1, "", 1))
            with pytest.raises(EngineError):
                client.generate([[1, 2, 3]] * 3, [GREEDY] * 3)  # the server stops answering after 3 requests
        finally:
            client.close()
    client = _client(model_dir, server.base_url)  # the server is gone now
    with pytest.raises(EngineError, match="cannot reach"):
        client.generate([prompt], [GREEDY])
    client.close()
