"""What the learner needs to know about a transformers model's parts: which projections LoRA adapts, where its
dropouts are, and which files of its folder are weights.

- `discover_lora_targets(model)`: the decoder's attention and MLP projections (`PROJECTIONS`, fused forms included),
  as peft ``target_modules``; vision towers, projectors, linear-attention blocks and the head only when listed.
- `dropout_disabled(model)`: a context in which every dropout of the model is off.
- `is_weight_file(name)`: weights and shard indexes, never copied next to a merged model.
"""

from __future__ import annotations

import contextlib
from typing import Any

from bapsql.errors import ConfigError

# the attention and MLP projections LoRA adapts by default: Llama / Qwen / Mistral names, the fused forms of
# Phi-3-class checkpoints (qkv_proj, gate_up_proj) and of the GPT-2 family (c_attn = fused q/k/v, c_proj = the
# attention and the MLP output, c_fc = the MLP input; Conv1D layers in GPT-2, Linear in GPTBigCode / StarCoder)
PROJECTIONS: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "qkv_proj", "gate_proj", "up_proj",
                                "down_proj", "gate_up_proj", "c_attn", "c_proj", "c_fc")
WEIGHT_SUFFIXES: tuple[str, ...] = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".gguf")


def discover_lora_targets(model: Any) -> tuple[str, ...]:
    """The default LoRA ``target_modules`` of ``model``: its decoder's attention and MLP projections, the
    ``torch.nn.Linear`` (or GPT-2 ``Conv1D``) layers named in `PROJECTIONS` (``q_proj`` ... ``down_proj``, the fused
    ``qkv_proj`` / ``gate_up_proj`` / ``c_attn``) inside ``model.get_decoder()`` (the whole model when it has none).
    Other linears — a vision
    tower's, a multimodal projector's, linear-attention blocks' (``in_proj_qkvz``, ``out_proj``), routers, the output
    head — are adapted only when ``lora.target_modules`` lists them. Leaf names where every module of that name is
    such a projection; full module paths where a leaf name is shared with a module left out (a vision tower's
    ``up_proj``, a router named like a projection), so peft never wraps a module outside the default.
    `ConfigError` when the model has none of these projections."""
    scope = _decoder_prefix(model)
    layers = _projection_layer_types()
    taken: dict[str, list[str]] = {}
    other: set[str] = set()
    for name, m in model.named_modules():
        if not name:
            continue
        leaf = name.rsplit(".", 1)[-1]
        inside = scope is None or name == scope or name.startswith(scope + ".")
        if leaf in PROJECTIONS and inside and isinstance(m, layers):
            taken.setdefault(leaf, []).append(name)
        else:
            other.add(leaf)
    out: list[str] = []
    for leaf, paths in sorted(taken.items()):
        out.extend([leaf] if leaf not in other else paths)
    if not out:
        kind = type(model).__name__
        raise ConfigError(f"lora.target_modules: {kind} has no attention or MLP projection named like "
                          f"{', '.join(PROJECTIONS)}; list the modules to adapt under lora.target_modules (leaf names "
                          "of its torch.nn.Linear layers, e.g. [query_key_value, dense])")
    return tuple(out)


def _projection_layer_types() -> tuple[type, ...]:
    """The layer classes a projection can be: ``torch.nn.Linear``, and transformers' ``Conv1D`` (GPT-2) when
    transformers is importable (peft adapts both)."""
    import torch

    try:
        from transformers.pytorch_utils import Conv1D
    except ImportError:
        return (torch.nn.Linear,)
    return (torch.nn.Linear, Conv1D)


def _decoder_prefix(model: Any) -> str | None:
    """The module path of ``model.get_decoder()``, or None without a decoder (or when it is the model itself)."""
    get = getattr(model, "get_decoder", None)
    if get is None:
        return None
    try:
        decoder = get()
    except (AttributeError, NotImplementedError, TypeError):
        return None
    if decoder is None:
        return None
    return next((name for name, m in model.named_modules() if m is decoder and name), None)  # "": the whole model


@contextlib.contextmanager
def dropout_disabled(model: Any):
    """Every dropout of ``model`` off inside the block (restored after): ``nn.Dropout`` modules (LoRA's included)
    and attention modules' ``attention_dropout`` rate. Training mode (and gradient checkpointing) stays on."""
    import torch

    saved: list[tuple[Any, str, float]] = []
    for m in model.modules():
        if isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0:
            saved.append((m, "p", m.p))
            m.p = 0.0
        rate = getattr(m, "attention_dropout", None)
        if isinstance(rate, float) and rate > 0:
            saved.append((m, "attention_dropout", rate))
            m.attention_dropout = 0.0
    try:
        yield
    finally:
        for m, attr, value in saved:
            setattr(m, attr, value)


def is_weight_file(name: str) -> bool:
    """Model weights or their shard index (``model.safetensors.index.json``): never copied into a merged folder."""
    return name.endswith(WEIGHT_SUFFIXES) or (name.endswith(".index.json") and (".safetensors" in name or
                                                                              ".bin" in name))
