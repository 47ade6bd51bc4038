"""The dtype a model is loaded in: `resolve_dtype(name, model_dir)`.

``auto`` (the default of the engine, learner and training-model configs) means the checkpoint's own dtype: the
``torch_dtype`` key of its ``config.json`` (``dtype`` since transformers 4.56), else that key of its
``text_config`` (multimodal checkpoints), else ``float32``. So a bf16 checkpoint runs in bf16 on a GPU without
being named, and the tiny model and the SmolLM2 folder (saved float32) keep running in float32. Every consumer
(the HF and vLLM engines, the learner) resolves ``auto`` here, so the engine that samples and the learner that
scores load the same checkpoint in the same dtype. A checkpoint dtype outside `DTYPE_NAMES` (an fp8 quantized
checkpoint, say) raises `ConfigError`: name the dtype to run it in.
"""

from __future__ import annotations

import json
from pathlib import Path

from bapsql.errors import ConfigError

DTYPE_NAMES: tuple[str, ...] = ("float32", "bfloat16", "float16")
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


def resolve_dtype(name: str, model_dir: str | Path) -> str:
    """The dtype (one of `DTYPE_NAMES`) to load ``model_dir`` in: ``name`` itself, or for ``auto`` the checkpoint's
    dtype (float32 when its config names none). `ConfigError` for any other name."""
    if name in DTYPE_NAMES:
        return name
    if name != "auto":
        raise ConfigError(f"dtype: {name!r} is not one of {['auto', *DTYPE_NAMES]}")
    return checkpoint_dtype(model_dir) or "float32"
