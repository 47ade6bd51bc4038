"""`bapsql.rollout.engines.lora_merge`: a peft adapter folded into base weights equals peft's own merge."""

from __future__ import annotations

import json

import pytest

from bapsql.errors import ConfigError, EngineError
from bapsql.rollout.engines.base import EngineConfig
from bapsql.rollout.engines.lora_merge import lora_pairs, merge_adapter, read_checkpoint

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _base(tmp_path):
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg)
    model.save_pretrained(tmp_path / "base")
    return model


def _adapter(model, out, **kw):
    torch.manual_seed(1)
    cfg = peft.LoraConfig(target_modules=TARGETS, lora_dropout=0.0, init_lora_weights=False, **kw)
    wrapped = peft.get_peft_model(model, cfg)
    wrapped.save_pretrained(out)
    return {k: v.detach().clone() for k, v in wrapped.merge_and_unload().state_dict().items()}


@pytest.mark.parametrize("kw", [dict(r=4, lora_alpha=8), dict(r=4, lora_alpha=8, use_rslora=True),
                                dict(r=4, lora_alpha=8, rank_pattern={"down_proj": 2},
                                     alpha_pattern={"q_proj": 3})])
def test_merge_equals_peft_merge_and_unload(tmp_path, kw):
    model = _base(tmp_path)
    expected = _adapter(model, tmp_path / "adapter", **kw)
    base = read_checkpoint(tmp_path / "base")
    before = {k: v.clone() for k, v in base.items()}
    merged = merge_adapter(base, tmp_path / "adapter")
    assert set(merged) == set(base)
    changed = [k for k in merged if not torch.equal(merged[k], base[k])]
    assert len(changed) == 2 * len(TARGETS)  # every adapted projection of both layers, nothing else
    for name, tensor in merged.items():
        torch.testing.assert_close(tensor, expected[name], rtol=1e-5, atol=1e-6)
    assert all(torch.equal(before[k], base[k]) for k in base)  # the base copy stays untouched for the next merge
    if "rank_pattern" in kw:
        assert lora_pairs(tmp_path / "adapter")["model.layers.0.mlp.down_proj"][0].shape[0] == 2


def test_adapters_a_merge_cannot_reproduce_are_refused_naming_the_setting(tmp_path):
    model = _base(tmp_path)
    _adapter(model, tmp_path / "adapter", r=4, lora_alpha=8)
    cfg_path = tmp_path / "adapter" / "adapter_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg_path.write_text(json.dumps({**cfg, "use_dora": True}))
    with pytest.raises(EngineError, match="use_dora.*adapter_mode: lora"):
        merge_adapter(read_checkpoint(tmp_path / "base"), tmp_path / "adapter")
    cfg_path.write_text(json.dumps(cfg))
    base = read_checkpoint(tmp_path / "base")
    del base["model.layers.1.self_attn.q_proj.weight"]
    with pytest.raises(EngineError, match="another model"):
        merge_adapter(base, tmp_path / "adapter")
    with pytest.raises(EngineError, match="no adapter_config.json"):
        merge_adapter(base, tmp_path / "base")
    with pytest.raises(EngineError, match="no \\*.safetensors"):
        read_checkpoint(tmp_path / "adapter" / "missing")


def test_engine_config_checks_the_merge_settings():
    with pytest.raises(ConfigError, match="enable_lora: false"):
        EngineConfig(kind="vllm", model="m", adapter_mode="merge", enable_lora=True)
    with pytest.raises(ConfigError, match="adapter_mode"):
        EngineConfig(kind="vllm", model="m", adapter_mode="fold")
    with pytest.raises(ConfigError, match="engine_process"):
        EngineConfig(kind="vllm", model="m", engine_process="thread")
    assert EngineConfig(kind="vllm", model="m", adapter_mode="merge").engine_process == "auto"
