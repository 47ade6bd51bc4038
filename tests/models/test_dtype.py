"""dtype ``auto`` (bapsql/models/dtype.py): the default of every engine, learner and training-model config, resolved to
the checkpoint's own dtype by each consumer alike — the HF engine, the vLLM engine and the learner."""

from __future__ import annotations

import json
import shutil
import types

import pytest

from bapsql.errors import ConfigError
from bapsql.models.dtype import checkpoint_dtype, resolve_dtype
from bapsql.rollout.engines.base import EngineConfig, load_engine_config
from bapsql.train.config import load_train_config
from bapsql.train.learner_config import LearnerConfig


def _folder(tmp_path, name, config):
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return folder


def test_auto_is_the_checkpoints_dtype_and_float32_when_it_names_none(tmp_path):
    cases = {"old": ({"torch_dtype": "bfloat16"}, "bfloat16"), "new": ({"dtype": "float16"}, "float16"),
             "prefixed": ({"torch_dtype": "torch.bfloat16"}, "bfloat16"),
             "multimodal": ({"text_config": {"dtype": "bfloat16"}}, "bfloat16"), "none": ({}, "float32")}
    for name, (config, want) in cases.items():
        folder = _folder(tmp_path, name, config)
        assert resolve_dtype("auto", folder) == want, name
        assert resolve_dtype("float32", folder) == "float32"  # a named dtype wins over the checkpoint's
    assert checkpoint_dtype(_folder(tmp_path, "bare", {"model_type": "llama"})) is None


def test_a_dtype_bapsql_cannot_load_in_asks_for_one_by_name(tmp_path):
    with pytest.raises(ConfigError, match="float8_e4m3fn.*set dtype"):
        resolve_dtype("auto", _folder(tmp_path, "fp8", {"torch_dtype": "float8_e4m3fn"}))
    with pytest.raises(ConfigError, match="cannot be read"):
        resolve_dtype("auto", tmp_path / "missing")
    with pytest.raises(ConfigError, match="'double'"):
        resolve_dtype("double", tmp_path)


def test_engine_learner_and_training_configs_default_to_auto(tmp_path):
    assert load_engine_config({"kind": "hf", "model": "m"}).dtype == "auto"
    assert LearnerConfig(model_path="m").dtype == "auto"
    recipe = tmp_path / "r.yaml"
    recipe.write_text("name: r\nmodel: {base: m}\n")
    cfg = load_train_config(recipe)
    assert cfg.model.dtype == "auto"
    assert cfg.learner_config("m", "sft", seed=0, total_steps=1).dtype == "auto"


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """The tiny model (saved float32) and a copy whose config.json says bfloat16, as a bf16 checkpoint's does."""
    pytest.importorskip("torch")
    pytest.importorskip("peft")
    from bapsql.models.tiny import TinySpec, make_tiny_model

    root = tmp_path_factory.mktemp("dtype")
    f32 = make_tiny_model(root / "f32", spec=TinySpec(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                                                       intermediate_size=64, max_position_embeddings=256)).out_dir
    bf16 = shutil.copytree(f32, root / "bf16")
    config = json.loads((bf16 / "config.json").read_text())
    config.pop("torch_dtype", None)
    config["dtype"] = "bfloat16"
    (bf16 / "config.json").write_text(json.dumps(config))
    return {"float32": f32, "bfloat16": bf16}


def test_the_hf_engine_and_the_learner_load_the_checkpoint_in_its_own_dtype(checkpoints):
    import torch

    from bapsql.rollout.engines.hf import HFEngine
    from bapsql.train.learner import Learner

    assert checkpoint_dtype(checkpoints["float32"]) == "float32"
    for name, folder in checkpoints.items():
        engine = HFEngine(EngineConfig(kind="hf", model=str(folder), device="cpu", num_threads=1, max_model_len=64))
        try:
            assert engine._base.dtype == getattr(torch, name)
        finally:
            engine.close()
        learner = Learner(LearnerConfig(model_path=str(folder), device="cpu", threads=1))
        assert _base_dtypes(learner) == {getattr(torch, name)}  # (peft keeps the LoRA weights in float32)
    named = Learner(LearnerConfig(model_path=str(checkpoints["bfloat16"]), dtype="float32", device="cpu", threads=1))
    assert _base_dtypes(named) == {torch.float32}


def _base_dtypes(learner):
    return {p.dtype for p in learner.model.parameters() if not p.requires_grad}


def test_the_vllm_engine_is_given_the_resolved_dtype_not_its_own_auto(checkpoints, monkeypatch):
    """vLLM's own ``auto`` runs a float32 checkpoint in half precision; the engine passes what the learner loads."""
    from bapsql.rollout.engines import vllm as vllm_engine

    seen = []

    class LLM:
        def __init__(self, **kwargs):
            seen.append(kwargs)

    fake = types.SimpleNamespace(LLM=LLM)
    monkeypatch.setattr(vllm_engine, "_import_vllm", lambda: (fake, None, None))
    for name, folder in checkpoints.items():
        vllm_engine.VLLMEngine(EngineConfig(kind="vllm", model=str(folder), num_threads=1))
        assert seen[-1]["dtype"] == name
