"""The live transcript of an episode and its token accounting (the context channel is measured here).

The live context is the token count, with the policy's tokenizer, of every message still in the transcript plus the
per-message overhead its chat template adds (`bapsql.models.framing.ChatFraming`, ``counter.framing``: measured from
the policy's template, so it equals what the rendered prompt the agent feeds the engine costs). For Qwen2.5's ChatML:

- system / user / assistant: ``<|im_start|>{role}\\n`` + content + ``<|im_end|>\\n`` → 5 tokens of overhead;
- tool observations are sent as a user turn wrapped in ``<tool_response>\\n ... \\n</tool_response>`` → 9;
- the prompt for the next completion adds the generation prompt ``<|im_start|>assistant\\n`` → 3.

So ``prompt() = live() + generation_prompt_tokens``. An assistant message is charged as the token stream holds it (the
generation prompt it was sampled after, its content, the closing). Messages that show an evidence block hold a
*reference* to it, so archiving, compressing, discarding or restoring the block re-renders that message in place (the
context goes down or up) — the environment reports ``context_rewritten`` when that happens, the agent renders the
whole conversation afresh, and past assistant messages are charged from then on as a fresh rendering shows them
(``framing.past_assistant_overhead``: the same for most templates, less for Qwen3's dropped think blocks).

Untrusted text never becomes a control token: the content of every system, user and tool message (the question,
database values and column names, everything the environment shows) is escaped with the counter's ``neutralize``
(`bapsql.models.untrusted`) before it is counted and before `messages` hands it to the agent's chat template, so a
``<|im_start|>system`` in a question or a row stays plain text. Assistant messages (the policy's own) are not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from bapsql.models.framing import DEFAULT_FRAMING, ChatFraming
from bapsql.models.untrusted import DEFAULT as DEFAULT_NEUTRALIZER
from bapsql.tokens import TokenCounter


def framing_of(counter: TokenCounter) -> ChatFraming:
    """The counter's chat framing (`DEFAULT_FRAMING` for a counter that carries none)."""
    framing = getattr(counter, "framing", None)
    return framing if isinstance(framing, ChatFraming) else DEFAULT_FRAMING


@dataclass
class _Message:
    role: str
    head: str
    ref: str | None
    tail: str
    tokens: int = 0
    streamed: bool = False  # an assistant turn charged as sampled, not yet as a fresh rendering shows it


class Transcript:
    """Messages of one episode with cached token counts. ``block_text(ref)`` renders an evidence block's body."""

    def __init__(self, counter: TokenCounter, block_text: Callable[[str], str],
                 framing: ChatFraming | None = None) -> None:
        self._counter = counter
        self._neutralize = getattr(counter, "neutralize", None) or DEFAULT_NEUTRALIZER  # untrusted text: escaped
        self._block_text = block_text
        self.framing = framing if framing is not None else framing_of(counter)
        self._messages: list[_Message] = []
        self._wraps: dict[str, tuple[str, str, int]] = {}

    @property
    def generation_prompt_tokens(self) -> int:
        """Tokens the generation prompt adds to the live messages (the prompt of the next completion)."""
        return self.framing.generation_prompt_tokens

    @property
    def trailer_tokens(self) -> int:
        """Tokens that close a completion in the live context (its end-of-turn token and what follows it)."""
        return self.framing.trailer_tokens

    def _content(self, m: _Message) -> str:
        text = m.head + (self._block_text(m.ref) if m.ref else "") + m.tail
        return text if m.role == "assistant" else self._neutralize(text)

    def _wrap(self, role: str) -> tuple[str, str, int] | None:
        """(prefix, suffix, correction) of a role whose content is counted between its template texts."""
        if role not in self._wraps:
            f = self.framing
            prefix, suffix = f.role_prefix.get(role), f.role_suffix.get(role)
            if role == "assistant" or prefix is None or suffix is None:
                return None
            count = self._counter.count
            self._wraps[role] = (prefix, suffix, f.cost(role, 0) - count(prefix) - count(suffix))
        return self._wraps[role]

    def cost(self, role: str, content: str) -> int:
        """Tokens a message with this content occupies in the live context (content + template overhead).

        System, user and tool contents are counted between the template's texts around them (``role_prefix`` +
        content + ``role_suffix``, minus those texts' own tokens): a tokenizer may merge a content's last character
        with the newline after it (Qwen's ``...\\n</tool_response>``), and the rendered prompt holds the merged
        token. An assistant content is counted alone: the model sampled it as its own tokens."""
        if role != "assistant":
            content = self._neutralize(content)  # as `messages` will show it (idempotent)
        wrap = self._wrap(role)
        if wrap is None:
            return self.framing.cost(role, self._counter.count(content))
        prefix, suffix, correction = wrap
        return self._counter.count(prefix + content + suffix) + correction

    def append(self, role: str, head: str, *, ref: str | None = None, tail: str = "", tokens: int | None = None) -> int:
        """Add a message (``head`` + block ``ref``'s body + ``tail``); return the context tokens it occupies.
        ``tokens``: its `cost`, when the caller has just measured it (saves re-counting)."""
        m = _Message(role, head, ref, tail, streamed=role == "assistant")
        m.tokens = tokens if tokens is not None else self.cost(role, self._content(m))
        self._messages.append(m)
        return m.tokens

    def live(self) -> int:
        """Tokens of every live message, overhead included."""
        return sum(m.tokens for m in self._messages)

    def prompt(self) -> int:
        """The prompt the next completion would see: live messages + the generation prompt."""
        return self.live() + self.framing.generation_prompt_tokens

    def _fresh_delta(self) -> int:
        """Tokens a fresh rendering of the conversation changes the streamed assistant turns by."""
        per_turn = self.framing.past_assistant_overhead - self.framing.overhead["assistant"]
        return per_turn * sum(m.streamed for m in self._messages) if per_turn else 0

    def delta_if(self, ref: str, body: str) -> int:
        """How many tokens the context would change by if block ``ref``'s body became ``body`` (the conversation is
        then rendered afresh: see the module docstring)."""
        delta = self._fresh_delta()
        for m in self._messages:
            if m.ref == ref:
                delta += self.cost(m.role, m.head + body + m.tail) - m.tokens
        return delta

    def rerender(self, ref: str) -> int:
        """Re-render the messages that show block ``ref`` (after its state changed) and charge past assistant turns
        as a fresh rendering shows them; return the token delta."""
        delta = 0
        for m in self._messages:
            if m.ref == ref:
                new = self.cost(m.role, self._content(m))
                delta += new - m.tokens
                m.tokens = new
            if m.streamed:
                new = m.tokens + self.framing.past_assistant_overhead - self.framing.overhead["assistant"]
                delta += new - m.tokens
                m.tokens, m.streamed = new, False
        return delta

    def messages(self) -> list[dict]:
        """The chat messages (``role`` / ``content``), rendered with the blocks' current states."""
        return [{"role": m.role, "content": self._content(m)} for m in self._messages]

    def __len__(self) -> int:
        return len(self._messages)
