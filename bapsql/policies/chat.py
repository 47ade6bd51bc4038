"""Chat rendering with a model folder's own template, and token-in/token-out conversation records.

Contract:

- `ChatTemplate.from_dir(folder)` reads the folder's ``chat_template`` (``chat_template.jinja`` or
  ``tokenizer_config.json``) and ``tokenizer.json``, and renders ``messages`` (+ ``tools`` JSON schemas,
  ``add_generation_prompt``) in a jinja2 ``ImmutableSandboxedEnvironment`` configured as ``transformers`` configures
  it (trim_blocks, lstrip_blocks, ``tojson``, ``raise_exception``, ``strftime_now``, ``namespace``, ``dict``,
  ``{% generation %}``, loop controls), so any Qwen-style model folder renders exactly as ``apply_chat_template``.
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

import json
from dataclasses import dataclass
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import Any, Sequence

from bapsql.errors import ChatTemplateError, ConfigError, EngineError

_MARK = "@@bapsql-assistant-content@@"  # probe content: locates where the template closes an assistant message
_PROBE_PREFIX = ({"role": "system", "content": "@@bapsql-system@@"}, {"role": "user", "content": "@@bapsql-user@@"})
_SPECIAL_KEYS = ("bos_token", "eos_token", "unk_token", "pad_token")


def _plain(value: Any) -> Any:
    """A copy of ``value`` made of plain JSON-like types only (what the sandboxed template may see)."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, str):  # subclasses (enums, numpy scalars) back to the base type
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    return str(value)


