"""The dtype a model is loaded in: `resolve_dtype(name, model_dir, device)`.

``auto`` (the default of the engine, learner and training-model configs) depends on where the model runs:

- on a CUDA device: 16-bit. The checkpoint's own 16-bit dtype when its ``config.json`` names one (``torch_dtype``,
  ``dtype`` since transformers 4.56, or that key of its ``text_config`` for multimodal checkpoints), else
  ``bfloat16`` — ``float16`` on a GPU without bf16 support (and for a bf16 checkpoint there). So a YAML that omits
  the dtype never runs a 4B model in float32 on a GPU, also when its folder was saved in float32 (a GGUF import, a
  random-weight model);
- on the CPU: ``float32`` (bf16 matrix products are slower than float32 on CPUs without AVX-512 BF16 / AMX, and
  the tiny model and the SmolLM2 folder are float32 anyway).

Every consumer (the HF and vLLM engines, the learner) resolves ``auto`` here for the device it runs on, so an engine
and a learner on the same device load the same checkpoint in the same dtype. A named dtype is used as named. A
checkpoint dtype outside `DTYPE_NAMES` (an fp8 quantized checkpoint, say) raises `ConfigError`: name the dtype to
run it in.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bapsql.errors import ConfigError

DTYPE_NAMES: tuple[str, ...] = ("float32", "bfloat16", "float16")
HALF_NAMES: tuple[str, ...] = ("bfloat16", "float16")
_ALIASES = {"float32": "float32", "fp32": "float32", "float": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
            "float16": "float16", "fp16": "float16", "half": "float16"}
_KEYS = ("torch_dtype", "dtype")


def checkpoint_dtype(model_dir: str | Path) -> str | None:
    """The dtype ``model_dir``'s ``config.json`` names (one of `DTYPE_NAMES`), or None when it names none.
    `ConfigError` when the file is unreadable or names a dtype outside `DTYPE_NAMES`."""
    path = Path(model_dir) / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"dtype: auto reads the checkpoint's dtype from {path}, which cannot be read ({exc}); "
                          f"set dtype to one of {list(DTYPE_NAMES)}") from exc
    for section in (config, config.get("text_config") if isinstance(config, dict) else None):
        if not isinstance(section, dict):
            continue
        for key in _KEYS:
            value = section.get(key)
            if value is None:
                continue
            name = _ALIASES.get(str(value).removeprefix("torch.").lower())
            if name is None:
                raise ConfigError(f"dtype: auto found {key}: {value!r} in {path}, which bapsql does not load in; set "
                                  f"dtype to one of {list(DTYPE_NAMES)}")
            return name
    return None


def device_kind(device: Any) -> str:
    """``"cuda"`` or ``"cpu"`` for a device given as ``auto``, ``cpu``, ``cuda``, ``cuda:N`` or a ``torch.device``
    (``auto``: cuda when torch sees a GPU)."""
    name = str(getattr(device, "type", device) or "auto").split(":", 1)[0].lower()
    if name == "auto":
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    if name not in ("cpu", "cuda"):
        raise ConfigError(f"device: {device!r} is not auto, cpu or cuda[:N]")
    return name


def bf16_supported() -> bool:
    """Whether the visible CUDA device computes in bfloat16 (False without one)."""
    import torch

    return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())


def resolve_dtype(name: str, model_dir: str | Path, device: Any) -> str:
    """The dtype (one of `DTYPE_NAMES`) to load ``model_dir`` in on ``device``: ``name`` itself, or for ``auto``
    16-bit on CUDA (the checkpoint's 16-bit dtype, else bfloat16; float16 without bf16 support) and float32 on the
    CPU (module docstring). `ConfigError` for any other name."""
    if name in DTYPE_NAMES:
        return name
    if name != "auto":
        raise ConfigError(f"dtype: {name!r} is not one of {['auto', *DTYPE_NAMES]}")
    if device_kind(device) == "cpu":
        return "float32"
    own = checkpoint_dtype(model_dir)
    bf16 = bf16_supported()
    if own == "float16" or (own == "bfloat16" and bf16):
        return own
    return "bfloat16" if bf16 else "float16"
