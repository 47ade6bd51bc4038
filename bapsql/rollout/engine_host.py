"""The engine host behind the rollout's engine actors (`EngineHost`), and the `AdapterSpec` it samples with.

It is a plain class (split from `bapsql.rollout.workers`, the env worker): it imports no Ray;
`bapsql.rollout.ray_shell` wraps it in an actor, the in-process backend of the driver uses it directly, and tests
drive it without Ray.

- `EngineHost` wraps one engine (`bapsql.rollout.engines`): `generate(requests, adapter)` for all waiting episodes
  in one batched call; the adapter (LoRA) named by the caller is loaded on first use, so a restarted host catches
  up by itself. Sets the process's torch threads (CPU engines collapse under thread oversubscription).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, Sequence

from bapsql.errors import EnvStateError
from bapsql.rollout.agent import GenerationRequest


@dataclass(frozen=True)
class AdapterSpec:
    """A LoRA adapter the engine should sample with: folder, name, and the policy version it holds."""

    path: str
    name: str
    version: int


@dataclass(frozen=True)
class EngineStats:
    """Counters of one engine host since it started."""

    pid: int
    calls: int
    requests: int
    prompt_tokens: int
    generated_tokens: int
    busy_s: float


def set_torch_threads(threads: int | None) -> None:
    """Limit torch's intra-op threads in this process (no-op when torch is absent or ``threads`` is None)."""
    if threads is None:
        return
    try:
        import torch
    except ImportError:
        return
    torch.set_num_threads(max(1, int(threads)))


class EngineHost:
    """One engine (see the module docstring). ``engine``: an `EngineConfig` (built with
    `bapsql.rollout.engines.factory.make_engine`), a zero-argument factory returning an engine, or an engine object."""

    def __init__(self, engine: Any, *, threads: int | None = 1):
        set_torch_threads(threads)
        if hasattr(engine, "generate") and not isinstance(engine, type):
            self.engine = engine
        elif callable(engine):
            self.engine = engine()
        else:
            from bapsql.rollout.engines.factory import make_engine

            self.engine = make_engine(engine)
        self._adapters: dict[str, tuple[int, Any]] = {}
        self._calls = self._requests = self._prompt_tokens = self._generated = 0
        self._busy = 0.0

    def adapter_ref(self, adapter: AdapterSpec | None) -> Any:
        """The engine's handle of ``adapter``, loading it (in place) when its version is not the loaded one."""
        if adapter is None:
            return None
        have = self._adapters.get(adapter.name)
        if have is None or have[0] != adapter.version:
            ref = self.engine.load_adapter(adapter.path, adapter.name, adapter.version)
            self._adapters[adapter.name] = (adapter.version, ref)
        return self._adapters[adapter.name][1]

    def generate(self, requests: Sequence[GenerationRequest], adapter: AdapterSpec | None = None) -> list[Any]:
        """One batched engine call for every request; returns the `Generation` s in request order."""
        if not requests:
            return []
        t0 = time.perf_counter()
        ref = self.adapter_ref(adapter)
        gens = self.engine.generate([r.prompt_ids for r in requests], [r.params for r in requests], adapter=ref)
        if len(gens) != len(requests):
            raise EnvStateError(f"the engine returned {len(gens)} generations for {len(requests)} requests")
        self._calls += 1
        self._requests += len(requests)
        self._prompt_tokens += sum(len(r.prompt_ids) for r in requests)
        self._generated += sum(len(g.completion_ids) for g in gens)
        self._busy += time.perf_counter() - t0
        return list(gens)

    def step(self, items: Sequence[tuple[str, GenerationRequest]], adapter: AdapterSpec | None = None
             ) -> list[tuple[str, Any]]:
        """Continuous batching (`Engine.step`): admit ``(key, request)`` items into the running batch and return the
        ``(key, Generation)`` pairs that finish next; the others stay in flight for the next call."""
        t0 = time.perf_counter()
        ref = self.adapter_ref(adapter)
        done = self.engine.step([(k, r.prompt_ids, r.params) for k, r in items], adapter=ref)
        self._calls += 1
        self._requests += len(items)
        self._prompt_tokens += sum(len(r.prompt_ids) for _, r in items)
        self._generated += sum(len(g.completion_ids) for _, g in done)
        self._busy += time.perf_counter() - t0
        return list(done)

    def in_flight(self) -> int:
        return int(self.engine.in_flight())

    def load_adapter(self, adapter: AdapterSpec) -> Any:
        """Load (or reload in place) an adapter now, e.g. right after a weight sync."""
        self._adapters.pop(adapter.name, None)
        return self.adapter_ref(adapter)

    def served_adapter(self, adapter: AdapterSpec | None) -> Any:
        """The engine's report of what it samples with when asked for ``adapter`` (`Engine.served_adapter`: name,
        version and digest of the files it loaded; None for the base weights or a name this host never loaded).
        Loads nothing: weight sync asks this after `load_adapter`, to see what really serves."""
        if adapter is None or adapter.name not in self._adapters:
            return None
        return self.engine.served_adapter(self._adapters[adapter.name][1])

    def logprobs_of(self, prompt_ids: Sequence[int], completion_ids: Sequence[int],
                    adapter: AdapterSpec | None = None) -> list[float]:
        """The engine's logprobs of a fixed completion (the weight-sync check)."""
        return list(self.engine.logprobs_of(prompt_ids, completion_ids, adapter=self.adapter_ref(adapter)))

    def stats(self) -> EngineStats:
        return EngineStats(os.getpid(), self._calls, self._requests, self._prompt_tokens, self._generated,
                           round(self._busy, 6))

    def ping(self) -> int:
        return os.getpid()

    def close(self) -> None:
        self.engine.close()
