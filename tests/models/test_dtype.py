"""dtype ``auto`` (bapsql/models/dtype.py): the default of every engine, learner and training-model config, resolved by
each consumer alike — the HF engine, the vLLM engine and the learner — for the device it runs on: 16-bit on a GPU
(whatever the checkpoint was saved in), float32 on the CPU."""

from __future__ import annotations

import json
import shutil
import types

import pytest

from bapsql.errors import ConfigError
from bapsql.models import dtype as dtype_module
from bapsql.models.dtype import checkpoint_dtype, device_kind, resolve_dtype
from bapsql.rollout.engines.base import EngineConfig, load_engine_config
from bapsql.train.config import load_train_config
from bapsql.train.learner.config import LearnerConfig


def _folder(tmp_path, name, config):
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return folder


CHECKPOINTS = {"old": {"torch_dtype": "bfloat16"}, "new": {"dtype": "float16"},
               "prefixed": {"torch_dtype": "torch.bfloat16"}, "multimodal": {"text_config": {"dtype": "bfloat16"}},
               "f32": {"torch_dtype": "float32"}, "none": {}}


def test_the_checkpoint_dtype_is_read_from_any_of_its_keys(tmp_path):
    want = {"old": "bfloat16", "new": "float16", "prefixed": "bfloat16", "multimodal": "bfloat16", "f32": "float32",
            "none": None}
    for name, config in CHECKPOINTS.items():
        assert checkpoint_dtype(_folder(tmp_path, name, config)) == want[name], name
    assert checkpoint_dtype(_folder(tmp_path, "bare", {"model_type": "llama"})) is None


def test_auto_is_16_bit_on_a_gpu_whatever_the_checkpoint_was_saved_in(tmp_path, monkeypatch):
    """A float32 folder (a GGUF import, a random-weight model) or one that names no dtype runs in bf16 on a GPU: a YAML
    without dtype never runs a 4B model in float32 there. A checkpoint's own 16-bit dtype is kept."""
    monkeypatch.setattr(dtype_module, "bf16_supported", lambda: True)
    want = {"old": "bfloat16", "new": "float16", "prefixed": "bfloat16", "multimodal": "bfloat16", "f32": "bfloat16",
            "none": "bfloat16"}
    for name, config in CHECKPOINTS.items():
        folder = _folder(tmp_path, name, config)
        for device in ("cuda", "cuda:1"):
            assert resolve_dtype("auto", folder, device) == want[name], (name, device)
        assert resolve_dtype("float32", folder, "cuda") == "float32"  # a named dtype wins
    monkeypatch.setattr(dtype_module, "bf16_supported", lambda: False)  # e.g. a V100: half precision is float16
    assert resolve_dtype("auto", tmp_path / "old", "cuda") == "float16"
    assert resolve_dtype("auto", tmp_path / "f32", "cuda") == "float16"


def test_auto_is_float32_on_the_cpu(tmp_path):
    for name, config in CHECKPOINTS.items():
        folder = _folder(tmp_path, name, config)
        assert resolve_dtype("auto", folder, "cpu") == "float32", name
        assert resolve_dtype("bfloat16", folder, "cpu") == "bfloat16"
    torch = pytest.importorskip("torch")
    assert resolve_dtype("auto", tmp_path / "old", torch.device("cpu")) == "float32"
    assert device_kind("auto") == ("cuda" if torch.cuda.is_available() else "cpu")


def test_a_dtype_bapsql_cannot_load_in_asks_for_one_by_name(tmp_path, monkeypatch):
    monkeypatch.setattr(dtype_module, "bf16_supported", lambda: True)
    with pytest.raises(ConfigError, match="float8_e4m3fn.*set dtype"):
        resolve_dtype("auto", _folder(tmp_path, "fp8", {"torch_dtype": "float8_e4m3fn"}), "cuda")
    with pytest.raises(ConfigError, match="cannot be read"):
        resolve_dtype("auto", tmp_path / "missing", "cuda")
    with pytest.raises(ConfigError, match="'double'"):
        resolve_dtype("double", tmp_path, "cpu")
    with pytest.raises(ConfigError, match="not auto, cpu or cuda"):
        resolve_dtype("auto", tmp_path, "tpu")


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


def test_the_hf_engine_and_the_learner_resolve_auto_alike_on_the_cpu(checkpoints):
    """float32 on the CPU for a float32 and a bf16 checkpoint alike, in the engine and the learner; a named dtype is
    loaded as named."""
    import torch

    from bapsql.rollout.engines.hf import HFEngine
    from bapsql.train.learner.core import Learner

    assert checkpoint_dtype(checkpoints["float32"]) == "float32"
    for name, folder in checkpoints.items():
        engine = HFEngine(EngineConfig(kind="hf", model=str(folder), device="cpu", num_threads=1, max_model_len=64))
        try:
            assert engine._base.dtype == torch.float32
        finally:
            engine.close()
        learner = Learner(LearnerConfig(model_path=str(folder), device="cpu", threads=1))
        assert _base_dtypes(learner) == {torch.float32}  # (peft keeps the LoRA weights in float32 anyway)
    named = Learner(LearnerConfig(model_path=str(checkpoints["float32"]), dtype="bfloat16", device="cpu", threads=1))
    assert _base_dtypes(named) == {torch.bfloat16}


def _base_dtypes(learner):
    return {p.dtype for p in learner.model.parameters() if not p.requires_grad}


def test_the_vllm_engine_is_given_the_resolved_dtype_not_its_own_auto(checkpoints, monkeypatch):
    """vLLM's own ``auto`` runs a float32 checkpoint in half precision; the engine passes what the learner loads on the
    same device: float32 on the CPU, bf16 on a GPU."""
    from bapsql.rollout.engines import vllm as vllm_engine

    seen = []

    class LLM:
        def __init__(self, **kwargs):
            seen.append(kwargs)

    fake = types.SimpleNamespace(LLM=LLM)
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine sets it; restored after the test
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    monkeypatch.setattr(vllm_engine, "_import_vllm", lambda: (fake, None, None))
    for name, folder in checkpoints.items():
        vllm_engine.VLLMEngine(EngineConfig(kind="vllm", model=str(folder), num_threads=1, device="cpu"))
        assert seen[-1]["dtype"] == "float32"
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(dtype_module, "bf16_supported", lambda: True)
    for name, folder in checkpoints.items():
        vllm_engine.VLLMEngine(EngineConfig(kind="vllm", model=str(folder), num_threads=1))
        assert seen[-1]["dtype"] == "bfloat16"
