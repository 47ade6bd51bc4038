"""`resolve_model`: a config's ``model:`` value → what an engine loads (a folder, or a name for a server).

Contract of `resolve_model(spec, *, cache_dir=None, announce=None) -> str`, in this order:

- ``builtin:tiny``: the tiny Qwen2-architecture model (`bapsql.models.tiny`, seed 0, 16,384 positions, a short
  next-token pretraining) in ``<cache>/tiny-model-seed0``, built there on first use (``announce`` is told);
- a registry name (`model_names`): its folder in ``<cache>/models/<name>``, fetched on first use (``announce``
  hears every stage, so a job naming it on a fresh machine shows what it waits for);
- another ``builtin:`` name: `ModelError` listing what exists;
- anything else (a local folder, a hub id such as ``org/name``, a served model name of an HTTP engine): returned
  unchanged, for transformers / vLLM / the server to resolve (a hub id where a network allows).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from bapsql.errors import ModelError
from bapsql.models import registry
from bapsql.models.fetch import fetch_model, is_fetched
from bapsql.models.registry import BUILTIN_TINY, TINY_POSITIONS, TINY_PRETRAIN_STEPS, model_dir, model_names


def resolve_model(spec: str, *, cache_dir: str | Path | None = None,
                  announce: Callable[[str], None] | None = None) -> str:
    """What an engine should load for ``spec`` (module docstring)."""
    if spec == BUILTIN_TINY:
        return str(_tiny_model(cache_dir, announce))
    if spec in registry.REGISTRY:  # read at call time: a test may add an entry
        out = model_dir(spec, cache_dir)
        if not is_fetched(registry.REGISTRY[spec], out):
            if announce:
                announce(f"fetching registry model {spec} into {out} (first use) ...")
            fetch_model(spec, out=out, progress=announce)
        return str(out)
    if spec.startswith("builtin:"):
        raise ModelError(f"unknown model {spec!r}: the built-in model is {BUILTIN_TINY}; registry names: "
                         f"{', '.join(model_names())}")
    return spec


def _tiny_model(cache_dir: str | Path | None, announce: Callable[[str], None] | None) -> Path:
    from bapsql.data.cache import default_cache_dir

    root = (Path(cache_dir) if cache_dir is not None else default_cache_dir()) / "tiny-model-seed0"
    if not (root / "config.json").is_file():
        from bapsql.models.tiny import TinySpec, make_tiny_model

        if announce:
            announce(f"building the tiny model into {root} ...")
        make_tiny_model(root, seed=0, spec=TinySpec(max_position_embeddings=TINY_POSITIONS),
                        pretrain_steps=TINY_PRETRAIN_STEPS)
    return root
