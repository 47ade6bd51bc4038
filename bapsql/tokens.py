"""Token counting with the policy's own tokenizer.

Every charge in the ledger that is measured in tokens (live context, result tokens, prompt and completion tokens) goes
through a `TokenCounter`. Real runs use the policy's tokenizer (`HFTokenCounter`, a ``tokenizer.json`` file or a
folder holding one); `RegexTokenCounter` is a deterministic, dependency-free approximation for when no tokenizer is
configured.

Every counter carries the `bapsql.models.framing.ChatFraming` of the policy's chat template (``counter.framing``):
the per-message template overheads, generation prompt and closing tokens the environment adds to the content counts
(`bapsql.env.transcript.Transcript`). `HFTokenCounter` measures it, lazily and once per (folder, template options),
from the chat template of the folder its ``tokenizer.json`` lives in; a counter without a template — the regex
approximation, or a bare tokenizer file — uses `DEFAULT_FRAMING` (Qwen2.5 ChatML).

Every counter also has ``neutralize(text)``: the escape of control-token strings in untrusted text
(`bapsql.models.untrusted`; the environment applies it to every message the policy did not write before counting it).
`HFTokenCounter` escapes its tokenizer's control tokens and the common families' shapes; `RegexTokenCounter` the
common shapes.
"""

from __future__ import annotations

import json
import re
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from bapsql.errors import ConfigError
from bapsql.models.framing import DEFAULT_FRAMING, ChatFraming

RESOURCES = Path(__file__).resolve().parent / "resources"
DEFAULT_TOKENIZER_DIR = RESOURCES / "tokenizer"


@runtime_checkable
class TokenCounter(Protocol):
    """Counts tokens of a text exactly as the policy's tokenizer would encode it (no special tokens added)."""

    name: str
    framing: ChatFraming  # what the policy's chat template adds around messages (the live-context overheads)

    def count(self, text: str) -> int: ...


class RegexTokenCounter:
    """Deterministic approximation: words, numbers, and each punctuation mark count one token; long words count one
    token per 4 characters. Used only where no real tokenizer is configured."""

    name = "regex-approx"
    framing = DEFAULT_FRAMING
    _pattern = re.compile(r"[A-Za-z_]+|\d+|[^\sA-Za-z_\d]")

    def neutralize(self, text: str) -> str:
        """``text`` with control-token strings escaped (the common shapes: `bapsql.models.untrusted.DEFAULT`)."""
        from bapsql.models.untrusted import DEFAULT

        return DEFAULT(text)

    def count(self, text: str) -> int:
        n = 0
        for m in self._pattern.finditer(text):
            piece = m.group(0)
            n += max(1, (len(piece) + 3) // 4) if piece[0].isalnum() or piece[0] == "_" else 1
        return n


class HFTokenCounter:
    """Counts with a Hugging Face `tokenizers` file (``tokenizer.json``) — the policy's own tokenizer.

    ``template_kwargs``: the chat-template options the policy's prompts are rendered with (e.g.
    ``enable_thinking=False``); ``framing`` is measured under them."""

    def __init__(self, path: str | Path, *, template_kwargs: dict[str, Any] | None = None):
        from tokenizers import Tokenizer

        p = Path(path)
        file = p / "tokenizer.json" if p.is_dir() else p
        if not file.is_file():
            raise ConfigError(f"tokenizer: no tokenizer.json at {p}; pass a tokenizer file or a model folder")
        self._tok = Tokenizer.from_file(str(file))
        self.name = str(file)
        self.folder = file.parent
        self.template_kwargs = dict(template_kwargs or {})

    def count(self, text: str) -> int:
        return len(self._tok.encode(text, add_special_tokens=False).ids)

    @cached_property
    def _neutralizer(self):
        from bapsql.models.untrusted import for_tokenizer

        return for_tokenizer(self._tok)

    def neutralize(self, text: str) -> str:
        """``text`` with every control-token string of this tokenizer (and of the common chat families) escaped, so
        it encodes as plain characters (`bapsql.models.untrusted`)."""
        return self._neutralizer(text)

    @cached_property
    def framing(self) -> ChatFraming:
        """The framing of the chat template next to the tokenizer (`DEFAULT_FRAMING` when the folder has none)."""
        options = json.dumps(self.template_kwargs, sort_keys=True, default=str)
        return folder_framing(str(self.folder.resolve()), options)


def has_chat_template(folder: str | Path) -> bool:
    """Whether model folder ``folder`` holds a chat template (``chat_template.jinja``, or in tokenizer_config.json)."""
    d = Path(folder)
    if (d / "chat_template.jinja").is_file():
        return True
    config = d / "tokenizer_config.json"
    if not config.is_file():
        return False
    try:
        return json.loads(config.read_text(encoding="utf-8")).get("chat_template") is not None
    except (json.JSONDecodeError, AttributeError):
        return False


@lru_cache(maxsize=32)
def folder_framing(folder: str, template_kwargs_json: str = "{}") -> ChatFraming:
    """The `ChatFraming` of ``folder``'s chat template under the options ``template_kwargs_json`` (a JSON object),
    measured once per (folder, options); `DEFAULT_FRAMING` when the folder has no chat template."""
    if not has_chat_template(folder) or not (Path(folder) / "tokenizer.json").is_file():
        return DEFAULT_FRAMING
    from bapsql.models.chat_template import ChatTemplate

    return ChatTemplate.from_dir(folder).framing(**json.loads(template_kwargs_json))


def load_token_counter(spec: str = "default", **template_kwargs: Any) -> TokenCounter:
    """``"default"`` → the tokenizer shipped with the package (the tiny model's); ``"regex"`` → `RegexTokenCounter`;
    anything else → a path to a tokenizer file or model folder. ``template_kwargs``: the chat-template options the
    policy renders with (its counter's ``framing`` is measured under them). One counter per (spec, options)."""
    return _load_token_counter(spec, json.dumps(template_kwargs, sort_keys=True, default=str))


@lru_cache(maxsize=8)
def _load_token_counter(spec: str, template_kwargs_json: str) -> TokenCounter:
    kwargs = json.loads(template_kwargs_json)
    if spec == "regex":
        return RegexTokenCounter()
    if spec == "default":
        if not (DEFAULT_TOKENIZER_DIR / "tokenizer.json").is_file():
            raise ConfigError(f"the packaged default tokenizer is missing at {DEFAULT_TOKENIZER_DIR}")
        return HFTokenCounter(DEFAULT_TOKENIZER_DIR, template_kwargs=kwargs)
    return HFTokenCounter(spec, template_kwargs=kwargs)
