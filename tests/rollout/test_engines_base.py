"""The engine protocol's value types, strict config loading and the factory (no model needed)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bapsql.errors import ConfigError, EngineError
from bapsql.rollout.engines.base import (
    AdapterRef,
    EngineConfig,
    Generation,
    SamplingParams,
    adapter_digest,
    check_batch,
    cut_at_stop,
    load_engine_config,
)
from bapsql.tokens import DEFAULT_TOKENIZER_DIR


def test_config_loads_strictly_with_defaults():
    cfg = load_engine_config({"kind": "hf", "model": "/models/tiny", "max_model_len": 2048})
    assert (cfg.kind, cfg.model, cfg.max_model_len, cfg.dtype, cfg.enable_lora) == ("hf", "/models/tiny", 2048,
                                                                                      "auto", False)


@pytest.mark.parametrize(
    "data, key",
    [
        ({"kind": "hf", "model": "m", "max_len": 5}, "max_len"),
        ({"model": "m"}, "kind"),
        ({"kind": "tgi", "model": "m"}, "kind"),
        ({"kind": "hf", "model": "m", "max_model_len": "big"}, "max_model_len"),
        ({"kind": "hf", "model": "m", "enable_lora": 1}, "enable_lora"),
        ({"kind": "hf", "model": "m", "max_num_seqs": 0}, "max_num_seqs"),
        ({"kind": "vllm", "model": "m", "gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
        ({"kind": "openai", "model": "served"}, "base_url"),
        ({"kind": "hf", "model": "m", "base_url": "http://x"}, "base_url"),
        ({"kind": "hf", "model": ""}, "model"),
    ],
)
def test_config_rejects_bad_input_naming_the_key(data, key):
    with pytest.raises(ConfigError, match=key):
        load_engine_config(data)


def test_config_from_yaml_file_with_engine_section(tmp_path):
    path = tmp_path / "engine.yaml"
    path.write_text("engine:\n  kind: openai\n  model: served-tiny\n  base_url: http://127.0.0.1:8000/v1\n"
                    "  tokenizer: /models/tiny\n")
    cfg = load_engine_config(path)
    assert cfg.kind == "openai" and cfg.base_url.endswith("/v1") and str(cfg.tokenizer_dir) == "/models/tiny"
    with pytest.raises(ConfigError, match="not found"):
        load_engine_config(tmp_path / "missing.yaml")


def test_tokenizer_dir_defaults_to_the_model_folder(tmp_path):
    assert EngineConfig(kind="hf", model=str(tmp_path)).tokenizer_dir == tmp_path
    assert EngineConfig(kind="openai", model="served", base_url="http://h/v1").tokenizer_dir is None


@pytest.mark.parametrize("kwargs", [dict(max_tokens=0), dict(max_tokens=4, temperature=-0.1),
                                    dict(max_tokens=4, top_p=0.0), dict(max_tokens=4, top_p=1.5),
                                    dict(max_tokens=4, stop=("",)), dict(max_tokens=True)])
def test_sampling_params_validate(kwargs):
    with pytest.raises(ConfigError):
        SamplingParams(**kwargs)


def test_sampling_params_normalise_stop_and_greedy():
    sp = SamplingParams(max_tokens=3, temperature=0, stop=["</tool_call>"])
    assert sp.stop == ("</tool_call>",) and sp.greedy and not SamplingParams(max_tokens=3).greedy


def test_generation_checks_logprobs_align_and_finish_reason():
    g = Generation(prompt_ids=(1, 2), completion_ids=(3, 4), text="ab", logprobs=(-0.1, -0.2), finish_reason="stop")
    assert g.completion_ids == (3, 4)
    with pytest.raises(EngineError, match="logprobs"):
        Generation(prompt_ids=(1,), completion_ids=(3, 4), text="", logprobs=(-0.1,), finish_reason="stop")
    with pytest.raises(EngineError, match="finish"):
        Generation(prompt_ids=(1,), completion_ids=(3,), text="", logprobs=None, finish_reason="abort")


def test_check_batch():
    sp = SamplingParams(max_tokens=4)
    check_batch([[1, 2, 3]], [sp], max_model_len=7)
    with pytest.raises(EngineError, match="one per prompt"):
        check_batch([[1], [2]], [sp], max_model_len=100)
    with pytest.raises(EngineError, match="empty"):
        check_batch([[]], [sp], max_model_len=100)
    with pytest.raises(EngineError, match="max_model_len"):
        check_batch([[1, 2, 3, 4]], [sp], max_model_len=7)


@given(st.text(alphabet="ab<>/c", max_size=30), st.lists(st.text(alphabet="ab<>/c", min_size=1, max_size=4),
                                                        max_size=3))
def test_cut_at_stop_is_the_longest_prefix_free_of_stop_strings(text, stops):
    cut, hit = cut_at_stop(text, stops)
    assert text.startswith(cut)
    assert not any(s in cut for s in stops)
    assert hit == any(s in text for s in stops)
    if hit:
        assert any(text[len(cut):].startswith(s) for s in stops)
    else:
        assert cut == text


def test_factory_builds_the_openai_engine_without_contacting_the_server():
    from bapsql.rollout.engines.base import Engine
    from bapsql.rollout.engines.factory import make_engine
    from bapsql.rollout.engines.openai_http import OpenAIEngine

    engine = make_engine({"kind": "openai", "model": "served", "base_url": "http://127.0.0.1:9/v1",
                          "tokenizer": str(DEFAULT_TOKENIZER_DIR)})
    try:
        assert isinstance(engine, OpenAIEngine) and isinstance(engine, Engine)
        with pytest.raises(EngineError, match="no training hooks"):
            engine.load_adapter("/tmp/adapter", "policy", 1)
        with pytest.raises(EngineError, match="cannot report which adapter"):
            engine.served_adapter(AdapterRef("policy", 1, "/tmp/adapter", 1))
    finally:
        engine.close()
    with pytest.raises(EngineError, match="after close"):
        engine.generate([[1]], [SamplingParams(max_tokens=1)])


def test_openai_engine_needs_api_key_variable_set(monkeypatch):
    from bapsql.rollout.engines.factory import make_engine

    monkeypatch.delenv("BAPSQL_TEST_KEY", raising=False)
    with pytest.raises(ConfigError, match="BAPSQL_TEST_KEY"):
        make_engine({"kind": "openai", "model": "m", "base_url": "http://127.0.0.1:9/v1",
                     "tokenizer": str(DEFAULT_TOKENIZER_DIR), "api_key_env": "BAPSQL_TEST_KEY"})


def test_the_adapter_digest_names_the_files_bytes(tmp_path):
    """Weight sync's identity: the same files give the same digest wherever they are, one changed byte another."""
    a, b = tmp_path / "a", tmp_path / "b"
    for folder in (a, b):
        folder.mkdir()
        (folder / "adapter_config.json").write_text('{"r": 8}')
        (folder / "adapter_model.safetensors").write_bytes(bytes(range(256)) * 64)
        (folder / "README.md").write_text(f"written in {folder.name}")  # not part of the adapter
    assert adapter_digest(a) == adapter_digest(b) and len(adapter_digest(a)) == 64
    data = bytearray((b / "adapter_model.safetensors").read_bytes())
    data[-1] ^= 1
    (b / "adapter_model.safetensors").write_bytes(bytes(data))
    assert adapter_digest(a) != adapter_digest(b)
    with pytest.raises(EngineError, match="not a peft adapter folder"):
        adapter_digest(tmp_path)
