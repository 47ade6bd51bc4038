"""A model folder's token codec for engines: decoding completions, end-of-sequence and padding ids.

Contract: `ModelCodec.from_dir(folder)` reads ``tokenizer.json`` (Hugging Face `tokenizers`), the special-token
flags of its added tokens, and the eos / pad ids from ``generation_config.json`` (falling back to
``tokenizer_config.json``'s ``eos_token`` / ``pad_token``). The token the folder's chat template closes an assistant
turn with (`bapsql.models.framing.ChatFraming.end_of_turn_ids`, measured from the template: ``<|im_end|>``,
``<|eot_id|>``, ...) ends a completion too, whether or not the configs name it (Meta-Llama-3-Instruct first shipped
with eos ``<|end_of_text|>`` only, so a model that closed its turn with ``<|eot_id|>`` ran on to ``max_tokens``); a
template the environment cannot frame adds nothing here (it fails where prompts are rendered). ``decode`` skips
special tokens, as vLLM does by default, so every engine renders a completion's ``text`` the same way. Only
`tokenizers` (and, for a folder with a chat template, jinja2) is needed.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Sequence

from bapsql.errors import EngineError


class ModelCodec:
    """Encode/decode with a model folder's tokenizer; ``eos_ids`` end a completion, ``pad_id`` pads batches."""

    def __init__(self, tokenizer_file: Path, eos_ids: frozenset[int], pad_id: int):
        from tokenizers import Tokenizer

        self._tok = Tokenizer.from_file(str(tokenizer_file))
        self.eos_ids = eos_ids
        self.pad_id = pad_id
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)

    @classmethod
    def from_dir(cls, folder: str | Path) -> "ModelCodec":
        """Read the codec of model (or tokenizer) folder ``folder``; `EngineError` when it has no tokenizer."""
        d = Path(folder)
        if not (d / "tokenizer.json").is_file():
            raise EngineError(f"no tokenizer.json in {d}; point the engine at a model folder with its tokenizer")
        tok_json = json.loads((d / "tokenizer.json").read_text(encoding="utf-8"))
        by_content = {t["content"]: t["id"] for t in tok_json.get("added_tokens", [])}
        eos: set[int] = set()
        pad: int | None = None
        gen = d / "generation_config.json"
        if gen.is_file():
            g = json.loads(gen.read_text(encoding="utf-8"))
            e = g.get("eos_token_id")
            eos.update(e if isinstance(e, list) else [e] if isinstance(e, int) else [])
            pad = g.get("pad_token_id") if isinstance(g.get("pad_token_id"), int) else None
        tc = d / "tokenizer_config.json"
        if tc.is_file():
            t = json.loads(tc.read_text(encoding="utf-8"))
            for key in ("eos_token", "pad_token"):
                v = t.get(key)
                content = v.get("content") if isinstance(v, dict) else v
                if isinstance(content, str) and content in by_content:
                    if key == "eos_token":
                        eos.add(by_content[content])
                    elif pad is None:
                        pad = by_content[content]
        eos.update(template_end_of_turn(d))
        if not eos:
            raise EngineError(f"{d}: no eos token in generation_config.json or tokenizer_config.json")
        return cls(d / "tokenizer.json", frozenset(eos), pad if pad is not None else min(eos))

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids`` with special tokens skipped."""
        return self._tok.decode(list(ids), skip_special_tokens=True)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (no special tokens added; special-token strings in ``text`` map to their ids)."""
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode_raw(self, ids: Sequence[int]) -> str:
        """Text of ``ids`` with special tokens kept (for text prompts sent to a server)."""
        return self._tok.decode(list(ids), skip_special_tokens=False)


def template_end_of_turn(folder: str | Path) -> tuple[int, ...]:
    """The id of the token ``folder``'s chat template closes an assistant turn with (one id), or () when the folder
    has no chat template or its template cannot be framed (`bapsql.tokens.folder_framing`)."""
    from bapsql.errors import ChatTemplateError
    from bapsql.tokens import folder_framing

    try:
        return folder_framing(str(Path(folder).resolve())).end_of_turn_ids[:1]
    except ChatTemplateError:
        return ()


@contextlib.contextmanager
def quiet_transformers():
    """Silence transformers' progress bars (weight loading / saving) inside the block, restoring the setting."""
    from transformers.utils import logging

    was = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            logging.enable_progress_bar()
