"""What a chat template adds around messages, measured from the template itself (no model family is assumed).

The environment charges the live context (DESIGN §3) as ``sum(tokens(content) + overhead[role])`` over the messages
still in the transcript, plus the generation prompt; the agent feeds the engine the conversation rendered with the
policy's own chat template, token-in/token-out (`bapsql.policies.chat.Segment`: the first prompt rendered once, each
completion appended as sampled, each observation appended as the template's continuation). A `ChatFraming` holds the
numbers that make the two agree, and the texts that let a rendered prompt be read back into messages.

How `measure_framing(template, **template_kwargs)` measures them. Every probe renders a small conversation whose
contents are short letter-only phrases (``"Alpha system probe"``, ...): a byte-level BPE never merges a letter run
with the newline or special token a template puts next to it, so the content's own tokens are the same inside the
rendering as alone, and every difference is the template's.

- ``overhead["system"]``: tokens of ``[system]`` rendered alone minus the content's tokens. The system message is
  always the conversation's first, so this includes what the template adds once per conversation (a BOS token).
  A template that refuses a conversation without a user query (Qwen3.5 raises ``No user query found in
  messages.``) is measured from ``[system, user]`` less its user turn, whose text is a second user message's
  (``[system, user, user]`` minus ``[system, user]``): no probe then renders a conversation the template refuses.
- ``overhead["user"]``: ``[system, user]`` minus ``[system]`` minus the content's tokens.
- ``generation_prompt_tokens``: ``[system, user]`` with ``add_generation_prompt=True`` minus without (3 for ChatML's
  ``<|im_start|>assistant\\n``; 7 for Qwen3 with ``enable_thinking: false``, whose generation prompt carries an empty
  think block).
- ``trailer_tokens``: the tokens of the text the template puts right after an assistant message's content (ChatML's
  ``<|im_end|>\\n`` = 2; Llama 3's ``<|eot_id|>`` = 1): what closes a completion in the live context.
- ``overhead["assistant"]`` = ``generation_prompt_tokens + trailer_tokens``: in the token stream an assistant turn is
  the generation prompt it was sampled after, its content, and the closing (for Qwen3 the empty think block is part
  of every past turn, as the model saw it).
- ``past_assistant_overhead``: what a past assistant turn costs when the whole conversation is rendered afresh (the
  agent does after ``context_rewritten``): ``[system, user, assistant, tool]`` rendered with the generation prompt
  minus the token stream of the same turns, plus ``overhead["assistant"]``. Equal to it for prefix-stable templates;
  4 less for Qwen3 with thinking off, whose past turns lose the empty think block in a fresh rendering.
- ``overhead["tool"]``: the template's continuation after an assistant message for one tool message (closing, the
  tool turn, the next generation prompt: `ChatTemplate.continuation`, exactly what the agent appends) minus the
  closing, the generation prompt and the content's tokens (9 for Qwen2.5's ``<tool_response>`` user turn, 5 for
  SmolLM2's plain ``tool`` turn).
- ``end_of_turn_text`` / ``end_of_turn_ids``: the first special token of the closing text (``<|im_end|>``,
  ``<|eot_id|>``) — what SFT targets end with — and, after it, the tokenizer's and ``generation_config.json``'s eos
  ids: what a model may sample to end its turn, so what `bapsql.rollout.agent.completion_text` strips.
- ``role_prefix`` / ``role_suffix`` / ``generation_prompt`` / ``conversation_prefix``: the texts around each role's
  content (the system prefix without what is rendered once per conversation, found by rendering a second system
  message; the assistant prefix of a past turn in a fresh rendering — a streamed turn starts with the generation
  prompt instead), for reading a rendered prompt back into messages (`bapsql.rollout.engines.openai_chat.messages_of`).

Errors: a template that cannot render a role the environment uses (it raises on ``tool``, or drops a message's
content) is a `ChatTemplateError` naming the role and what to do. `DEFAULT_FRAMING` (Qwen2.5 ChatML, tool results as
user ``<tool_response>`` turns: 5 / 5 / 5 / 9, generation prompt 3, trailer 2) serves counters that know no template
(`bapsql.tokens.RegexTokenCounter`).

The environment counts a system, user or tool content between its ``role_prefix`` and ``role_suffix`` (so a BPE that
joins a content's last punctuation to the newline after it is charged as rendered: `bapsql.env.transcript`). What it
cannot see is a template that rewrites contents (Llama 3 and Qwen3 ``trim`` them): a content with leading or trailing
whitespace would be charged for whitespace the prompt does not hold; the environment's messages have none.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bapsql.errors import ChatTemplateError

if TYPE_CHECKING:  # pragma: no cover
    from bapsql.models.chat_template import ChatTemplate

ROLES: tuple[str, ...] = ("system", "user", "assistant", "tool")
PROBES: dict[str, str] = {"system": "Alpha system probe", "user": "Bravo user probe",
                          "assistant": "Charlie assistant probe", "tool": "Delta tool probe"}
_SECOND_SYSTEM = "Echo system probe"
_SECOND_USER = "Foxtrot user probe"


@dataclass(frozen=True)
class ChatFraming:
    """The framing of one chat template under one set of template options (see the module docstring).

    ``overhead``: role → tokens the template adds around one message of that role, as charged in the live context.
    ``generation_prompt_tokens`` / ``trailer_tokens``: the prompt for the next completion / the closing after it.
    ``end_of_turn_text``: the token text that ends an assistant turn (SFT targets end with it); ``end_of_turn_ids``:
    every id that ends a sampled turn (empty when no tokenizer is known); ``end_of_turn_texts``: their texts.
    ``role_prefix`` / ``role_suffix``: role → the text before / after its content; ``generation_prompt``: the text
    ``add_generation_prompt`` adds; ``conversation_prefix``: text rendered once before the first message.
    ``past_assistant_overhead``: an assistant turn's overhead once the conversation is rendered afresh (None: the
    same as ``overhead["assistant"]``). ``template``: where it was measured (a folder) or ``"default"``."""

    overhead: dict[str, int]
    generation_prompt_tokens: int
    trailer_tokens: int
    end_of_turn_text: str
    end_of_turn_ids: tuple[int, ...] = ()
    end_of_turn_texts: tuple[str, ...] = ()
    role_prefix: dict[str, str] = field(default_factory=dict)
    role_suffix: dict[str, str] = field(default_factory=dict)
    generation_prompt: str = ""
    conversation_prefix: str = ""
    past_assistant_overhead: int | None = None
    template: str = "default"

    def __post_init__(self) -> None:
        missing = [r for r in ROLES if r not in self.overhead]
        if missing:
            raise ChatTemplateError(f"framing of {self.template}: no overhead for roles {missing}")
        if not self.end_of_turn_texts:
            object.__setattr__(self, "end_of_turn_texts", (self.end_of_turn_text,))
        if self.past_assistant_overhead is None:
            object.__setattr__(self, "past_assistant_overhead", self.overhead["assistant"])

    @classmethod
    def default(cls) -> "ChatFraming":
        """Qwen2.5 ChatML, the framing used when no chat template is known (see `DEFAULT_FRAMING`)."""
        start, end = "<|im_start|>", "<|im_end|>\n"
        prefix = {r: f"{start}{r}\n" for r in ("system", "user", "assistant")}
        suffix = {r: end for r in ("system", "user", "assistant")}
        return cls(overhead={"system": 5, "user": 5, "assistant": 5, "tool": 9}, generation_prompt_tokens=3,
                   trailer_tokens=2, end_of_turn_text="<|im_end|>", end_of_turn_texts=("<|im_end|>", "<|endoftext|>"),
                   role_prefix={**prefix, "tool": f"{start}user\n<tool_response>\n"},
                   role_suffix={**suffix, "tool": f"\n</tool_response>{end}"},
                   generation_prompt=f"{start}assistant\n", template="default")

    def charges_like(self, other: "ChatFraming") -> bool:
        """Whether ``other`` charges the live context the same way (same overheads, generation prompt, trailer, and
        the same texts around the contents the environment counts in place)."""
        return (self.overhead == other.overhead and self.generation_prompt_tokens == other.generation_prompt_tokens
                and self.trailer_tokens == other.trailer_tokens
                and self.past_assistant_overhead == other.past_assistant_overhead
                and self.role_prefix == other.role_prefix and self.role_suffix == other.role_suffix)

    def describe(self) -> str:
        """The charged numbers in one line (for error messages)."""
        return (f"overheads {self.overhead}, generation prompt {self.generation_prompt_tokens}, trailer "
                f"{self.trailer_tokens}, past assistant turns {self.past_assistant_overhead}")

    def cost(self, role: str, content_tokens: int) -> int:
        """Live-context tokens of one ``role`` message whose content has ``content_tokens`` tokens."""
        try:
            return content_tokens + self.overhead[role]
        except KeyError:
            raise ChatTemplateError(f"no template overhead for role {role!r}; the environment uses {ROLES}") from None


DEFAULT_FRAMING = ChatFraming.default()


def _split(text: str, content: str, role: str, name: str) -> tuple[str, str]:
    """(text before, text after) ``content``, which must occur exactly once in ``text``."""
    if text.count(content) != 1:
        raise ChatTemplateError(f"{name}: the chat template does not render a {role!r} message's content verbatim "
                                f"(probe {content!r} in {text!r}); the environment counts message contents as sent, "
                                "so use a template that renders them unchanged")
    i = text.index(content)
    return text[:i], text[i + len(content):]


def _after(longer: str, shorter: str, what: str, name: str) -> str:
    """``longer`` minus its prefix ``shorter`` (the template must render the shorter conversation as a prefix)."""
    if not longer.startswith(shorter):
        raise ChatTemplateError(f"{name}: the chat template renders earlier messages differently once {what} "
                                "follows, so a conversation cannot be charged message by message")
    return longer[len(shorter):]


def _end_of_turn(template: "ChatTemplate", closing: str) -> tuple[str, tuple[int, ...], tuple[str, ...]]:
    """The first special token of ``closing`` (else the tokenizer's eos), then every id that ends a sampled turn."""
    found = [(closing.index(tok), tok) for tok in template.special_added_tokens.values() if tok and tok in closing]
    if found:
        text = min(found, key=lambda p: (p[0], -len(p[1])))[1]
    elif template.eos_token_id is not None:
        text = template.added_tokens.get(template.eos_token_id) or template.decode([template.eos_token_id])
    else:
        raise ChatTemplateError(f"{template.name}: the chat template closes an assistant turn with {closing!r}, which "
                                "holds no special token, and the tokenizer names no eos_token; set eos_token in "
                                "tokenizer_config.json")
    first = template.encode(text)
    ids = tuple(dict.fromkeys([*(first if len(first) == 1 else []), *template.eos_token_ids]))
    texts = tuple(dict.fromkeys([text, *(template.decode([i]) for i in ids)]))
    return text, ids, texts


def _system_alone(render: Any, msg: dict[str, dict], name: str) -> str:
    """The rendering of the system probe alone; for a template that refuses a conversation without a user query
    (Qwen3.5: ``No user query found in messages.``), the rendering of ``[system, user]`` less the text of its user
    turn, measured as a second user message's (``[system, user, user]`` minus ``[system, user]``)."""
    try:
        return render([msg["system"]], "system")
    except ChatTemplateError as alone:
        try:
            r_su = render([msg["system"], msg["user"]], "user")
            second = render([msg["system"], msg["user"], {"role": "user", "content": _SECOND_USER}], "user")
        except ChatTemplateError:
            raise alone from None
        pre, suf = _split(_after(second, r_su, "a second user message", name), _SECOND_USER, "user", name)
        turn = pre + PROBES["user"] + suf
        if not r_su.endswith(turn):
            raise ChatTemplateError(f"{name}: the chat template renders no system message without a user message "
                                    f"({alone}), and its first user turn is not framed as a later one "
                                    f"({turn!r} does not end {r_su!r}); the system message cannot be charged on "
                                    "its own") from alone
        return r_su[: len(r_su) - len(turn)]


def measure_framing(template: "ChatTemplate", **template_kwargs: Any) -> ChatFraming:
    """Measure the `ChatFraming` of ``template`` rendered with ``template_kwargs`` (see the module docstring).
    Prefer `ChatTemplate.framing`, which caches the result per set of options."""
    name = template.name or "chat template"
    msg = {r: {"role": r, "content": c} for r, c in PROBES.items()}

    def render(messages: list[dict], role: str, gen: bool = False) -> str:
        try:
            return template.render(messages, add_generation_prompt=gen, **template_kwargs)
        except ChatTemplateError as exc:
            raise ChatTemplateError(
                f"{name}: the chat template cannot render a {role!r} message ({exc}); the environment sends "
                f"{', '.join(ROLES)} messages (every observation is a 'tool' message) — use a model folder whose "
                "template renders them, or put a chat_template.jinja that does in the folder") from exc

    def n(text: str) -> int:
        return len(template.encode(text))

    r_s = _system_alone(render, msg, name)
    s_pre, s_suf = _split(r_s, PROBES["system"], "system", name)
    r_su = render([msg["system"], msg["user"]], "user")
    u_pre, u_suf = _split(_after(r_su, r_s, "a user message", name), PROBES["user"], "user", name)
    gen_text = _after(render([msg["system"], msg["user"]], "assistant", gen=True), r_su, "the generation prompt",
                      name)
    r_sua = render([msg["system"], msg["user"], msg["assistant"]], "assistant")
    _, closing = _split(_after(r_sua, r_su, "an assistant message", name), PROBES["assistant"], "assistant", name)
    try:
        cont = template.continuation([msg["tool"]], **template_kwargs)
    except ChatTemplateError as exc:
        raise ChatTemplateError(
            f"{name}: the chat template cannot render a 'tool' message after an assistant turn ({exc}); every "
            "observation of the environment is a tool message — use a model folder whose template renders role "
            "'tool' (as its own turn or wrapped in a user turn), or put a chat_template.jinja that does in the "
            "folder") from exc
    if not cont.startswith(closing) or not cont.endswith(gen_text):
        raise ChatTemplateError(f"{name}: after an assistant message followed by a tool message the template renders "
                                f"{cont!r}, which does not start with the closing {closing!r} or does not end with the "
                                f"generation prompt {gen_text!r}; this template cannot be charged message by message")
    t_pre, t_suf = _split(cont[len(closing):len(cont) - len(gen_text)], PROBES["tool"], "tool", name)

    conversation, sys_prefix = "", s_pre
    try:  # a second system message shows the system prefix without what is rendered once per conversation
        second = render([msg["system"], {"role": "system", "content": _SECOND_SYSTEM}], "system")
        p2, _ = _split(_after(second, r_s, "a second system message", name), _SECOND_SYSTEM, "system", name)
        if p2 and s_pre.endswith(p2):
            conversation, sys_prefix = s_pre[: len(s_pre) - len(p2)], p2
    except ChatTemplateError:
        pass  # templates that allow one system message only: the system prefix keeps the conversation's start

    gen = len(template.apply([msg["system"], msg["user"]], add_generation_prompt=True, **template_kwargs)) - n(r_su)
    trailer = n(closing)
    text, ids, texts = _end_of_turn(template, closing)
    overhead = {"system": n(r_s) - n(PROBES["system"]), "user": n(r_su) - n(r_s) - n(PROBES["user"]),
                "assistant": gen + trailer, "tool": n(cont) - trailer - gen - n(PROBES["tool"])}
    turns = [msg["system"], msg["user"], msg["assistant"], msg["tool"]]
    r_fresh = render(turns, "tool", gen=True)
    a_past, _ = _split(_after(r_fresh, r_su, "an assistant and a tool message", name), PROBES["assistant"],
                       "assistant", name)
    fresh = n(r_fresh)
    stream = n(r_su) + gen + n(PROBES["assistant"]) + n(cont)  # what the agent builds for the same turns
    return ChatFraming(overhead=overhead, generation_prompt_tokens=gen, trailer_tokens=trailer,
                       end_of_turn_text=text, end_of_turn_ids=ids, end_of_turn_texts=texts,
                       role_prefix={"system": sys_prefix, "user": u_pre, "assistant": a_past, "tool": t_pre},
                       role_suffix={"system": s_suf, "user": u_suf, "assistant": closing, "tool": t_suf},
                       generation_prompt=gen_text, conversation_prefix=conversation,
                       past_assistant_overhead=overhead["assistant"] + fresh - stream, template=name)
