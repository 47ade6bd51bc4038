"""The live transcript of an episode and its token accounting (the context channel is measured here).

The live context is the token count, with the policy's tokenizer, of every message still in the transcript plus a
fixed per-message template overhead, modelled on Qwen's ChatML template:

- system / user / assistant: ``<|im_start|>{role}\\n`` + content + ``<|im_end|>\\n`` → 5 tokens of overhead;
- tool observations are sent as a user turn wrapped in ``<tool_response>\\n ... \\n</tool_response>`` → 9;
- the prompt for the next completion adds the generation prompt ``<|im_start|>assistant\\n`` → 3.

So ``prompt() = live() + 3``. Messages that show an evidence block hold a *reference* to it, so archiving,
compressing, discarding or restoring the block re-renders that message in place (the context goes down or up) —
the environment reports ``context_rewritten`` when that happens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from bapsql.tokens import TokenCounter

TEMPLATE_OVERHEAD: dict[str, int] = {"system": 5, "user": 5, "assistant": 5, "tool": 9}
GENERATION_PROMPT_TOKENS = 3


@dataclass
class _Message:
    role: str
    head: str
    ref: str | None
    tail: str
    tokens: int = 0


class Transcript:
    """Messages of one episode with cached token counts. ``block_text(ref)`` renders an evidence block's body."""

    def __init__(self, counter: TokenCounter, block_text: Callable[[str], str]) -> None:
        self._counter = counter
        self._block_text = block_text
        self._messages: list[_Message] = []

    def _content(self, m: _Message) -> str:
        return m.head + (self._block_text(m.ref) if m.ref else "") + m.tail

    def cost(self, role: str, content: str) -> int:
        """Tokens a message with this content occupies in the live context (content + template overhead)."""
        return self._counter.count(content) + TEMPLATE_OVERHEAD[role]

    def append(self, role: str, head: str, *, ref: str | None = None, tail: str = "", tokens: int | None = None) -> int:
        """Add a message (``head`` + block ``ref``'s body + ``tail``); return the context tokens it occupies.
        ``tokens``: its `cost`, when the caller has just measured it (saves re-counting)."""
        m = _Message(role, head, ref, tail)
        m.tokens = tokens if tokens is not None else self.cost(role, self._content(m))
        self._messages.append(m)
        return m.tokens

    def live(self) -> int:
        """Tokens of every live message, overhead included."""
        return sum(m.tokens for m in self._messages)

    def prompt(self) -> int:
        """The prompt the next completion would see: live messages + the generation prompt."""
        return self.live() + GENERATION_PROMPT_TOKENS

    def delta_if(self, ref: str, body: str) -> int:
        """How many tokens the context would change by if block ``ref``'s body became ``body``."""
        delta = 0
        for m in self._messages:
            if m.ref == ref:
                delta += self.cost(m.role, m.head + body + m.tail) - m.tokens
        return delta

    def rerender(self, ref: str) -> int:
        """Re-render the messages that show block ``ref`` (after its state changed); return the token delta."""
        delta = 0
        for m in self._messages:
            if m.ref == ref:
                new = self.cost(m.role, self._content(m))
                delta += new - m.tokens
                m.tokens = new
        return delta

    def messages(self) -> list[dict]:
        """The chat messages (``role`` / ``content``), rendered with the blocks' current states."""
        return [{"role": m.role, "content": self._content(m)} for m in self._messages]

    def __len__(self) -> int:
        return len(self._messages)
