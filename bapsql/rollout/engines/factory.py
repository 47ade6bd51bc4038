"""Build an engine from its config: the one place that maps `EngineConfig.kind` to an implementation.

Contract: `make_engine(config)` accepts an `EngineConfig`, a mapping or a YAML path (validated strictly by
`load_engine_config`) and returns a started engine satisfying `bapsql.rollout.engines.base.Engine`. Implementations
are imported only for the kind asked for, so building an HF engine never imports vllm.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from bapsql.errors import ConfigError
from bapsql.rollout.engines.base import HTTP_KINDS, Engine, EngineConfig, load_engine_config

SPEC_MAX_MODEL_LEN = 32_768  # context of an engine given as KIND:URL (a hosted model's window is not known here)


def engine_config_from_spec(spec: str, *, model: str | None = None) -> EngineConfig:
    """``spec`` is an engine YAML file, or ``openai_chat:URL`` / ``openai:URL`` (``URL`` the API base ending in
    ``/v1``; ``model`` names the served model and is required then). `ConfigError` says what to pass otherwise."""
    kind, sep, url = spec.partition(":")
    if sep and kind in HTTP_KINDS:
        if not model:
            raise ConfigError(f"engine {spec!r}: name the served model (--model NAME)")
        return EngineConfig(kind=kind, model=model, base_url=url, max_model_len=SPEC_MAX_MODEL_LEN)  # type: ignore
    if not Path(spec).is_file():
        raise ConfigError(f"engine {spec!r}: pass an engine YAML file or openai_chat:URL (e.g. "
                          "openai_chat:http://127.0.0.1:8000/v1)")
    cfg = load_engine_config(spec)
    if model and model != cfg.model:
        raise ConfigError(f"engine {spec}: --model {model!r} differs from the YAML's model {cfg.model!r}; drop one")
    return cfg


def make_engine(config: EngineConfig | Mapping[str, Any] | str | Path) -> Engine:
    """Start the engine ``config`` describes (``kind``: vllm | hf | openai | openai_chat)."""
    cfg = config if isinstance(config, EngineConfig) else load_engine_config(config)
    if cfg.kind == "vllm":
        from bapsql.rollout.engines.vllm import VLLMEngine

        return VLLMEngine(cfg)
    if cfg.kind == "hf":
        from bapsql.rollout.engines.hf import HFEngine

        return HFEngine(cfg)
    if cfg.kind == "openai_chat":
        from bapsql.rollout.engines.openai_chat import OpenAIChatEngine

        return OpenAIChatEngine(cfg)
    from bapsql.rollout.engines.openai_http import OpenAIEngine

    return OpenAIEngine(cfg)
