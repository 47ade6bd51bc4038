"""The OpenAI-compatible chat-completions engine: hosted chat models, ``vllm serve`` of instruct models, gateways.

Contract (see `bapsql.rollout.engines.base`; messages in, text out):

- the caller's prompt ids are the conversation rendered with the chat template of ``tokenizer`` (any family: ChatML,
  Llama 3, ...; ending in its generation prompt, under any of the template options `TEMPLATE_OPTIONS`, e.g. Qwen3's
  empty think block), as `bapsql.rollout.agent.ModelAgent` renders it; `messages_of` recovers the messages from them
  with the per-role texts measured from that template (`bapsql.models.framing.ChatFraming`), and each prompt becomes
  one ``POST {base_url}/chat/completions`` with those messages — the server applies its own model's template, with
  the engine's ``chat_template_kwargs`` (sent as the body's ``chat_template_kwargs`` when set). Tool
  observations are sent as user messages (a chat API accepts role ``tool`` only as the answer to a native tool call,
  and none is declared). A prompt the template did not render raises `EngineError`.
- the completion is the model's own text (its tool-call text). When the server parsed a tool call itself
  (``message.tool_calls``, native function calling), the call is rendered back as the ``<tool_call>`` text the
  environment parses, so the seven actions come through either way. No ``tools`` are sent: the system prompt
  already describes them.
- completion ids are the text tokenized with the configured tokenizer (``tokenizer``, else the packaged one) plus
  the template's end-of-turn token (``<|im_end|>``, ``<|eot_id|>``, ...) when the model stopped; ``logprobs`` are
  ``None`` (a chat API returns none to train on).
  ``Generation.usage`` holds the server's ``usage`` numbers when it sent them; `token_sources` counts how many
  answers were accounted by the server's usage and how many by the tokenizer, and the first answer of each kind is
  logged (``bapsql.rollout.engines.openai_chat``), so a run's log says which.
- a 429 / 5xx answer, a timeout or a failed connection is retried ``max_retries`` times with exponential backoff
  (``retry_backoff_s * 2**attempt``, or the server's ``Retry-After``, at most 30 s), then raises
  `EngineUnavailable`; another 4xx raises `EngineError` at once. Each request times out after ``timeout_s``; at most
  ``max_num_seqs`` requests are in flight (the concurrency limit, whatever the number of calling threads). The API
  key is read from the environment variable named by ``api_key_env``.
- ``load_adapter`` / ``logprobs_of`` raise `EngineError` (a chat API has no training hooks and scores no given text).

Only the standard library is used (``urllib``).
"""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Sequence

from bapsql.env.actions import CLOSE_TAG, OPEN_TAG
from bapsql.errors import ChatTemplateError, ConfigError, EngineError, EngineUnavailable
from bapsql.models.framing import DEFAULT_FRAMING, ROLES, ChatFraming
from bapsql.rollout.engines.base import (AdapterRef, EngineConfig, Generation, SamplingParams, check_batch,
                                         cut_at_stop)
from bapsql.rollout.engines.codec import ModelCodec
from bapsql.rollout.engines.pooled import PooledRequests, json_headers

log = logging.getLogger(__name__)

TEMPLATE_OPTIONS: tuple[dict[str, Any], ...] = ({}, {"enable_thinking": False}, {"enable_thinking": True})
EMPTY_THINK = "<think>\n\n</think>\n\n"  # Qwen3-class templates' generation prompt ends in it with thinking off
MAX_WAIT_S = 30.0  # cap on one backoff wait (Retry-After included)
_FINISH = {"stop": "stop", "tool_calls": "stop", "function_call": "stop", "length": "length"}


class _HTTPStatus(EngineError):
    """A non-2xx answer (internal; callers see `EngineError` / `EngineUnavailable`)."""

    def __init__(self, status: int, body: str, retry_after: float | None = None):
        super().__init__(f"HTTP {status}: {body[:300]}")
        self.status, self.retry_after = status, retry_after


