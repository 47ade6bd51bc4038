"""The model-engine protocol every rollout engine implements, its value types and its config.

Contract (token-in / token-out; engines never re-tokenize text):

- `Engine.generate(prompts, params, *, adapter=None)` takes a batch of prompts as token ids with one
  `SamplingParams` each (many episodes per call) and returns one `Generation` per prompt, in order.
  ``completion_ids`` are the sampled tokens exactly as sampled, including the end-of-turn token (eos) or the token
  that completed a stop string; ``text`` is their decoding with special tokens skipped, without the eos token's
  text, cut before the stop string;
  ``logprobs[i]`` is the log-probability of ``completion_ids[i]`` under the distribution it was sampled from
  (vLLM's "processed" logprobs: ``log_softmax(logits / temperature)`` renormalised over the top-p nucleus; the raw
  ``log_softmax(logits)`` for greedy requests) — what the learner at the sampling temperature and top-p recomputes
  (`bapsql.train.algo.logprobs` renormalises over the same nucleus, so the GRPO importance weight measures policy
  change, not the nucleus mass) — or ``None`` when not requested (an
  OpenAI-compatible server reports whatever its ``--logprobs-mode`` says);
  ``finish_reason`` is ``"stop"`` (eos or stop string) or ``"length"`` (``max_tokens`` reached).
  ``temperature == 0`` is greedy decoding. A request's ``seed`` makes its sample reproducible whatever else is in
  the batch.
- `Engine.step(new, *, adapter=None)` is continuous batching, for callers that keep many episodes going at once:
  it admits ``new`` requests — ``(key, prompt_ids, params)``, each ``key`` unique among the requests in flight —
  into the running batch (sampled with ``adapter``), runs the engine until at least one request in flight has
  finished, and returns the finished ones as ``(key, Generation)`` pairs (each equal to what ``generate`` gives
  for that request alone, seeds included). It returns ``[]`` only when nothing is in flight. Requests that are
  still running stay in flight for the next call, so the caller can add the next turn of a finished episode
  while the others keep decoding (no round waits for its longest completion). `Engine.in_flight()` counts them.
  vLLM admits requests between decoding steps; `RoundBatching` gives engines without that ability (HF) the same
  contract by finishing everything in flight at each call. ``generate``, ``load_adapter`` and ``logprobs_of``
  refuse to run while requests are in flight on an engine that shares one batch between them.
- `Engine.load_adapter(path, name, version)` loads a peft LoRA adapter folder under ``name``, replacing any earlier
  version of the same name for new requests, and returns the `AdapterRef` to pass to ``generate``/``logprobs_of``
  / ``step``. Engines that keep requests in flight across ``step`` calls (vLLM) accept it while requests run: those
  finish on the version they were admitted with.
- `Engine.served_adapter(adapter)` reports which adapter the engine samples with when asked for ``adapter``: its
  current version of that name as loaded, with the `adapter_digest` of the files it read at load time (``None``
  for the base weights). Weight sync compares it with what the learner saved, so a stale adapter is caught by
  identity, whatever the numeric noise between the two implementations.
- `Engine.logprobs_of(prompt_ids, completion_ids, *, adapter=None)` scores a given completion (teacher forcing):
  one raw (temperature-1) log-probability per completion token. Used to check weight sync against the learner.
- `Engine.close()` releases the engine (idempotent).

`EngineConfig` is the strict, frozen config `bapsql.rollout.engines.factory.make_engine` builds engines from.
"""

from __future__ import annotations

import hashlib
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Mapping, Protocol, Sequence, runtime_checkable

from bapsql.config import from_mapping, read_yaml
from bapsql.errors import ConfigError, EngineError

