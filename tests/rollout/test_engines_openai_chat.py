"""The openai_chat engine against a scripted OpenAI-compatible chat server on loopback (real HTTP)."""

from __future__ import annotations

import dataclasses
import logging

import pytest

from bapsql.errors import ConfigError, EngineError, EngineUnavailable
from bapsql.models.chat_template import ChatTemplate
from bapsql.rollout.engines.base import EngineConfig, SamplingParams, load_engine_config
from bapsql.rollout.engines.factory import engine_config_from_spec, make_engine
from bapsql.rollout.engines.openai_chat import messages_of, tool_call_text
from bapsql.tokens import DEFAULT_TOKENIZER_DIR
from tests.serve.chat_server import ScriptedChatServer, call

PLAN = {"count the orders": [call("execute_query", sql="SELECT count(*) FROM orders"),
                             call("answer", kind="scalar", values=[3], citations=["E1"])]}
MESSAGES = [{"role": "system", "content": "You answer with tool calls."},
            {"role": "user", "content": "Please count the orders."}]
PARAMS = SamplingParams(max_tokens=64, temperature=0.0, seed=7)


@pytest.fixture(scope="module")
def template():
    return ChatTemplate.from_dir(DEFAULT_TOKENIZER_DIR)


def _prompt(template, messages):
    return template.apply(messages, add_generation_prompt=True)


def _engine(url, **kw):
    cfg = dataclasses.replace(engine_config_from_spec(f"openai_chat:{url}", model="scripted"),
                              retry_backoff_s=0.0, timeout_s=5, **kw)
    return make_engine(cfg)


def test_config_is_strict_and_names_what_to_pass(tmp_path):
    cfg = load_engine_config({"kind": "openai_chat", "model": "m", "base_url": "http://127.0.0.1:1/v1"})
    assert cfg.tokenizer_dir == DEFAULT_TOKENIZER_DIR  # no tokenizer, no model folder: the packaged one
    with pytest.raises(ConfigError, match="nonsense"):
        load_engine_config({"kind": "openai_chat", "model": "m", "base_url": "http://x/v1", "nonsense": 1})
    with pytest.raises(ConfigError, match="base_url"):
        load_engine_config({"kind": "openai_chat", "model": "m"})
    with pytest.raises(ConfigError, match="max_retries"):
        load_engine_config({"kind": "openai_chat", "model": "m", "base_url": "http://x/v1", "max_retries": -1})
    with pytest.raises(ConfigError, match="--model"):
        engine_config_from_spec("openai_chat:http://x/v1")
    with pytest.raises(ConfigError, match="engine YAML"):
        engine_config_from_spec(str(tmp_path / "missing.yaml"))
    yaml = tmp_path / "chat.yaml"
    yaml.write_text("engine:\n  kind: openai_chat\n  model: m\n  base_url: http://127.0.0.1:9/v1\n  max_num_seqs: 2\n")
    assert engine_config_from_spec(str(yaml)).max_num_seqs == 2


def test_messages_round_trip_through_the_chatml_prompt(template):
    text = template.decode(_prompt(template, MESSAGES))
    assert messages_of(text) == MESSAGES
    with pytest.raises(EngineError, match="generation prompt"):
        messages_of("plain text without a template")


def test_a_prompt_ending_in_an_empty_think_block_is_a_generation_prompt(template):
    """Qwen3 with thinking off ends its generation prompt in an empty think block; past turns keep theirs. Either
    reads back as the plain messages, whatever framing the reader measured (here the packaged ChatML one)."""
    think = "<think>\n\n</think>\n\n"
    episode = [*MESSAGES, {"role": "assistant", "content": "first"}, {"role": "user", "content": "more"}]
    text = template.decode(_prompt(template, MESSAGES)) + think
    assert messages_of(text) == MESSAGES
    past = text + "first<|im_end|>\n<|im_start|>user\nmore<|im_end|>\n<|im_start|>assistant\n" + think
    assert messages_of(past) == episode
    with pytest.raises(EngineError, match="generation prompt"):
        messages_of(text + "<think>\n")


def test_native_tool_calls_become_the_tool_call_text():
    text = tool_call_text({"content": None, "tool_calls": [
        {"type": "function", "function": {"name": "execute_query", "arguments": '{"sql": "SELECT 1"}'}}]})
    from bapsql.env.actions import ExecuteQuery, parse_action

    assert parse_action(text) == ExecuteQuery("SELECT 1")


