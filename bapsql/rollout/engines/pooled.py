"""The request pool the HTTP engines share: each request is one blocking call run in a thread pool.

`PooledRequests` gives an engine `Engine.step` (continuous batching: admit new requests, return those answered so
far, waiting for at least one), `in_flight`, `served_adapter` (which raises: a server's adapters are its own),
`close` and the closed check. The engine sets, in its ``__init__``,
``self.config`` (an `EngineConfig`), ``self._pool`` (a `ThreadPoolExecutor`), ``self._running = {}`` (future → request
key) and ``self._closed = False``, and defines ``_answer(prompt, params, model) -> Generation``, one request. An
engine that must send some requests before the others (e.g. a probe of what the server accepts) overrides
``_admit(new, model)``, which returns the requests still to submit.
"""

from __future__ import annotations

import os
from concurrent.futures import FIRST_COMPLETED, wait
from typing import Any, Sequence

from bapsql.errors import ConfigError, EngineError
from bapsql.rollout.engines.base import AdapterRef, Generation, SamplingParams, StepRequest, check_step


def json_headers(api_key_env: str | None) -> dict[str, str]:
    """JSON request headers, with ``Authorization: Bearer`` from the environment variable ``api_key_env`` when set
    (`ConfigError` when that variable is empty or missing)."""
    headers = {"Content-Type": "application/json"}
    if api_key_env:
        key = os.environ.get(api_key_env)
        if not key:
            raise ConfigError(f"engine.api_key_env: environment variable {api_key_env} is not set")
        headers["Authorization"] = f"Bearer {key}"
    return headers


class PooledRequests:
    """See the module docstring."""

    name: str

    def step(self, new: Sequence[StepRequest], *, adapter: AdapterRef | None = None) -> list[tuple[str, Generation]]:
        """Send ``new`` requests and return those answered so far, waiting for at least one (see the protocol)."""
        self._check_open()
        check_step(new, set(self._running.values()), self.config.max_model_len)
        model = adapter.name if adapter is not None else self.config.model
        for key, prompt, sp in self._admit(new, model):
            self._running[self._pool.submit(self._answer, prompt, sp, model)] = key
        if not self._running:
            return []
        finished, _ = wait(list(self._running), return_when=FIRST_COMPLETED)
        return [(self._running.pop(f), f.result()) for f in finished]

    def _admit(self, new: Sequence[StepRequest], model: str) -> Sequence[StepRequest]:
        return new

    def _answer(self, prompt: Sequence[int], sp: SamplingParams, model: str) -> Generation:
        raise NotImplementedError

    def in_flight(self) -> int:
        return len(self._running)

    def served_adapter(self, adapter: AdapterRef | None) -> AdapterRef | None:
        """Always raises: a server does not say which adapter files it serves, so it cannot be weight-synced."""
        raise EngineError(f"the {self.name} engine cannot report which adapter files the server serves; weight sync "
                          "needs an engine that loads them (vllm, hf)")

    def close(self) -> None:
        """Stop the request threads (idempotent)."""
        if not self._closed:
            self._closed = True
            self._pool.shutdown(wait=True)

    def _check_open(self) -> None:
        if self._closed:
            raise EngineError(f"{self.name} engine: used after close()")

    # set by the engine's __init__ (declared here for readers and type checkers)
    config: Any
    _pool: Any
    _running: dict
    _closed: bool