FinishReason = Literal["stop", "length"]
EngineKind = Literal["vllm", "hf", "openai", "openai_chat"]
ENGINE_KINDS: tuple[str, ...] = ("vllm", "hf", "openai", "openai_chat")
HTTP_KINDS: tuple[str, ...] = ("openai", "openai_chat")  # engines that talk to a server over HTTP


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one completion. ``temperature == 0`` means greedy; ``top_p`` in (0, 1] truncates the nucleus;
    ``stop`` strings end the completion (the text is cut before them); ``seed`` pins this request's randomness."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    logprobs: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ConfigError(f"sampling: max_tokens must be a positive integer, got {self.max_tokens!r}")
        if not (self.temperature >= 0 and math.isfinite(self.temperature)):
            raise ConfigError(f"sampling: temperature must be a finite number >= 0, got {self.temperature!r}")
        if not (0 < self.top_p <= 1):
            raise ConfigError(f"sampling: top_p must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.stop, tuple):
            object.__setattr__(self, "stop", tuple(self.stop))
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ConfigError(f"sampling: stop strings must be non-empty strings, got {self.stop!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass(frozen=True)
class Generation:
    """One sampled completion. ``logprobs`` is parallel to ``completion_ids`` (or ``None``)."""

    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    text: str
    logprobs: tuple[float, ...] | None
    finish_reason: FinishReason
    usage: tuple[int, int] | None = None  # (prompt, completion) tokens as a server counted them, when it said

    def __post_init__(self) -> None:
        if self.logprobs is not None and len(self.logprobs) != len(self.completion_ids):
            raise EngineError(f"engine returned {len(self.logprobs)} logprobs for {len(self.completion_ids)} tokens")
        if self.finish_reason not in ("stop", "length"):
            raise EngineError(f"unknown finish reason {self.finish_reason!r}")


@dataclass(frozen=True)
class AdapterRef:
    """A loaded LoRA adapter: its ``name``, the ``version`` loaded last, the folder it came from, the engine's
    integer id for it (> 0; the HF engine keeps one per name, vLLM gives each version its own) and the
    `adapter_digest` of the files the engine read (empty for a reference built by hand)."""

    name: str
    version: int
    path: str
    lora_id: int
    digest: str = ""


ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors", "adapter_model.bin")


def adapter_digest(folder: str | Path) -> str:
    """SHA-256 over a peft adapter folder's config and weight files (name and bytes of each, in a fixed order): the
    identity weight sync compares between the learner that wrote the folder and the engine that loaded it."""
    h = hashlib.sha256()
    found = False
    for name in ADAPTER_FILES:
        f = Path(folder) / name
        if not f.is_file():
            continue
        found = True
        h.update(name.encode() + b"\0")
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 22), b""):
                h.update(chunk)
    if not found:
        raise EngineError(f"adapter_digest: {folder} holds none of {list(ADAPTER_FILES)} (not a peft adapter folder)")
    return h.hexdigest()


StepRequest = tuple[str, Sequence[int], SamplingParams]  # (key, prompt ids, sampling params) for `Engine.step`


def check_step(new: Sequence[StepRequest], running: Any, max_model_len: int) -> None:
    """Raise `EngineError` unless every new request has a fresh key (not in ``running`` nor repeated) and a prompt
    that fits (`check_batch`)."""
    keys = [k for k, _, _ in new]
    clash = sorted({k for k in keys if k in running} | {k for k in keys if keys.count(k) > 1})
    if clash:
        raise EngineError(f"step: request keys {clash[:5]} are already in flight; give each request a unique key")
    check_batch([p for _, p, _ in new], [sp for _, _, sp in new], max_model_len)


class RoundBatching:
    """`Engine.step` for an engine that can only run whole batches: each call runs every request in flight (the new
    ones and any left) through ``self.generate`` in one batch, so all of them finish; per request the results are
    exactly ``generate``'s. Mixed in by engines without in-flight admission (HF)."""

    def step(self, new: Sequence[StepRequest], *, adapter: AdapterRef | None = None) -> list[tuple[str, Generation]]:
        if not new:
            return []
        check_step(new, (), self.config.max_model_len)  # type: ignore[attr-defined]
        gens = self.generate([p for _, p, _ in new], [sp for _, _, sp in new], adapter=adapter)  # type: ignore
        return [(key, g) for (key, _, _), g in zip(new, gens)]

    def in_flight(self) -> int:
        return 0