@pytest.mark.parametrize("native", [False, True])
def test_generate_sends_messages_and_returns_the_text_and_usage(template, native, caplog):
    prompt = _prompt(template, MESSAGES)
    with ScriptedChatServer(PLAN, native=native) as server:
        eng = _engine(server.base_url)
        try:
            with caplog.at_level(logging.INFO, logger="bapsql.rollout.engines.openai_chat"):
                [gen] = eng.generate([prompt], [PARAMS])
            stepped = dict(eng.step([("a", prompt, PARAMS), ("b", prompt, PARAMS)]))
            while eng.in_flight():
                stepped.update(eng.step([]))
        finally:
            eng.close()
    sent = server.requests[0]
    assert sent["messages"] == MESSAGES and sent["model"] == "scripted" and sent["seed"] == 7
    assert sent["max_tokens"] == 64 and "prompt" not in sent
    from bapsql.env.actions import ExecuteQuery, parse_action

    assert parse_action(gen.text) == ExecuteQuery("SELECT count(*) FROM orders")
    end = template.encode("<|im_end|>")
    assert list(gen.completion_ids) == template.encode(gen.text) + end and gen.finish_reason == "stop"
    assert gen.logprobs is None and gen.usage is not None and gen.usage[1] > 0
    assert sorted(stepped) == ["a", "b"] and stepped["a"].text == gen.text
    assert eng.token_sources["usage"] == 3
    assert "token accounting from the server's usage" in caplog.text


def test_chat_template_kwargs_are_sent_when_configured(families):
    """Qwen3 prompts rendered with thinking off: the engine sends ``chat_template_kwargs`` so the server's template
    renders the same way; an engine without them sends none."""
    template = ChatTemplate.from_dir(families["qwen3"])
    prompt = template.apply(MESSAGES, add_generation_prompt=True, enable_thinking=False)
    assert template.decode(prompt).endswith("<think>\n\n</think>\n\n")
    with ScriptedChatServer(PLAN) as server:
        for kwargs in ({"enable_thinking": False}, {}):
            eng = _engine(server.base_url, tokenizer=str(families["qwen3"]), chat_template_kwargs=kwargs)
            try:
                [gen] = eng.generate([prompt], [PARAMS])
            finally:
                eng.close()
            assert gen.finish_reason == "stop"
    with_kwargs, without = server.requests
    assert with_kwargs["chat_template_kwargs"] == {"enable_thinking": False} and with_kwargs["messages"] == MESSAGES
    assert "chat_template_kwargs" not in without and without["messages"] == MESSAGES


def test_without_usage_the_tokenizer_counts_and_the_log_says_so(template, caplog):
    with ScriptedChatServer(PLAN, usage=False) as server:
        eng = _engine(server.base_url)
        try:
            with caplog.at_level(logging.INFO, logger="bapsql.rollout.engines.openai_chat"):
                [gen] = eng.generate([_prompt(template, MESSAGES)], [PARAMS])
        finally:
            eng.close()
    assert gen.usage is None and eng.token_sources == {"tokenizer": 1}
    assert "token accounting from the tokenizer" in caplog.text


def test_retries_429_and_5xx_then_succeeds(template):
    with ScriptedChatServer(PLAN) as server:
        server.fail = [429, 503, 500]
        eng = _engine(server.base_url, max_retries=3)
        try:
            [gen] = eng.generate([_prompt(template, MESSAGES)], [PARAMS])
        finally:
            eng.close()
    assert len(server.requests) == 4 and gen.text.startswith("<tool_call>")


def test_gives_up_after_the_retries_and_refuses_4xx_at_once(template):
    prompt = _prompt(template, MESSAGES)
    with ScriptedChatServer(PLAN) as server:
        eng = _engine(server.base_url, max_retries=1)
        try:
            server.fail = [503, 503]
            with pytest.raises(EngineUnavailable, match="after 1 retries"):
                eng.generate([prompt], [PARAMS])
            server.fail = [400]
            n = len(server.requests)
            with pytest.raises(EngineError, match="refused") as info:
                eng.generate([prompt], [PARAMS])
            assert not isinstance(info.value, EngineUnavailable) and len(server.requests) == n + 1
        finally:
            eng.close()
    eng = _engine(server.base_url, max_retries=0)  # the server is gone
    with pytest.raises(EngineUnavailable, match="cannot reach"):
        eng.generate([prompt], [PARAMS])
    eng.close()


def test_api_key_comes_from_the_environment(monkeypatch):
    cfg = EngineConfig(kind="openai_chat", model="m", base_url="http://127.0.0.1:9/v1", api_key_env="BAPSQL_TEST_KEY")
    monkeypatch.delenv("BAPSQL_TEST_KEY", raising=False)
    with pytest.raises(ConfigError, match="BAPSQL_TEST_KEY"):
        make_engine(cfg)
    monkeypatch.setenv("BAPSQL_TEST_KEY", "sekrit")
    eng = make_engine(cfg)
    assert eng._headers["Authorization"] == "Bearer sekrit"
    eng.close()
    with pytest.raises(EngineError, match="cannot load adapters"):
        eng.load_adapter("x", "y", 1)


