"""The OpenAI-compatible HTTP engine: evaluation of served models (``vllm serve``, other compatible servers).

Contract (see `bapsql.rollout.engines.base`):

- each prompt is one ``POST {base_url}/completions`` (legacy completions API), sent concurrently (at most
  ``max_num_seqs`` in flight; `step` keeps requests in flight across calls and returns those that have answered),
  with ``logprobs: 0`` when logprobs are wanted and vLLM's ``return_token_ids: true``;
- prompts go as token-id lists where the server takes them (``token_prompts: auto`` tries once and, on a 400 or 422
  answer, falls back for good to text prompts detokenized with the model's tokenizer, special tokens kept);
- completion ids come from the server's ``token_ids`` when it returns them (vLLM), else from ``token_id:N`` logprob
  tokens, else by tokenizing the returned text with the model's tokenizer (then lossy: the eos token is not visible
  and logprobs are dropped unless they align one-to-one);
- ``logprobs_of`` uses vLLM's ``prompt_logprobs`` extension and raises `EngineError` when the server lacks it;
- ``load_adapter`` raises `EngineError`: a served model has no training hooks. An `AdapterRef` built by hand selects
  a LoRA module the server serves under ``adapter.name`` (``vllm serve --lora-modules name=path``).

Only the standard library is used (``urllib``); the API key, if any, is read from the environment variable named
by ``api_key_env``.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any, Sequence

from bapsql.errors import ConfigError, EngineError
from bapsql.rollout.engines.base import (AdapterRef, EngineConfig, Generation, SamplingParams, StepRequest,
                                         check_batch)
from bapsql.rollout.engines.codec import ModelCodec
from bapsql.rollout.engines.pooled import PooledRequests, json_headers


class _HTTPStatus(EngineError):
    """A non-2xx answer (kept internal: callers see `EngineError`)."""

    def __init__(self, status: int, body: str):
        super().__init__(f"HTTP {status}: {body[:300]}")
        self.status = status


class OpenAIEngine(PooledRequests):
    """Engine over an OpenAI-compatible ``/v1/completions`` endpoint."""

    name = "openai"

    def __init__(self, config: EngineConfig):
        if config.kind != "openai":
            raise ConfigError(f"engine.kind: OpenAIEngine needs kind 'openai', got {config.kind!r}")
        self.config = config
        self._url = config.base_url.rstrip("/") + "/completions"
        self._headers = json_headers(config.api_key_env)
        if config.tokenizer_dir is None:
            raise ConfigError("engine.tokenizer: the openai engine needs the model's tokenizer folder "
                              "(set tokenizer: or make model a local folder)")
        self._codec = ModelCodec.from_dir(config.tokenizer_dir)
        self._token_prompts: bool | None = {"always": True, "never": False, "auto": None}[config.token_prompts]
        self._pool = ThreadPoolExecutor(max_workers=config.max_num_seqs, thread_name_prefix="openai-engine")
        self._running: dict[Future, str] = {}  # step() requests in flight -> their keys
        self._closed = False

    # -- protocol ---------------------------------------------------------------------------------------------------
    def generate(self, prompts: Sequence[Sequence[int]], params: Sequence[SamplingParams], *,
                 adapter: AdapterRef | None = None) -> list[Generation]:
        """One completion per prompt; requests run concurrently."""
        self._check_open()
        check_batch(prompts, params, self.config.max_model_len)
        if not prompts:
            return []
        model = adapter.name if adapter is not None else self.config.model
        if self._token_prompts is None:  # probe once, serially, whether token-id prompts are accepted
            first = self._generate_one(prompts[0], params[0], model)
            rest = list(self._pool.map(lambda a: self._generate_one(a[0], a[1], model),
                                       zip(prompts[1:], params[1:])))
            return [first, *rest]
        return list(self._pool.map(lambda a: self._generate_one(a[0], a[1], model), zip(prompts, params)))

    def _admit(self, new: Sequence[StepRequest], model: str) -> Sequence[StepRequest]:
        """Until the server has told whether it takes token-id prompts, the first request goes alone (a probe)."""
        if new and self._token_prompts is None:
            (key, prompt, sp), new = new[0], new[1:]
            done = self._pool.submit(self._generate_one, prompt, sp, model)
            self._running[done] = key
            wait([done])
        return new

    def _answer(self, prompt: Sequence[int], sp: SamplingParams, model: str) -> Generation:
        return self._generate_one(prompt, sp, model)

    def load_adapter(self, path: str, name: str, version: int) -> AdapterRef:
        """Always raises: adapters of a served model are the server's business."""
        raise EngineError("the openai engine has no training hooks: it cannot load adapters; serve the adapter "
                          "(e.g. vllm serve --lora-modules NAME=PATH) and pass AdapterRef(name=NAME, ...) instead")

    def logprobs_of(self, prompt_ids: Sequence[int], completion_ids: Sequence[int], *,
                    adapter: AdapterRef | None = None) -> list[float]:
        """Score ``completion_ids`` with the server's ``prompt_logprobs`` (vLLM extension)."""
        self._check_open()
        if not prompt_ids or not completion_ids:
            raise EngineError("logprobs_of: prompt and completion must both be non-empty")
        ids = list(prompt_ids) + list(completion_ids)
        body = {"model": adapter.name if adapter is not None else self.config.model, "prompt": ids,
                "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": 0}
        choice = self._post(body)["choices"][0]
        scored = choice.get("prompt_logprobs")
        if not isinstance(scored, list) or len(scored) != len(ids):
            raise EngineError("logprobs_of: the server did not return prompt_logprobs for every prompt token "
                              "(it is a vLLM extension of the completions API)")
        out = []
        for pos, tok in zip(scored[len(prompt_ids):], completion_ids):
            entry = pos.get(str(tok)) if isinstance(pos, dict) else None
            if entry is None:
                raise EngineError(f"logprobs_of: the server's prompt_logprobs lack token {tok}")
            out.append(float(entry["logprob"] if isinstance(entry, dict) else entry))
        return out

    def _post(self, body: dict) -> dict:
        req = urllib.request.Request(self._url, data=json.dumps(body).encode(), headers=self._headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=self.config.timeout_s) as resp:
                data = json.loads(resp.read().decode("utf-8"))
        except urllib.error.HTTPError as exc:
            raise _HTTPStatus(exc.code, exc.read().decode("utf-8", "replace")) from exc
        except (urllib.error.URLError, TimeoutError, OSError) as exc:
            raise EngineError(f"openai engine: cannot reach {self._url}: {exc}") from exc
        except json.JSONDecodeError as exc:
            raise EngineError(f"openai engine: {self._url} answered with invalid JSON: {exc}") from exc
        if not isinstance(data, dict) or not data.get("choices"):
            raise EngineError(f"openai engine: {self._url} answered without choices: {str(data)[:300]}")
        return data

    def _body(self, prompt: Sequence[int], sp: SamplingParams, model: str, as_tokens: bool) -> dict:
        body: dict[str, Any] = {"model": model, "max_tokens": sp.max_tokens, "temperature": sp.temperature,
                                "top_p": sp.top_p, "return_token_ids": True,
                                "prompt": list(prompt) if as_tokens else self._codec.decode_raw(prompt)}
        if sp.seed is not None:
            body["seed"] = sp.seed
        if sp.stop:
            body["stop"] = list(sp.stop)
        if sp.logprobs:
            body["logprobs"] = 0
        return body

    def _generate_one(self, prompt: Sequence[int], sp: SamplingParams, model: str) -> Generation:
        as_tokens = self._token_prompts is not False
        try:
            data = self._post(self._body(prompt, sp, model, as_tokens))
        except _HTTPStatus as exc:
            if not (self._token_prompts is None and exc.status in (400, 422)):
                raise
            self._token_prompts = False  # this server takes no token-id prompts: use text from now on
            data = self._post(self._body(prompt, sp, model, False))
        else:
            if self._token_prompts is None:
                self._token_prompts = as_tokens
        return self._parse(prompt, data["choices"][0], sp)

    def _parse(self, prompt: Sequence[int], choice: dict, sp: SamplingParams) -> Generation:
        text = choice.get("text") or ""
        reason = choice.get("finish_reason")
        if reason not in ("stop", "length"):
            raise EngineError(f"openai engine: request finished with {reason!r}")
        lp = choice.get("logprobs") or {}
        token_lps = lp.get("token_logprobs") if isinstance(lp, dict) else None
        ids = choice.get("token_ids")
        if not isinstance(ids, list):
            toks = lp.get("tokens") if isinstance(lp, dict) else None
            if isinstance(toks, list) and toks and all(isinstance(t, str) and t.startswith("token_id:") for t in toks):
                ids = [int(t.split(":", 1)[1]) for t in toks]
            else:
                ids = self._codec.encode(text)
        logprobs = None
        if sp.logprobs and isinstance(token_lps, list) and len(token_lps) == len(ids):
            logprobs = tuple(float(x) for x in token_lps)
        return Generation(prompt_ids=tuple(prompt), completion_ids=tuple(int(i) for i in ids), text=text,
                          logprobs=logprobs, finish_reason=reason)