@runtime_checkable
class Engine(Protocol):
    """A batched, token-in/token-out text generator with LoRA hot swap (see the module docstring)."""

    name: str

    def generate(self, prompts: Sequence[Sequence[int]], params: Sequence[SamplingParams], *,
                 adapter: AdapterRef | None = None) -> list[Generation]: ...

    def step(self, new: Sequence["StepRequest"], *, adapter: AdapterRef | None = None
             ) -> list[tuple[str, Generation]]: ...

    def in_flight(self) -> int: ...

    def load_adapter(self, path: str, name: str, version: int) -> AdapterRef: ...

    def served_adapter(self, adapter: AdapterRef | None) -> AdapterRef | None: ...

    def logprobs_of(self, prompt_ids: Sequence[int], completion_ids: Sequence[int], *,
                    adapter: AdapterRef | None = None) -> list[float]: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class EngineConfig:
    """How to build an engine (strict; load with `load_engine_config`).

    ``model`` is a model folder (vllm, hf) or the served model's name (openai). ``dtype`` ``auto`` (the default)
    is 16-bit on a GPU (the checkpoint's 16-bit dtype, else bfloat16) and float32 on the CPU
    (`bapsql.models.dtype.resolve_dtype`), as the learner resolves it. ``chat_template_kwargs`` are the chat-template
    options prompts for this engine are rendered with (e.g. ``{enable_thinking: false}`` for Qwen3-class templates):
    ``bapsql serve``'s agent renders with them, a sweep merges ``sampling.template_kwargs`` into them, and
    ``openai_chat`` sends them to the server so its template renders the same way. ``kv_cache_space_gb`` sets
    ``VLLM_CPU_KVCACHE_SPACE`` for vLLM on CPU (ignored on GPU, where ``gpu_memory_utilization`` applies).
    ``num_threads`` caps torch threads in the engine process (0: this process's CPU share). ``tokenizer`` is a
    folder holding ``tokenizer.json`` (default: ``model`` when it is a folder); the openai engine uses it to decode
    completions and, when the server takes no token-id prompts, to detokenize prompts. ``token_prompts`` says
    whether the openai engine sends token-id prompts (``auto``: try, fall back to text on a 400/422 answer).
    The openai_chat engine retries a 429 / 5xx answer or a failed connection ``max_retries`` times, waiting
    ``retry_backoff_s * 2**attempt`` seconds (or the server's ``Retry-After``, at most 30 s); ``timeout_s`` bounds
    each request and ``max_num_seqs`` the requests in flight. ``openai_chat`` (`bapsql.rollout.engines.openai_chat`)
    without ``tokenizer`` and a model folder uses the packaged tokenizer.
    ``adapter_mode`` (vllm): ``lora`` serves adapters in vLLM's LoRA slots (versions side by side, pipelined GRPO);
    ``merge`` folds each loaded adapter into the base weights and reloads them in place
    (`bapsql.rollout.engines.lora_merge`; one version at a time, none in flight at a load; ~2.4× faster decoding
    on CPU). ``engine_process`` (vllm): ``separate`` runs vLLM's engine core in its own process (env work overlaps
    decoding), ``in_process`` in the caller's (no second process competing for few cores: 1.6× the tokens/s on 2
    cores), ``auto`` picks in_process on CPU and separate on GPU.
    """

    kind: EngineKind
    model: str
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"  # auto: bf16 on GPU, fp32 on CPU (models.dtype)
    max_model_len: int = 4096
    enable_lora: bool = False
    max_lora_rank: int = 32
    max_loras: int = 1
    gpu_memory_utilization: float = 0.85
    kv_cache_space_gb: int = 1
    tensor_parallel_size: int = 1
    max_num_seqs: int = 64
    enforce_eager: bool = False
    num_threads: int = 0
    seed: int = 0
    device: Literal["auto", "cpu", "cuda"] = "auto"
    tokenizer: str = ""
    base_url: str = ""
    api_key_env: str = ""
    token_prompts: Literal["auto", "always", "never"] = "auto"
    timeout_s: float = 120.0
    max_retries: int = 3
    retry_backoff_s: float = 0.5
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    adapter_mode: Literal["lora", "merge"] = "lora"
    engine_process: Literal["auto", "separate", "in_process"] = "auto"

    def __post_init__(self) -> None:
        if self.adapter_mode not in ("lora", "merge"):
            raise ConfigError(f"engine.adapter_mode: {self.adapter_mode!r} is not 'lora' or 'merge'")
        if self.engine_process not in ("auto", "separate", "in_process"):
            raise ConfigError(f"engine.engine_process: {self.engine_process!r} is not 'auto', 'separate' or "
                              "'in_process'")
        if self.adapter_mode == "merge" and self.enable_lora:
            raise ConfigError("engine.adapter_mode: merge folds adapters into the weights and needs no LoRA slots; "
                              "set enable_lora: false (or adapter_mode: lora)")
        if self.kind not in ENGINE_KINDS:
            raise ConfigError(f"engine.kind: {self.kind!r} is not one of {list(ENGINE_KINDS)}")
        if not self.model:
            raise ConfigError("engine.model: required (a model folder, or the served model name for openai)")
        positive = ("max_model_len", "max_lora_rank", "max_loras", "kv_cache_space_gb", "tensor_parallel_size",
                    "max_num_seqs")
        for name in positive:
            if getattr(self, name) < 1:
                raise ConfigError(f"engine.{name}: must be >= 1, got {getattr(self, name)}")
        if self.num_threads < 0:
            raise ConfigError(f"engine.num_threads: must be >= 0 (0 = the process's CPU share), got {self.num_threads}")
        if not (0 < self.gpu_memory_utilization <= 1):
            raise ConfigError(f"engine.gpu_memory_utilization: must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.timeout_s <= 0:
            raise ConfigError(f"engine.timeout_s: must be > 0, got {self.timeout_s}")
        if self.max_retries < 0 or self.retry_backoff_s < 0:
            raise ConfigError(f"engine.max_retries / retry_backoff_s: must be >= 0, got {self.max_retries} / "
                              f"{self.retry_backoff_s}")
        if self.kind in HTTP_KINDS and not self.base_url.startswith(("http://", "https://")):
            raise ConfigError(f"engine.base_url: the {self.kind} engine needs the server's URL, "
                              "e.g. http://127.0.0.1:8000/v1")
        if self.kind not in HTTP_KINDS and (self.base_url or self.api_key_env):
            raise ConfigError(f"engine.base_url / api_key_env: only for kinds {list(HTTP_KINDS)}, not {self.kind}")

    @property
    def tokenizer_dir(self) -> Path | None:
        """The folder holding ``tokenizer.json``: ``tokenizer`` if set, else ``model`` if it is a folder, else (for
        ``openai_chat`` only) the packaged tokenizer."""
        if self.tokenizer:
            return Path(self.tokenizer)
        if Path(self.model).is_dir():
            return Path(self.model)
        if self.kind == "openai_chat":
            from bapsql.tokens import DEFAULT_TOKENIZER_DIR

            return DEFAULT_TOKENIZER_DIR
        return None


def load_engine_config(source: Mapping[str, Any] | str | Path, where: str = "engine") -> EngineConfig:
    """Build an `EngineConfig` from a mapping or a YAML file (a top-level ``engine:`` key is accepted). Unknown keys,
    missing keys and bad values raise `ConfigError` naming the key."""
    data = read_yaml(source) if isinstance(source, (str, Path)) else source
    if isinstance(data, Mapping) and set(data) == {"engine"}:
        data = data["engine"]
    return from_mapping(EngineConfig, dict(data) if isinstance(data, Mapping) else data, where)


def model_folder(config: "EngineConfig", kind: str, engine_class: str) -> Path:
    """The local model folder of ``config`` for an engine of ``kind``; `ConfigError` for the wrong kind,
    `EngineError` when the folder has no ``config.json``."""
    if config.kind != kind:
        raise ConfigError(f"engine.kind: {engine_class} needs kind {kind!r}, got {config.kind!r}")
    path = Path(config.model)
    if not (path / "config.json").is_file():
        raise EngineError(f"{kind} engine: {path} is not a model folder (no config.json)")
    return path


def cpu_share() -> int:
    """How many CPUs this process may run on (its affinity mask), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def check_batch(prompts: Sequence[Sequence[int]], params: Sequence[SamplingParams], max_model_len: int) -> None:
    """Raise `EngineError` unless there is one `SamplingParams` per prompt, every prompt is non-empty, and every
    prompt plus its ``max_tokens`` fits ``max_model_len``."""
    if len(prompts) != len(params):
        raise EngineError(f"generate: {len(prompts)} prompts but {len(params)} sampling params; pass one per prompt")
    for i, (p, sp) in enumerate(zip(prompts, params)):
        if len(p) == 0:
            raise EngineError(f"generate: prompt {i} is empty")
        if len(p) + sp.max_tokens > max_model_len:
            raise EngineError(f"generate: prompt {i} has {len(p)} tokens + max_tokens {sp.max_tokens} > "
                              f"max_model_len {max_model_len}; shorten it or raise max_model_len")


def cut_at_stop(text: str, stop: Sequence[str]) -> tuple[str, bool]:
    """``text`` cut before the earliest occurrence of any stop string, and whether one occurred."""
    hits = [i for i in (text.find(s) for s in stop) if i >= 0]
    return (text[:min(hits)], True) if hits else (text, False)
