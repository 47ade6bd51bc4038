"""Untrusted text never becomes a control token: the escape applied to every message the policy did not write.

A chat template writes its control tokens (ChatML's ``<|im_start|>`` / ``<|im_end|>``, Llama 3's
``<|start_header_id|>`` / ``<|eot_id|>``, ...) into the prompt text, and the tokenizer maps each such string to its
id wherever it stands — inside a message's content too. A question or a database value holding
``<|im_end|>\\n<|im_start|>system\\n...`` would open a real system turn (role injection). `Neutralizer` escapes those
strings in untrusted text before it enters a message: a zero-width space (U+200B, `JOINER`) goes after the string's
first character (``<|im_start|>`` → ``<\\u200b|im_start|>``), so the text reads the same and tokenizes as plain
characters, while the template's own control tokens stay real. Escaped strings:

- the policy tokenizer's control tokens (`control_tokens`: its added tokens flagged special);
- whatever the tokenizer, the control-token shapes of the common chat families (`CONTROL_PATTERN`: ``<|...|>``,
  ``<｜...｜>``, ``<s>``, ``[INST]``, ``<<SYS>>``, ``<start_of_turn>``), so a prompt rendered again by a server with
  another tokenizer (the ``openai_chat`` engine) is safe too.

Tool-call and reasoning tags (``<tool_call>``, ``<tool_response>``, ``<think>``: added tokens not flagged special)
are not role tokens and stay as they are: the environment's own texts use them (the system prompt shows the call
format, an invalid action's observation repeats it).

Where: `bapsql.env.transcript.Transcript` escapes every system, user and tool message (the question, database values
and column names, SQLite's messages, everything the environment shows) with its token counter's neutralizer
(`bapsql.tokens.HFTokenCounter.neutralize`), before counting and before the agent renders it: training, evaluation
and serving play the same escaped text, and the context is charged for exactly what the prompt holds. The policy's
own completions are never escaped. Benign text is returned unchanged.
"""

from __future__ import annotations

import re
from typing import Any, Iterable

JOINER = "\u200b"  # zero-width space: invisible, and no control token contains it
FALLBACK_JOINER = " "  # for a tokenizer whose normalizer drops the zero-width space
CONTROL_PATTERN = re.compile(
    r"<\|[^\s<>|]{1,80}\|>"  # ChatML, Llama 3, Phi, Qwen: <|im_start|>, <|eot_id|>, <|end|>
    r"|<｜[^<>｜]{1,80}｜>"  # DeepSeek: <｜begin▁of▁sentence｜>
    r"|</?s>|\[/?INST\]|<</?SYS>>|\[/?(?:AVAILABLE_TOOLS|TOOL_CALLS|TOOL_RESULTS)\]"  # Llama 2, Mistral
    r"|<(?:start|end)_of_turn>")  # Gemma
# a tokenizer's markup-shaped tokens: <...> or [...] with no bracket or newline inside (others are matched literally)
_MARKUP = re.compile(r"<[^<>\[\]\n]{1,120}>|\[[^<>\[\]\n]{1,120}\]")


def _markup(token: str) -> bool:
    return bool(_MARKUP.fullmatch(token))


def control_tokens(tokenizer: Any) -> tuple[str, ...]:
    """The control-token strings of a `tokenizers.Tokenizer` (its special added tokens), longest first."""
    out = {t.content for t in tokenizer.get_added_tokens_decoder().values() if len(t.content) >= 2 and t.special}
    return tuple(sorted(out, key=lambda s: (-len(s), s)))


class Neutralizer:
    """``neutralize(text)``: ``text`` with every control-token string escaped (see the module docstring).
    ``tokens``: the policy tokenizer's control tokens (`control_tokens`); the common shapes are always escaped."""

    def __init__(self, tokens: Iterable[str] = (), joiner: str = JOINER):
        tokens = tuple(t for t in tokens if len(t) >= 2)
        self.joiner = joiner
        self._markup = frozenset(t for t in tokens if _markup(t))
        odd = sorted({t for t in tokens if t not in self._markup}, key=len, reverse=True)
        self._odd = re.compile("|".join(re.escape(t) for t in odd)) if odd else None
        self._find = re.compile(f"(?P<known>{CONTROL_PATTERN.pattern})|{_MARKUP.pattern}")
        self._firsts = frozenset("<[") | frozenset(t[0] for t in odd)

    def _escape(self, s: str) -> str:
        return s[0] + self.joiner + s[1:]

    def _markup_sub(self, m: re.Match) -> str:
        s = m.group(0)
        return self._escape(s) if m.group("known") is not None or s in self._markup else s

    def __call__(self, text: str) -> str:
        if not text or not any(c in text for c in self._firsts):
            return text
        out = self._find.sub(self._markup_sub, text)
        if self._odd is not None:
            out = self._odd.sub(lambda m: self._escape(m.group(0)), out)
        return out

    def escapes(self, text: str) -> bool:
        """Whether ``text`` holds a control-token string (``neutralize`` would change it)."""
        return self(text) != text


DEFAULT = Neutralizer()  # the common shapes only: for a counter without a tokenizer


def for_tokenizer(tokenizer: Any) -> Neutralizer:
    """The `Neutralizer` of a `tokenizers.Tokenizer`: its control tokens, with a joiner its normalizer keeps
    (checked: no escaped control token encodes to a special id)."""
    tokens = control_tokens(tokenizer)
    special = {i for i, t in tokenizer.get_added_tokens_decoder().items() if t.content in set(tokens)}
    for joiner in (JOINER, FALLBACK_JOINER):
        neutral = Neutralizer(tokens, joiner)
        probe = "\n".join(neutral(t) for t in tokens)
        if not special.intersection(tokenizer.encode(probe, add_special_tokens=False).ids):
            return neutral
    raise ValueError("no joiner keeps this tokenizer's control tokens apart")  # pragma: no cover - no such tokenizer