def messages_of(prompt_text: str, framing: ChatFraming | Sequence[ChatFraming] = DEFAULT_FRAMING) -> list[dict]:
    """The chat messages of a prompt rendered with a chat template (special tokens kept) that ends in its generation
    prompt. ``framing``: the template's `ChatFraming`, or several (one per template option set: the first names the
    per-role texts, any one's generation prompt may end the prompt). A generation prompt followed by an empty think
    block (`EMPTY_THINK`, Qwen3 with thinking off) is one too, whichever framing measured it; the block is not part
    of the assistant's text. `EngineError` when the text does not parse."""
    framings = [framing] if isinstance(framing, ChatFraming) else list(framing)
    base = framings[0]
    gens = {f.generation_prompt for f in framings if f.generation_prompt}
    gens = sorted(gens | {g + EMPTY_THINK for g in gens if not g.endswith(EMPTY_THINK)}, key=len, reverse=True)
    gen = next((g for g in gens if prompt_text.endswith(g)), None)
    if gen is None:
        raise EngineError(f"openai_chat: the prompt does not end in the generation prompt {base.generation_prompt!r} "
                          f"of the chat template ({base.template}); render it with the chat template of "
                          "engine.tokenizer")
    body = prompt_text[: len(prompt_text) - len(gen)]
    if base.conversation_prefix and body.startswith(base.conversation_prefix):
        body = body[len(base.conversation_prefix):]
    heads = {(base.role_prefix.get(r, ""), r) for r in ROLES} | {(g, "assistant") for g in gens}
    heads = sorted((h for h in heads if h[0]), key=lambda h: len(h[0]), reverse=True)
    messages, pos = [], 0
    while pos < len(body):
        head = next((h for h in heads if body.startswith(h[0], pos)), None)
        if head is None:
            raise EngineError(f"openai_chat: cannot read a message of the chat template ({base.template}) at "
                              f"{body[pos:pos + 60]!r}")
        start, role = pos + len(head[0]), head[1]
        suffix = base.role_suffix.get(role, "")
        if suffix:
            end = body.find(suffix, start)
            if end < 0:
                raise EngineError(f"openai_chat: a {role} message is not closed by {suffix!r}: "
                                  f"{body[start:start + 60]!r}")
        else:
            found = [i for i in (body.find(h[0], start) for h in heads) if i >= 0]
            end = min(found) if found else len(body)
        content = body[start:end]
        if role == "assistant":  # a sampled end token other than the one the template closes turns with
            content = _strip_end_of_turn(content, base.end_of_turn_texts)
        messages.append({"role": role, "content": content})
        pos = end + len(suffix)
    if not messages:
        raise EngineError("openai_chat: the prompt holds no messages")
    return messages


def _strip_end_of_turn(text: str, ends: Sequence[str]) -> str:
    stripped = True
    while stripped:
        stripped = False
        for end in ends:
            if end and text.endswith(end):
                text, stripped = text[: len(text) - len(end)], True
    return text


def api_messages(messages: Sequence[dict]) -> list[dict]:
    """The messages as a chat API takes them: tool observations become user messages (see the module docstring)."""
    return [{"role": "user" if m["role"] == "tool" else m["role"], "content": m["content"]} for m in messages]


def template_framings(folder: Any, options: dict[str, Any] | None = None) -> tuple[ChatFraming, ...]:
    """The framings of ``folder``'s chat template under ``options`` (the engine's ``chat_template_kwargs``; first)
    and each of `TEMPLATE_OPTIONS` that renders (`DEFAULT_FRAMING` when the folder has no chat template).
    `ConfigError` when ``options`` do not render."""
    from bapsql.tokens import has_chat_template

    if folder is None or not has_chat_template(folder):
        return (DEFAULT_FRAMING,)
    from bapsql.models.chat_template import ChatTemplate

    template = ChatTemplate.from_dir(folder)
    try:
        out: list[ChatFraming] = [template.framing(**(options or {}))]
    except ChatTemplateError as exc:
        raise ConfigError(f"engine.chat_template_kwargs: the chat template of {folder} does not render under "
                          f"{options}: {exc}") from exc
    for extra in TEMPLATE_OPTIONS:
        try:
            f = template.framing(**extra)
        except ChatTemplateError:
            continue
        if f not in out:
            out.append(f)
    return tuple(out)


