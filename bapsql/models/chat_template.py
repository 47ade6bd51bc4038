"""A model folder's chat template, rendered exactly as ``transformers`` renders it, and its tokenizer.

Contract:

- `ChatTemplate.from_dir(folder)` reads the folder's ``chat_template`` (``chat_template.jinja`` or
  ``tokenizer_config.json``), ``tokenizer.json`` and, when present, ``generation_config.json``'s eos ids, and renders
  ``messages`` (+ ``tools`` JSON schemas, ``add_generation_prompt``) in a jinja2 ``ImmutableSandboxedEnvironment``
  configured as ``transformers`` configures it (trim_blocks, lstrip_blocks, ``tojson``, ``raise_exception``,
  ``strftime_now``, ``namespace``, ``dict``, ``{% generation %}``, loop controls), so any model folder renders
  exactly as ``apply_chat_template``.
- `ChatTemplate.continuation` is the text the template appends after an assistant message's content for the messages
  that follow it (token-in/token-out conversations append it instead of re-templating past turns:
  `bapsql.policies.chat.Segment`).
- `ChatTemplate.framing` is the `bapsql.models.framing.ChatFraming` measured from the template (per-role overheads,
  generation prompt, end-of-turn tokens), cached per set of template options.

Every template failure is a `ChatTemplateError` naming the folder; a folder without a tokenizer or template is a
`ConfigError`. jinja2 and tokenizers load only when a template is used.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from bapsql.errors import ChatTemplateError, ConfigError

if TYPE_CHECKING:  # pragma: no cover
    from bapsql.models.framing import ChatFraming

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

    def __init__(self, templates: dict[str, str], tokenizer: Any, special_tokens: dict[str, Any], name: str = "",
                 eos_token_ids: Sequence[int] = ()):
        if not templates:
            raise ConfigError(f"{name or 'chat template'}: no chat_template given")
        self.templates = dict(templates)
        self.tokenizer = tokenizer
        self.special_tokens = {k: v for k, v in special_tokens.items() if v is not None}
        self.name = name
        self._compiled: dict[str, Any] = {}
        self._framings: dict[str, "ChatFraming"] = {}
        eos = self.special_tokens.get("eos_token")
        self.eos_token_id: int | None = tokenizer.token_to_id(eos) if eos else None
        ids = ([self.eos_token_id] if self.eos_token_id is not None else []) + [int(i) for i in eos_token_ids]
        self.eos_token_ids: tuple[int, ...] = tuple(dict.fromkeys(ids))  # tokenizer eos first, then the model's

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
        return cls(templates, Tokenizer.from_file(str(root / "tokenizer.json")), special, name=str(root),
                   eos_token_ids=_generation_eos_ids(root))

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

    @cached_property
    def special_added_tokens(self) -> dict[int, str]:
        """Ids → content of the added tokens flagged ``special`` (control tokens such as an end of turn)."""
        return {i: t.content for i, t in self.tokenizer.get_added_tokens_decoder().items() if t.special}

    def framing(self, **kwargs: Any) -> "ChatFraming":
        """The `ChatFraming` measured from this template under the template options ``kwargs`` (e.g.
        ``enable_thinking=False``); measured once per set of options (`bapsql.models.framing.measure_framing`)."""
        key = json.dumps(_plain(kwargs), sort_keys=True)
        if key not in self._framings:
            from bapsql.models.framing import measure_framing

            self._framings[key] = measure_framing(self, **kwargs)
        return self._framings[key]


def _generation_eos_ids(root: Path) -> tuple[int, ...]:
    """``generation_config.json``'s ``eos_token_id`` (an id or a list of ids) of model folder ``root``; () if none."""
    path = root / "generation_config.json"
    if not path.is_file():
        return ()
    try:
        eos = json.loads(path.read_text(encoding="utf-8")).get("eos_token_id")
    except (json.JSONDecodeError, AttributeError) as exc:
        raise ConfigError(f"{path}: not a JSON object: {exc}") from exc
    ids = eos if isinstance(eos, list) else [eos]
    return tuple(int(i) for i in ids if isinstance(i, int) and not isinstance(i, bool))
