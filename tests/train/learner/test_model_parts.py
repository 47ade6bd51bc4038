"""LoRA's default targets (bapsql/train/learner/model_parts.py): the decoder's attention and MLP projections the
architecture names, fused forms included; a vision tower, a projector, linear-attention blocks, routers and the head
are left to ``lora.target_modules``."""

from __future__ import annotations

import pytest

from bapsql.errors import ConfigError

torch = pytest.importorskip("torch")
nn = torch.nn


class _Layer(nn.Module):
    def __init__(self, fused: bool, linear_attention: bool = False):
        super().__init__()
        if linear_attention:
            self.linear_attn = nn.ModuleDict({"in_proj_qkvz": nn.Linear(8, 32), "out_proj": nn.Linear(8, 8)})
        else:
            self.self_attn = nn.ModuleDict({"qkv_proj": nn.Linear(8, 24), "o_proj": nn.Linear(8, 8)} if fused else
                                           {n: nn.Linear(8, 8) for n in ("q_proj", "k_proj", "v_proj", "o_proj")})
        self.mlp = nn.ModuleDict({"gate_up_proj": nn.Linear(8, 32), "down_proj": nn.Linear(16, 8)} if fused else
                                 {"gate_proj": nn.Linear(8, 16), "up_proj": nn.Linear(8, 16),
                                  "down_proj": nn.Linear(16, 8)})
        self.router = nn.ModuleDict({"gate": nn.Linear(8, 4)})


class _Multimodal(nn.Module):
    """A hybrid multimodal checkpoint's shape: a vision tower whose MLP shares the decoder's projection names, a
    projector, a decoder with a fused layer, a plain one and a linear-attention one, and an output head."""

    def __init__(self):
        super().__init__()
        self.vision_tower = nn.ModuleDict({"fc1": nn.Linear(8, 8), "mlp": nn.ModuleDict({
            "up_proj": nn.Linear(8, 16), "down_proj": nn.Linear(16, 8)})})
        self.multi_modal_projector = nn.ModuleDict({"linear_1": nn.Linear(8, 8)})
        self.language_model = nn.ModuleDict({"layers": nn.ModuleList(
            [_Layer(fused=True), _Layer(fused=False), _Layer(fused=False, linear_attention=True)])})
        self.lm_head = nn.Linear(8, 100)

    def get_decoder(self):
        return self.language_model

    def get_output_embeddings(self):
        return self.lm_head


def test_the_tiny_model_gets_its_seven_projections(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from bapsql.train.learner.model_parts import discover_lora_targets

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert discover_lora_targets(model) == ("down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj",
                                            "v_proj")


def test_only_the_decoders_attention_and_mlp_projections_are_taken_by_default():
    from bapsql.train.learner.model_parts import discover_lora_targets

    model = _Multimodal()
    targets = discover_lora_targets(model)
    decoder_mlp = [f"language_model.layers.{i}.mlp" for i in range(3)]
    # down_proj / up_proj also name the vision tower's MLP: the decoder's are named by path, the tower's never
    assert targets == tuple([f"{p}.down_proj" for p in decoder_mlp] + ["gate_proj", "gate_up_proj", "k_proj",
                                                                        "o_proj", "q_proj", "qkv_proj"]
                            + [f"{p}.up_proj" for p in decoder_mlp[1:]] + ["v_proj"])
    peft = pytest.importorskip("peft")
    adapted = peft.inject_adapter_in_model(peft.LoraConfig(r=2, target_modules=list(targets)), model)
    wrapped = {n for n, m in adapted.named_modules() if hasattr(m, "lora_A")}
    assert wrapped and all(n.startswith("language_model.") and ".router" not in n and "linear_attn" not in n
                           for n in wrapped)
    assert {n.rsplit(".", 1)[-1] for n in wrapped} == {"qkv_proj", "o_proj", "gate_up_proj", "down_proj", "q_proj",
                                                       "k_proj", "v_proj", "gate_proj", "up_proj"}
    assert len(wrapped) == 2 + 2 + 4 + 3 + 3  # fused layer, plain layer, linear-attention layer's MLP


def test_a_model_without_named_projections_asks_for_target_modules():
    from bapsql.train.learner.model_parts import discover_lora_targets

    falcon_like = nn.ModuleDict({"h": nn.ModuleList([nn.ModuleDict({"query_key_value": nn.Linear(8, 24),
                                                                     "dense": nn.Linear(8, 8)})])})
    with pytest.raises(ConfigError, match="lora.target_modules.*list the modules"):
        discover_lora_targets(falcon_like)


def _with_vision_linears(model):
    """``model`` with a vision Linear beside its decoder and one inside a decoder layer, as multimodal checkpoints
    carry (a patch projector, a vision-to-text projection): neither is an attention or MLP projection."""
    model.vision = nn.Linear(16, 16)
    model.get_decoder().layers[0].vision_proj = nn.Linear(16, 16)
    return model


def test_a_real_decoder_with_extra_vision_linears_adapts_only_its_projections(tmp_path):
    """The default LoRA of a real (tiny, random) Llama-layout model with an extra vision Linear: peft wraps exactly the
    seven projections of every layer, never the vision Linears, the head or the embeddings."""
    peft = pytest.importorskip("peft")
    from transformers import LlamaConfig, LlamaForCausalLM

    from bapsql.train.learner.model_parts import discover_lora_targets

    model = _with_vision_linears(LlamaForCausalLM(LlamaConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=64)))
    targets = discover_lora_targets(model)
    assert targets == ("down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj")
    adapted = peft.get_peft_model(model, peft.LoraConfig(r=2, target_modules=list(targets)))
    wrapped = sorted(n.removeprefix("base_model.model.") for n, m in adapted.named_modules() if hasattr(m, "lora_A"))
    assert len(wrapped) == 2 * 7 and not any("vision" in n or "lm_head" in n for n in wrapped), wrapped


def test_the_gpt2_familys_fused_conv1d_projections_are_the_default():
    """GPT-2 names its fused q/k/v projection c_attn, its outputs c_proj and its MLP input c_fc (Conv1D layers): all
    are adapted by default, the head is not."""
    peft = pytest.importorskip("peft")
    from transformers import GPT2Config, GPT2LMHeadModel

    from bapsql.train.learner.model_parts import discover_lora_targets

    model = GPT2LMHeadModel(GPT2Config(n_embd=16, n_layer=2, n_head=2, vocab_size=64, n_positions=32,
                                       bos_token_id=0, eos_token_id=0))
    model.vision = nn.Linear(16, 16)
    assert discover_lora_targets(model) == ("c_attn", "c_fc", "c_proj")
    adapted = peft.get_peft_model(model, peft.LoraConfig(r=2, target_modules=["c_attn", "c_fc", "c_proj"]))
    wrapped = [n for n, m in adapted.named_modules() if hasattr(m, "lora_A")]
    assert len(wrapped) == 2 * 4 and all(".h." in n for n in wrapped), wrapped
