"""A peft LoRA adapter folded into its base weights, for engines that serve merged weights instead of a LoRA slot.

``W' = W + scale · B @ A`` for every adapted linear layer, with ``scale = lora_alpha / r`` (``/ sqrt(r)`` under
rsLoRA), per-module ``rank_pattern`` / ``alpha_pattern`` overrides applied as peft applies them. Shapes: ``A``
``[r, in]``, ``B`` ``[out, r]``, ``W`` ``[out, in]`` (``fan_in_fan_out`` adapters store ``W`` transposed, ``[in,
out]``, and get the transposed delta). The sum runs in float32 and is cast back to the base tensor's dtype.

Why: on CPU, vLLM's LoRA path decodes ~2.4× slower than the same weights merged (benchmarks/RESULTS.md, "SmolLM2
rollouts"), so an engine with ``adapter_mode: merge`` (`bapsql.rollout.engines.vllm`) reloads merged weights after
every weight sync. Adapters this module cannot fold exactly (DoRA, trained ``modules_to_save``, biases, non-LoRA
peft types) raise `EngineError` naming the setting; serve those with ``adapter_mode: lora``.

Pure functions over tensors: the engine reads the base checkpoint once (`read_checkpoint`) and folds each new
adapter into that untouched copy (`merge_adapter`), never into weights already merged.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any, Mapping

from bapsql.errors import EngineError

_PEFT_PREFIX = "base_model.model."
_LORA_KEY = re.compile(r"^(?P<module>.+)\.lora_(?P<part>[AB])(?:\.[^.]+)?\.weight$")


def read_checkpoint(folder: str | Path) -> dict[str, Any]:
    """Every tensor of a safetensors checkpoint folder (``*.safetensors``, sharded or not), by checkpoint name."""
    from safetensors.torch import load_file

    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise EngineError(f"adapter_mode merge: {folder} holds no *.safetensors checkpoint to merge adapters into")
    weights: dict[str, Any] = {}
    for f in files:
        weights.update(load_file(str(f)))
    return weights


def _adapter_config(folder: Path) -> dict[str, Any]:
    path = folder / "adapter_config.json"
    if not path.is_file():
        raise EngineError(f"merge_adapter: {folder} is not a peft adapter folder (no adapter_config.json)")
    cfg = json.loads(path.read_text())
    refuse = {"peft_type": cfg.get("peft_type", "LORA") != "LORA", "use_dora": bool(cfg.get("use_dora")),
              "modules_to_save": bool(cfg.get("modules_to_save")), "bias": cfg.get("bias", "none") != "none",
              "lora_bias": bool(cfg.get("lora_bias"))}
    bad = [k for k, v in refuse.items() if v]
    if bad:
        raise EngineError(f"merge_adapter: {folder} sets {', '.join(f'{k}={cfg.get(k)!r}' for k in bad)}, which a "
                          "weight merge does not reproduce; serve it with rollout.engine.adapter_mode: lora")
    return cfg


def _pattern_value(patterns: Mapping[str, Any], module: str, default: Any) -> Any:
    """peft's per-module override: the first pattern whose regex matches the end of the module name."""
    for pattern, value in patterns.items():
        if re.match(rf"(.*\.)?({pattern})$", module):
            return value
    return default


def _adapter_tensors(folder: Path) -> dict[str, Any]:
    st = folder / "adapter_model.safetensors"
    if st.is_file():
        from safetensors.torch import load_file

        return load_file(str(st))
    binary = folder / "adapter_model.bin"
    if binary.is_file():
        import torch

        return torch.load(str(binary), map_location="cpu", weights_only=True)
    raise EngineError(f"merge_adapter: {folder} has no adapter_model.safetensors or adapter_model.bin")


def lora_pairs(folder: str | Path) -> dict[str, tuple[Any, Any, float]]:
    """The adapter's ``module -> (A [r, in], B [out, r], scale)``, module names as in the base checkpoint (peft's
    ``base_model.model.`` prefix removed)."""
    return _pairs(Path(folder), _adapter_config(Path(folder)))


def _pairs(folder: Path, cfg: Mapping[str, Any]) -> dict[str, tuple[Any, Any, float]]:
    parts: dict[str, dict[str, Any]] = {}
    for key, tensor in _adapter_tensors(folder).items():
        m = _LORA_KEY.match(key)
        if m is None:
            raise EngineError(f"merge_adapter: {folder} holds {key!r}, not a LoRA A/B matrix; serve it with "
                              "rollout.engine.adapter_mode: lora")
        module = m["module"].removeprefix(_PEFT_PREFIX)
        parts.setdefault(module, {})[m["part"]] = tensor
    out: dict[str, tuple[Any, Any, float]] = {}
    for module, ab in parts.items():
        if set(ab) != {"A", "B"}:
            raise EngineError(f"merge_adapter: {folder} has lora_{''.join(ab)} but not both A and B for {module}")
        r = int(_pattern_value(cfg.get("rank_pattern") or {}, module, cfg["r"]))
        alpha = float(_pattern_value(cfg.get("alpha_pattern") or {}, module, cfg["lora_alpha"]))
        if ab["A"].shape[0] != r:
            raise EngineError(f"merge_adapter: {module}'s lora_A has rank {ab['A'].shape[0]}, the config says {r}")
        scale = alpha / math.sqrt(r) if cfg.get("use_rslora") else alpha / r
        out[module] = (ab["A"], ab["B"], scale)
    return out


def merge_adapter(base: Mapping[str, Any], folder: str | Path) -> dict[str, Any]:
    """``base`` (checkpoint name -> tensor, left untouched) with the adapter in ``folder`` folded in: a new dict
    holding every base tensor, the adapted ``<module>.weight`` s replaced by ``W + scale · B @ A``."""
    import torch

    cfg = _adapter_config(Path(folder))
    transposed = bool(cfg.get("fan_in_fan_out"))
    merged = dict(base)
    for module, (a, b, scale) in _pairs(Path(folder), cfg).items():
        name = f"{module}.weight"
        if name not in base:
            raise EngineError(f"merge_adapter: the adapter in {folder} adapts {module}, which the base checkpoint "
                              "does not hold; was it trained on another model?")
        w = base[name]
        delta = (b.to(torch.float32) @ a.to(torch.float32)) * scale
        if transposed:
            delta = delta.T
        if tuple(delta.shape) != tuple(w.shape):
            raise EngineError(f"merge_adapter: {module}'s LoRA delta is {tuple(delta.shape)}, its base weight "
                              f"{tuple(w.shape)}; was the adapter trained on another model?")
        merged[name] = (w.to(torch.float32) + delta).to(w.dtype)
    return merged
