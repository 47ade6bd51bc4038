"""Token-in/token-out conversation records, rendered with a model folder's own chat template
(`bapsql.models.chat_template.ChatTemplate`).

Contract:

- `Segment` accumulates one multi-turn conversation as ONE token sequence without re-templating past turns: the first
  prompt is rendered once; each completion is appended exactly as sampled (loss mask 1, its logprobs kept); each
  observation is appended as the template's text for just those messages (the assistant turn's closing tokens that
  were not sampled, the tool/user turn, the generation prompt; loss mask 0).
- `TokenTrajectory` is the list of segments of one episode: a new segment starts, from a fresh rendering of the
  conversation as the environment now shows it, when the environment reports ``context_rewritten`` (evidence
  management changed earlier messages, so the old token sequence is no longer a prefix of what the model sees).

Shapes: ``Segment.input_ids``, ``loss_mask`` and ``logprobs`` are parallel lists of length ``len(segment)``;
``loss_mask[i] == 1`` exactly where ``input_ids[i]`` was sampled by the policy; ``logprobs[i]`` is the sampling
logprob there and ``0.0`` elsewhere (``logprobs`` is ``None`` when some completion came without logprobs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

from bapsql.errors import ChatTemplateError, EngineError

if TYPE_CHECKING:  # pragma: no cover
    from bapsql.models.chat_template import ChatTemplate


@dataclass(frozen=True)
class TurnTokens:
    """One policy turn as the engine saw it: the prompt ids it was given and the ids it sampled (with logprobs)."""

    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    completion_logprobs: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if self.completion_logprobs is not None and len(self.completion_logprobs) != len(self.completion_ids):
            raise EngineError(f"the engine returned {len(self.completion_logprobs)} logprobs for "
                              f"{len(self.completion_ids)} completion ids")


class Segment:
    """One token sequence of a conversation, built without re-templating past turns (see the module docstring).

    Use: ``seg = Segment(template, messages, tools=tools)``; then alternately ``seg.add_completion(ids, logprobs)``
    (the engine sampled ``ids`` from ``seg.input_ids``) and ``seg.add_observation(new_messages)``.
    """

    def __init__(self, template: ChatTemplate, messages: Sequence[dict], *, tools: Sequence[dict] | None = None,
                 **template_kwargs: Any):
        self.template = template
        self.tools = None if tools is None else list(tools)
        self.template_kwargs = template_kwargs
        self.input_ids: list[int] = template.apply(messages, tools=self.tools, add_generation_prompt=True,
                                                   **template_kwargs)
        self.loss_mask: list[int] = [0] * len(self.input_ids)
        self._logprobs: list[float] | None = [0.0] * len(self.input_ids)
        self.turns: list[TurnTokens] = []
        self.prompt_len = len(self.input_ids)
        self._awaiting_completion = True
        self._last_sampled: int | None = None

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def logprobs(self) -> list[float] | None:
        """Per-token sampling logprobs (0.0 on template tokens), or ``None`` if any completion lacked them."""
        return self._logprobs

    @property
    def completion_tokens(self) -> int:
        """Number of policy (sampled) tokens in the segment."""
        return sum(self.loss_mask)

    @property
    def awaiting_completion(self) -> bool:
        """True when the sequence ends with a generation prompt (the engine samples next)."""
        return self._awaiting_completion

    def add_completion(self, completion_ids: Sequence[int],
                       completion_logprobs: Sequence[float] | None = None) -> TurnTokens:
        """Append the sampled ids exactly as sampled (mask 1). Returns the turn's `TurnTokens`."""
        if not self._awaiting_completion:
            raise ChatTemplateError("add_completion called twice without an observation in between")
        turn = TurnTokens(tuple(self.input_ids), tuple(int(i) for i in completion_ids),
                          None if completion_logprobs is None else tuple(float(x) for x in completion_logprobs))
        self.input_ids.extend(turn.completion_ids)
        self.loss_mask.extend([1] * len(turn.completion_ids))
        if self._logprobs is not None and turn.completion_logprobs is not None:
            self._logprobs.extend(turn.completion_logprobs)
        else:
            self._logprobs = None
        self.turns.append(turn)
        self._last_sampled = turn.completion_ids[-1] if turn.completion_ids else None
        self._awaiting_completion = False
        return turn

    def add_observation(self, messages: Sequence[dict]) -> list[int]:
        """Append the template's text for ``messages`` (tool and/or user turns) plus the generation prompt (mask 0).

        When the completion ended with a stop token that the template's closing text starts with (its end-of-turn
        token, e.g. ChatML's ``<|im_end|>`` or Llama 3's ``<|eot_id|>``), that token is not repeated; otherwise (a
        length-capped completion) the closing text is appended in full. Returns the appended ids."""
        if self._awaiting_completion:
            raise ChatTemplateError("add_observation called before the completion of the current turn")
        if not messages:
            raise ChatTemplateError("add_observation needs at least one message")
        text = self.template.continuation(messages, tools=self.tools, **self.template_kwargs)
        stop = self.template.added_tokens.get(self._last_sampled) if self._last_sampled is not None else None
        if stop is not None and text.startswith(stop):
            text = text[len(stop):]
        ids = self.template.encode(text)
        self.input_ids.extend(ids)
        self.loss_mask.extend([0] * len(ids))
        if self._logprobs is not None:
            self._logprobs.extend([0.0] * len(ids))
        self._awaiting_completion = True
        return ids


class TokenTrajectory:
    """The segments of one episode's conversation (usually one; a new one after each ``context_rewritten``)."""

    def __init__(self, template: ChatTemplate, messages: Sequence[dict], *, tools: Sequence[dict] | None = None,
                 **template_kwargs: Any):
        self.template = template
        self.tools = None if tools is None else list(tools)
        self.template_kwargs = template_kwargs
        self.segments: list[Segment] = [Segment(template, messages, tools=self.tools, **template_kwargs)]

    @property
    def current(self) -> Segment:
        return self.segments[-1]

    @property
    def prompt_ids(self) -> list[int]:
        """The ids to feed the engine for the next turn."""
        return list(self.current.input_ids)

    def add_completion(self, completion_ids: Sequence[int],
                       completion_logprobs: Sequence[float] | None = None) -> TurnTokens:
        return self.current.add_completion(completion_ids, completion_logprobs)

    def add_observation(self, new_messages: Sequence[dict], *, context_rewritten: bool = False,
                        conversation: Sequence[dict] | None = None) -> None:
        """Append ``new_messages``; or, when ``context_rewritten``, start a new segment rendered once from
        ``conversation`` (the full message list as the environment now shows it, ending with the new messages)."""
        if not context_rewritten:
            self.current.add_observation(new_messages)
            return
        if conversation is None:
            raise ChatTemplateError("context_rewritten needs the full rewritten conversation")
        if self.current.awaiting_completion:
            raise ChatTemplateError("add_observation called before the completion of the current turn")
        self.segments.append(Segment(self.template, conversation, tools=self.tools, **self.template_kwargs))

    @property
    def turns(self) -> list[TurnTokens]:
        return [t for s in self.segments for t in s.turns]
