"""What the learner needs to know about a transformers model's parts: which projections LoRA adapts, where its
dropouts are, and which files of its folder are weights.

- `discover_lora_targets(model)`: every ``torch.nn.Linear`` except the output head (attention, MLP, shared-expert and
  linear-attention projections alike), as peft ``target_modules``.
- `dropout_disabled(model)`: a context in which every dropout of the model is off.
- `is_weight_file(name)`: weights and shard indexes, never copied next to a merged model.
"""

from __future__ import annotations

import contextlib
from typing import Any

from bapsql.errors import ConfigError

WEIGHT_SUFFIXES: tuple[str, ...] = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".gguf")


def discover_lora_targets(model: Any) -> tuple[str, ...]:
    """The LoRA ``target_modules`` of ``model``: every ``torch.nn.Linear`` except the output head — attention, MLP,
    shared-expert and linear-attention projections alike. Leaf names (``q_proj``, ``in_proj_qkvz``, ...) where every
    module of that name is a linear layer; full module paths for linear layers whose leaf name is shared with
    another kind of module (a router named like a projection), so peft never wraps a module it cannot adapt."""
    import torch

    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    linear: dict[str, list[str]] = {}
    other: set[str] = set()
    for name, m in model.named_modules():
        if not name:
            continue
        leaf = name.rsplit(".", 1)[-1]
        if isinstance(m, torch.nn.Linear) and m is not head:
            linear.setdefault(leaf, []).append(name)
        else:
            other.add(leaf)
    out: list[str] = []
    for leaf, paths in sorted(linear.items()):
        out.extend([leaf] if leaf not in other else paths)
    if not out:
        raise ConfigError("lora: the model has no linear projection to adapt; set lora.target_modules")
    return tuple(out)


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