def _token_content(value: Any) -> str | None:
    """A special-token entry of tokenizer_config.json: a string, an AddedToken dict, or null."""
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def _environment():
    """The jinja2 environment transformers renders chat templates in (same filters, globals and extensions)."""
    import jinja2
    import jinja2.ext
    from jinja2 import nodes
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(jinja2.ext.Extension):
        """``{% generation %}...{% endgeneration %}`` renders its body (assistant-mask tracking is not needed)."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(lineno)

        def _render(self, caller):
            return caller()

    class Namespace(jinja2.utils.Namespace):
        def __init__(*args, **kwargs):  # same signature trick as jinja2's Namespace
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                Namespace._check(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            Namespace._check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check(name):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(f"chat templates cannot set {name!r} on a namespace")

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    env.globals["dict"] = lambda *a, **k: dict(*a, **k)
    env.globals["namespace"] = Namespace
    return env


class ChatTemplate:
    """A model folder's chat template and tokenizer: renders conversations to text and token ids.

    ``templates`` maps template names to Jinja source (a plain ``chat_template`` string is named ``default``);
    ``tokenizer`` is a `tokenizers.Tokenizer`; ``special_tokens`` are passed to the template (``eos_token``, ...).
    """

    def __init__(self, templates: dict[str, str], tokenizer: Any, special_tokens: dict[str, Any], name: str = ""):
        if not templates:
            raise ConfigError(f"{name or 'chat template'}: no chat_template given")
        self.templates = dict(templates)
        self.tokenizer = tokenizer
        self.special_tokens = {k: v for k, v in special_tokens.items() if v is not None}
        self.name = name
        self._compiled: dict[str, Any] = {}
        eos = self.special_tokens.get("eos_token")
        self.eos_token_id: int | None = tokenizer.token_to_id(eos) if eos else None

    @classmethod
    def from_dir(cls, folder: str | Path) -> "ChatTemplate":
        """Load ``folder``'s ``tokenizer.json`` and chat template (``chat_template.jinja`` wins over the config's)."""
        from tokenizers import Tokenizer

        root = Path(folder)
        if not (root / "tokenizer.json").is_file():
            raise ConfigError(f"{root}: no tokenizer.json; pass a model or tokenizer folder")
        config: dict = {}
        if (root / "tokenizer_config.json").is_file():
            try:
                config = json.loads((root / "tokenizer_config.json").read_text(encoding="utf-8"))
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{root / 'tokenizer_config.json'}: not valid JSON: {exc}") from exc
        raw = config.get("chat_template")
        if (root / "chat_template.jinja").is_file():
            raw = (root / "chat_template.jinja").read_text(encoding="utf-8")
        if isinstance(raw, list):
            templates = {t["name"]: t["template"] for t in raw}
        elif isinstance(raw, str):
            templates = {"default": raw}
        else:
            raise ConfigError(f"{root}: no chat_template in tokenizer_config.json or chat_template.jinja")
        special: dict[str, Any] = {k: _token_content(config.get(k)) for k in _SPECIAL_KEYS}
        extra = [_token_content(t) for t in config.get("additional_special_tokens") or []]
        if extra:
            special["additional_special_tokens"] = extra
        return cls(templates, Tokenizer.from_file(str(root / "tokenizer.json")), special, name=str(root))

    # ----------------------------------------------------------------------------------------------- rendering
    def _template(self, tools: Sequence[dict] | None, template_name: str | None):
        if template_name is not None:
            name = template_name
        elif tools is not None and "tool_use" in self.templates:
            name = "tool_use"
        elif "default" in self.templates:
            name = "default"
        elif len(self.templates) == 1:
            name = next(iter(self.templates))
        else:
            raise ChatTemplateError(f"{self.name}: several chat templates {sorted(self.templates)}; name one")
        if name not in self.templates:
            raise ChatTemplateError(f"{self.name}: no chat template named {name!r}; have {sorted(self.templates)}")
        if name not in self._compiled:
            import jinja2

            try:
                self._compiled[name] = _environment().from_string(self.templates[name])
            except jinja2.TemplateError as exc:
                raise ChatTemplateError(f"{self.name}: chat template {name!r} does not compile: {exc}") from exc
        return self._compiled[name]

    def render(self, messages: Sequence[dict], *, tools: Sequence[dict] | None = None,
               add_generation_prompt: bool = False, template_name: str | None = None, **kwargs: Any) -> str:
        """Render ``messages`` (role/content dicts; assistant ``tool_calls``; ``tool`` messages) to the prompt text."""
        import jinja2

        template = self._template(tools, template_name)
        context = {**self.special_tokens, **kwargs}
        try:
            return template.render(messages=_plain(list(messages)), tools=_plain(list(tools)) if tools is not None
                                   else None, documents=None, add_generation_prompt=add_generation_prompt,
                                   **_plain(context))
        except jinja2.TemplateError as exc:
            raise ChatTemplateError(f"{self.name}: chat template failed: {exc}") from exc

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (special-token strings in it map to their ids; nothing is added)."""
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids`` with special tokens kept (the inverse of `encode` on rendered prompts)."""
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    def apply(self, messages: Sequence[dict], *, tools: Sequence[dict] | None = None,
              add_generation_prompt: bool = False, **kwargs: Any) -> list[int]:
        """``encode(render(...))``: the token ids ``apply_chat_template(..., tokenize=True)`` gives."""
        return self.encode(self.render(messages, tools=tools, add_generation_prompt=add_generation_prompt, **kwargs))

    def continuation(self, messages: Sequence[dict], *, tools: Sequence[dict] | None = None, **kwargs: Any) -> str:
        """The text the template puts after an assistant message's content when ``messages`` (tool/user turns)
        follow it, through the generation prompt. For Qwen2.5 and one tool message ``R``::

            <|im_end|>\\n<|im_start|>user\\n<tool_response>\\nR\\n</tool_response><|im_end|>\\n<|im_start|>assistant\\n

        Rendered on a fixed probe conversation, so no past turn of a real conversation is ever re-templated;
        ``tools`` and ``kwargs`` (e.g. ``enable_thinking``) should be those the conversation is rendered with."""
        probe = [*_PROBE_PREFIX, {"role": "assistant", "content": _MARK}, *messages]
        text = self.render(probe, tools=tools, add_generation_prompt=True, **kwargs)
        if text.count(_MARK) != 1:
            raise ChatTemplateError(f"{self.name}: the template does not render assistant content verbatim, so "
                                    "observations cannot be appended token-in/token-out")
        return text[text.index(_MARK) + len(_MARK):]

    @cached_property
    def added_tokens(self) -> dict[int, str]:
        """Ids → content of the tokenizer's added tokens (special tokens and tool tags)."""
        return {i: t.content for i, t in self.tokenizer.get_added_tokens_decoder().items()}


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

        When the completion ended with a stop token that the template's closing text starts with (``<|im_end|>``),
        that token is not repeated; otherwise (a length-capped completion) the closing text is appended in full.
        Returns the appended ids."""
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
