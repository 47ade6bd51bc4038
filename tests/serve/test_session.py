"""The serving session (bapsql/serve/session.py) with a Qwen3-style model folder and ``enable_thinking: false``: the
agent renders every prompt with the engine's chat-template options, the env charges the context as rendered, and
the chat engine sends the same options to its server."""

from __future__ import annotations

from bapsql.rollout.engines.openai_chat import EMPTY_THINK
from tests.models.chat_families import make_family_dir
from tests.serve.conftest import COUNT_Q, N_ORDERS, build_service

NO_THINKING = {"enable_thinking": False}


class _Recording:
    """The engine, keeping every prompt it is asked to complete."""

    def __init__(self, inner):
        self.inner, self.prompts = inner, []

    def generate(self, prompts, params, **kw):
        self.prompts.extend(prompts)
        return self.inner.generate(prompts, params, **kw)


def test_serve_renders_and_sends_the_engines_chat_template_kwargs(shop, chat_server, tmp_path):
    qwen3 = make_family_dir(tmp_path / "models", "qwen3")
    asker, engine, _app = build_service([shop], chat_server.base_url, tmp_path / "logs", tokenizer=str(qwen3),
                                        chat_template_kwargs=NO_THINKING)
    recording = asker.engine = _Recording(engine)
    try:
        out = asker.ask("shop", COUNT_Q, "S")
    finally:
        asker.close()
        engine.close()
    assert out["status"] == "answered" and out["answer"]["values"] == [N_ORDERS]
    assert asker.agent_config.template_kwargs == NO_THINKING
    assert asker.token_counter.framing.charges_like(asker.template.framing(**NO_THINKING))
    texts = [asker.template.decode(p) for p in recording.prompts]
    assert len(texts) == 3 and all(t.endswith("<|im_start|>assistant\n" + EMPTY_THINK) for t in texts)
    assert all(r["chat_template_kwargs"] == NO_THINKING for r in chat_server.requests)
    assert all(EMPTY_THINK not in m["content"] for r in chat_server.requests for m in r["messages"])