def test_eval_posthoc_engine_path_takes_a_chat_engine_yaml(tmp_path):
    """What `bapsql eval --posthoc-engine chat.yaml` builds (`EngineController.from_config`, as
    bapsql.rollout.runner.evaluate calls it): the engine from the YAML, the chat template of its tokenizer folder and
    its chat-template options — a Qwen3 prompt with thinking off, read back and sent with the same options."""
    from bapsql.env.posthoc import ResultShape
    from bapsql.rollout.posthoc_engine import SYSTEM, EngineController
    from tests.models.chat_families import make_family_dir

    qwen3 = make_family_dir(tmp_path, "qwen3")
    shape = ResultShape(600, ("id", "name"), 6, 6, 4200, 35, 70, "result_tokens")
    with ScriptedChatServer({"Which control?": ["profile"]}) as server:
        yaml = tmp_path / "chat.yaml"
        yaml.write_text(f"engine: {{kind: openai_chat, model: scripted, base_url: '{server.base_url}', "
                        f"tokenizer: '{qwen3}', chat_template_kwargs: {{enable_thinking: false}}}}\n")
        ctl = EngineController.from_config(load_engine_config(yaml))
        try:
            choice = ctl.choose(shape)
        finally:
            ctl.engine.close()
    assert choice.control == "profile" and choice.prompt_tokens > 20
    request = server.requests[0]
    assert request["messages"][0] == {"role": "system", "content": SYSTEM}
    assert [m["role"] for m in request["messages"]] == ["system", "user"]
    assert request["chat_template_kwargs"] == {"enable_thinking": False}
    assert ctl.template_kwargs == {"enable_thinking": False}


# -- any chat template: SmolLM2's ChatML, Qwen3 and Qwen3.5 with thinking off, Llama 3 (tests/models/chat_families.py)
EPISODE = [{"role": "system", "content": "You answer with tool calls."},
           {"role": "user", "content": "Please count the orders."},
           {"role": "assistant", "content": call("execute_query", sql="SELECT count(*) FROM orders")},
           {"role": "tool", "content": "E1 (ok): 1 row\ncount(*)\n120"},
           {"role": "assistant", "content": call("answer", kind="scalar", values=[120], citations=["E1"])},
           {"role": "tool", "content": "The answer was not accepted: cite E1."}]


@pytest.fixture(scope="module")
def families(tmp_path_factory):
    from tests.models.chat_families import FAMILIES, make_family_dir

    root = tmp_path_factory.mktemp("families")
    return {f: make_family_dir(root, f) for f in FAMILIES}


@pytest.mark.parametrize("family", ["smollm2", "qwen3", "qwen3_5", "llama3"])
def test_messages_round_trip_through_any_template_fresh_and_streamed(families, family):
    """A fresh rendering and the agent's token stream (completions appended as sampled, observations as the template's
    continuation: Qwen3's empty think blocks stay in past turns) both read back into the env's messages."""
    from bapsql.policies.chat import TokenTrajectory
    from bapsql.rollout.engines.openai_chat import template_framings
    from tests.models.chat_families import FAMILIES

    template, kwargs = ChatTemplate.from_dir(families[family]), FAMILIES[family]["kwargs"]
    framings = template_framings(families[family])
    for k in (2, 4, 6):
        fresh = template.decode(template.apply(EPISODE[:k], add_generation_prompt=True, **kwargs))
        assert messages_of(fresh, framings) == EPISODE[:k]
    eot = template.framing(**kwargs).end_of_turn_text
    stream = TokenTrajectory(template, EPISODE[:2], **kwargs)
    for i in (2, 4):
        stream.add_completion(template.encode(EPISODE[i]["content"] + eot))
        stream.add_observation([EPISODE[i + 1]])
    text = template.decode(stream.prompt_ids)
    if family.startswith("qwen3"):
        assert text.count("<think>\n\n</think>\n\n") == 3  # two past turns and the generation prompt
    assert messages_of(text, framings) == EPISODE
    with pytest.raises(EngineError, match="generation prompt"):
        messages_of(text[:-3], framings)


def test_a_llama3_tokenizer_sends_its_messages_and_ends_completions_with_eot(families):
    """The engine reads Llama 3 prompts, sends tool observations as user messages, and closes a stopped completion
    with the template's <|eot_id|> (not ChatML's <|im_end|>)."""
    template = ChatTemplate.from_dir(families["llama3"])
    prompt = template.apply(EPISODE[:4], add_generation_prompt=True)
    with ScriptedChatServer({"count the orders": PLAN["count the orders"]}) as server:
        eng = _engine(server.base_url, tokenizer=str(families["llama3"]))
        try:
            [gen] = eng.generate([prompt], [PARAMS])
        finally:
            eng.close()
    sent = server.requests[0]["messages"]
    assert sent[:3] == EPISODE[:3] and sent[3] == {"role": "user", "content": EPISODE[3]["content"]}
    eot = template.tokenizer.token_to_id("<|eot_id|>")
    assert gen.completion_ids[-1] == eot and list(gen.completion_ids) == template.encode(gen.text) + [eot]
