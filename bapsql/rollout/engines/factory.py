"""Build an engine from its config: the one place that maps `EngineConfig.kind` to an implementation.

Contract: `make_engine(config)` accepts an `EngineConfig`, a mapping or a YAML path (validated strictly by
`load_engine_config`) and returns a started engine satisfying `bapsql.rollout.engines.base.Engine`. Implementations
are imported only for the kind asked for, so building an HF engine never imports vllm.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from bapsql.rollout.engines.base import Engine, EngineConfig, load_engine_config


def make_engine(config: EngineConfig | Mapping[str, Any] | str | Path) -> Engine:
    """Start the engine ``config`` describes (``kind``: vllm | hf | openai)."""
    cfg = config if isinstance(config, EngineConfig) else load_engine_config(config)
    if cfg.kind == "vllm":
        from bapsql.rollout.engines.vllm import VLLMEngine

        return VLLMEngine(cfg)
    if cfg.kind == "hf":
        from bapsql.rollout.engines.hf import HFEngine

        return HFEngine(cfg)
    from bapsql.rollout.engines.openai_http import OpenAIEngine

    return OpenAIEngine(cfg)
