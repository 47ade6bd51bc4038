"""Token counting with the policy's own tokenizer.

Every charge in the ledger that is measured in tokens (live context, result tokens, prompt and completion tokens) goes
through a `TokenCounter`. Real runs use the policy's tokenizer (`HFTokenCounter`, a ``tokenizer.json`` file or a
folder holding one); `RegexTokenCounter` is a deterministic, dependency-free approximation for when no tokenizer is
configured.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path
from typing import Protocol, runtime_checkable

from bapsql.errors import ConfigError

RESOURCES = Path(__file__).resolve().parent / "resources"
DEFAULT_TOKENIZER_DIR = RESOURCES / "tokenizer"


@runtime_checkable
class TokenCounter(Protocol):
    """Counts tokens of a text exactly as the policy's tokenizer would encode it (no special tokens added)."""

    name: str

    def count(self, text: str) -> int: ...


class RegexTokenCounter:
    """Deterministic approximation: words, numbers, and each punctuation mark count one token; long words count one
    token per 4 characters. Used only where no real tokenizer is configured."""

    name = "regex-approx"
    _pattern = re.compile(r"[A-Za-z_]+|\d+|[^\sA-Za-z_\d]")

    def count(self, text: str) -> int:
        n = 0
        for m in self._pattern.finditer(text):
            piece = m.group(0)
            n += max(1, (len(piece) + 3) // 4) if piece[0].isalnum() or piece[0] == "_" else 1
        return n


class HFTokenCounter:
    """Counts with a Hugging Face `tokenizers` file (``tokenizer.json``) — the policy's own tokenizer."""

    def __init__(self, path: str | Path):
        from tokenizers import Tokenizer

        p = Path(path)
        file = p / "tokenizer.json" if p.is_dir() else p
        if not file.is_file():
            raise ConfigError(f"tokenizer: no tokenizer.json at {p}; pass a tokenizer file or a model folder")
        self._tok = Tokenizer.from_file(str(file))
        self.name = str(file)

    def count(self, text: str) -> int:
        return len(self._tok.encode(text, add_special_tokens=False).ids)


@lru_cache(maxsize=8)
def load_token_counter(spec: str = "default") -> TokenCounter:
    """``"default"`` → the tokenizer shipped with the package (the tiny model's); ``"regex"`` → `RegexTokenCounter`;
    anything else → a path to a tokenizer file or model folder."""
    if spec == "regex":
        return RegexTokenCounter()
    if spec == "default":
        if not (DEFAULT_TOKENIZER_DIR / "tokenizer.json").is_file():
            raise ConfigError(f"the packaged default tokenizer is missing at {DEFAULT_TOKENIZER_DIR}")
        return HFTokenCounter(DEFAULT_TOKENIZER_DIR)
    return HFTokenCounter(spec)