def tool_call_text(message: dict) -> str:
    """The completion text of a chat answer: its content, then each native tool call as ``<tool_call>`` text."""
    parts = [message.get("content") or ""]
    for call in message.get("tool_calls") or ():
        fn = call.get("function", call) if isinstance(call, dict) else {}
        args = fn.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                pass  # left as a string: the action parser explains what is wrong with it
        parts.append(f"{OPEN_TAG}\n{json.dumps({'name': fn.get('name'), 'arguments': args})}\n{CLOSE_TAG}")
    return "\n".join(p for p in parts if p)


class OpenAIChatEngine(PooledRequests):
    """Engine over an OpenAI-compatible ``/v1/chat/completions`` endpoint (see the module docstring)."""

    name = "openai_chat"

    def __init__(self, config: EngineConfig):
        if config.kind != "openai_chat":
            raise ConfigError(f"engine.kind: OpenAIChatEngine needs kind 'openai_chat', got {config.kind!r}")
        self.config = config
        self.url = config.base_url.rstrip("/") + "/chat/completions"
        self._headers = json_headers(config.api_key_env)
        self._codec = ModelCodec.from_dir(config.tokenizer_dir)
        self._framings = template_framings(config.tokenizer_dir, config.chat_template_kwargs)
        eot = self._framings[0].end_of_turn_text
        end = list(self._framings[0].end_of_turn_ids[:1]) or self._codec.encode(eot)
        if len(end) != 1:
            raise ConfigError(f"engine.tokenizer: {config.tokenizer_dir} has no chat template and no {eot} token; "
                              "point the openai_chat engine at the folder of the tokenizer and chat template the "
                              "prompts are rendered with")
        self._end_id = end[0]
        self._pool = ThreadPoolExecutor(max_workers=config.max_num_seqs, thread_name_prefix="openai-chat")
        self._running: dict[Future, str] = {}  # step() requests in flight -> their keys
        self._lock = threading.Lock()
        self.token_sources: Counter[str] = Counter()  # "usage" | "tokenizer" -> answers accounted that way
        self._closed = False

    # -- protocol ---------------------------------------------------------------------------------------------------
    def generate(self, prompts: Sequence[Sequence[int]], params: Sequence[SamplingParams], *,
                 adapter: AdapterRef | None = None) -> list[Generation]:
        """One chat completion per prompt; requests run concurrently (at most ``max_num_seqs`` at once)."""
        self._check_open()
        check_batch(prompts, params, self.config.max_model_len)
        model = adapter.name if adapter is not None else self.config.model
        return list(self._pool.map(lambda a: self.complete(a[0], a[1], model), zip(prompts, params)))

    def _answer(self, prompt: Sequence[int], sp: SamplingParams, model: str) -> Generation:
        return self.complete(prompt, sp, model)

    def load_adapter(self, path: str, name: str, version: int) -> AdapterRef:
        """Always raises: a served chat model has no training hooks."""
        raise EngineError("the openai_chat engine cannot load adapters; serve the adapter under a model name "
                          "(e.g. vllm serve --lora-modules NAME=PATH) and pass AdapterRef(name=NAME, ...) instead")

    def logprobs_of(self, prompt_ids: Sequence[int], completion_ids: Sequence[int], *,
                    adapter: AdapterRef | None = None) -> list[float]:
        """Always raises: the chat-completions API cannot score a given completion."""
        raise EngineError("logprobs_of: the chat-completions API cannot score a given completion; use the openai "
                          "engine (legacy completions with vLLM's prompt_logprobs) for that")

    # -- one request --------------------------------------------------------------------------------------------------
    def complete(self, prompt: Sequence[int], sp: SamplingParams, model: str | None = None) -> Generation:
        """Answer one prompt (blocking, in the calling thread)."""
        messages = api_messages(messages_of(self._codec.decode_raw(prompt), self._framings))
        body: dict[str, Any] = {"model": model or self.config.model, "messages": messages,
                                "max_tokens": sp.max_tokens, "temperature": sp.temperature, "top_p": sp.top_p}
        if sp.seed is not None:
            body["seed"] = sp.seed
        if sp.stop:
            body["stop"] = list(sp.stop)
        if self.config.chat_template_kwargs:  # the server renders its template as the prompt was (vLLM, SGLang)
            body["chat_template_kwargs"] = dict(self.config.chat_template_kwargs)
        data = self._post(body)
        try:
            choice = data["choices"][0]
            message, reason = choice["message"], choice.get("finish_reason")
        except (KeyError, IndexError, TypeError) as exc:
            raise EngineError(f"openai_chat: {self.url} answered without choices[0].message: {str(data)[:300]}") \
                from exc
        finish = _FINISH.get(reason)
        if finish is None:
            raise EngineError(f"openai_chat: request finished with {reason!r} (expected stop or length)")
        text, hit = cut_at_stop(tool_call_text(message), sp.stop)
        ids = self._codec.encode(text)
        if finish == "stop" or hit:
            ids.append(self._end_id)
        return Generation(prompt_ids=tuple(prompt), completion_ids=tuple(ids), text=text, logprobs=None,
                          finish_reason="stop" if hit else finish, usage=self._usage(data.get("usage")))

    def _usage(self, usage: Any) -> tuple[int, int] | None:
        nums = None
        if isinstance(usage, dict):
            p, c = usage.get("prompt_tokens"), usage.get("completion_tokens")
            if isinstance(p, int) and isinstance(c, int):
                nums = (p, c)
        source = "usage" if nums is not None else "tokenizer"
        with self._lock:
            self.token_sources[source] += 1
            first = self.token_sources[source] == 1
        if first:
            log.info("openai_chat %s: token accounting from %s", self.url,
                     "the server's usage" if nums else f"the tokenizer {self.config.tokenizer_dir} (no usage sent)")
        return nums

    def _post(self, body: dict) -> dict:
        """POST ``body``, retrying 429 / 5xx / connection failures with backoff (see the module docstring)."""
        cfg = self.config
        last: Exception | None = None
        for attempt in range(cfg.max_retries + 1):
            if attempt:
                hint = getattr(last, "retry_after", None)
                time.sleep(min(MAX_WAIT_S, hint if hint is not None else cfg.retry_backoff_s * 2 ** (attempt - 1)))
            try:
                return self._post_once(body)
            except _HTTPStatus as exc:
                if exc.status != 429 and exc.status < 500:
                    raise EngineError(f"openai_chat: {self.url} refused the request: {exc}") from exc
                last = exc
            except EngineUnavailable as exc:
                last = exc
        raise EngineUnavailable(f"openai_chat: {self.url} still failing after {cfg.max_retries} retries: {last}") \
            from last

    def _post_once(self, body: dict) -> dict:
        req = urllib.request.Request(self.url, data=json.dumps(body).encode(), headers=self._headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=self.config.timeout_s) as resp:
                data = json.loads(resp.read().decode("utf-8"))
        except urllib.error.HTTPError as exc:
            raw = exc.headers.get("Retry-After") if exc.headers is not None else None
            retry_after = float(raw) if raw is not None and raw.strip().replace(".", "", 1).isdigit() else None
            raise _HTTPStatus(exc.code, exc.read().decode("utf-8", "replace"), retry_after) from exc
        except (urllib.error.URLError, TimeoutError, OSError) as exc:
            raise EngineUnavailable(f"cannot reach {self.url}: {exc}") from exc
        except json.JSONDecodeError as exc:
            raise EngineError(f"openai_chat: {self.url} answered with invalid JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise EngineError(f"openai_chat: {self.url} answered with {type(data).__name__}, not a JSON object")
        return data

