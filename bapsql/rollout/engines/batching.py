"""Engines shared by many threads: one scheduler thread batches every caller's request (local engines), or a
thread pool sends them (HTTP engines).

Contract of a turn source (`BatchScheduler`, `PooledTurns`; built by `turn_source`):

- ``submit(prompt_ids, params) -> Future[Generation]`` may be called from any thread and returns at once; the
  future holds the completion (`bapsql.rollout.engines.base.Generation`, exactly what the engine's ``step`` /
  ``generate`` gives for that request) or the engine's error. ``future.cancel()`` withdraws the request: still
  queued, it never reaches the engine; in flight, the scheduler aborts it (``engine.abort(keys)`` where the engine
  has one, e.g. vLLM) or discards its completion. A caller waits with ``future.result(timeout)``.
- ``health()`` is an `EngineHealth`; ``close()`` stops the source (idempotent).

`BatchScheduler(engine)` owns a local engine (vllm, hf) from ONE thread — the only thread that touches it, so an
engine that is not thread-safe (``vllm.LLM``) is safe — and runs every request submitted since its last call
through one ``engine.step(new)`` call (`bapsql.rollout.engines.base.Engine.step`, continuous batching): concurrent
askers share one batch. An engine that admits requests between decoding steps (``admits_between_steps``, vLLM) is
stepped one decoding step at a time (``step(new, max_steps=1)``), so a request submitted while others decode joins
the running batch at the next step; an engine that runs whole batches (HF, `RoundBatching`) takes every request
that arrived while its last batch ran as its next batch. A request whose prompt does not fit the engine's context
(`check_batch`) fails alone with `EngineError`.

Engine death: any exception out of ``engine.step`` (vLLM's ``EngineDeadError``, an ``EngineError``, anything) ends
the batch; so does a death the engine reports itself (``engine.dead_reason()``, e.g. vLLM's engine-core process
gone), which a watchdog thread asks every ``watch_s`` seconds — a busy engine's blocked ``step`` is woken to raise,
an idle one is declared dead at once, so health turns honest without waiting for a request: every request in flight or queued fails with `EngineDead` naming the cause, the dead engine is closed,
``health()`` turns ``dead`` with the reason, and new submits fail at once with `EngineDead` — until ``restart`` (a
callable building a fresh engine; optional) has built a new one: the scheduler then retries every
``restart_backoff_s`` seconds (doubling, at most 60 s), reporting ``restarting``, and serves again once it is up.
The scheduler owns its engine: ``close()`` closes the current one (after a restart, not the one it was given).

`PooledTurns(engine, workers)` is the turn source of an HTTP engine (openai, openai_chat): each request is one
blocking ``engine.generate`` call in its own pool thread (the server batches them); it has no state to die, so
``health()`` is always ``ok`` (a failing server fails each request with `EngineUnavailable`), and ``close()`` leaves
the engine to its caller.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from concurrent.futures import Future, InvalidStateError, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from bapsql.errors import EngineDead, EngineError
from bapsql.rollout.engines.base import HTTP_KINDS, Generation, SamplingParams, check_batch

log = logging.getLogger(__name__)
MAX_BACKOFF_S = 60.0


@dataclass(frozen=True)
class EngineHealth:
    """``state``: ``ok`` | ``dead`` (failed; no restart configured) | ``restarting`` (failed; being rebuilt);
    ``reason``: why it failed ("" when ok); ``restarts``: engines rebuilt so far."""

    state: str
    reason: str = ""
    restarts: int = 0

    @property
    def ok(self) -> bool:
        return self.state == "ok"


def _settle(future: Future, result: Any = None, error: BaseException | None = None) -> None:
    """Resolve ``future`` unless its caller cancelled it (or it is already resolved)."""
    try:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)
    except InvalidStateError:
        pass


class BatchScheduler:
    """One thread that owns a local engine and batches every submitted request (see the module docstring)."""

    def __init__(self, engine: Any, *, adapter: Any = None, restart: Callable[[], Any] | None = None,
                 restart_backoff_s: float = 1.0, watch_s: float = 1.0, name: str = "engine-scheduler"):
        self.engine = engine
        self.adapter = adapter
        self._restart, self._backoff = restart, restart_backoff_s
        self._max_len = int(getattr(getattr(engine, "config", None), "max_model_len", 0) or 0)
        self._ids = itertools.count()
        self._cv = threading.Condition()
        self._queue: list[tuple[str, tuple[int, ...], SamplingParams, Future]] = []
        self._aborts: list[str] = []
        self._running: dict[str, Future] = {}  # keys in the engine -> their futures (scheduler thread only)
        self._health = EngineHealth("ok")
        self._noticed: tuple[Any, str] | None = None  # (engine, why) the watchdog found dead
        self._watch_s = watch_s
        self._closing = False
        self.steps = 0  # engine.step calls made
        self.peak_batch = 0  # most requests in flight at one step (the batching at work)
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()
        self._watchdog = threading.Thread(target=self._watch, name=f"{name}-watchdog", daemon=True)
        self._watchdog.start()

    # -- any thread ------------------------------------------------------------------------------------------------
    def submit(self, prompt_ids: Sequence[int], params: SamplingParams) -> Future:
        """Queue one request for the next batch; the future holds its `Generation` (see the module docstring)."""
        future: Future = Future()
        prompt = tuple(int(t) for t in prompt_ids)
        try:
            if self._max_len:
                check_batch([prompt], [params], self._max_len)
        except EngineError as exc:
            future.set_exception(exc)
            return future
        with self._cv:
            if self._closing:
                raise EngineError("the engine scheduler is closed")
            if not self._health.ok:
                raise EngineDead(self._dead_message())
            key = f"turn-{next(self._ids)}"
            self._queue.append((key, prompt, params, future))
            self._cv.notify_all()
        future.add_done_callback(lambda f, k=key: self._withdrawn(k) if f.cancelled() else None)
        return future

    def health(self) -> EngineHealth:
        with self._cv:
            return self._health

    def close(self, timeout: float = 120.0) -> None:
        """Stop the thread, fail what is left with `EngineError`, and close the engine (idempotent)."""
        with self._cv:
            if self._closing:
                return
            self._closing = True
            self._cv.notify_all()
        self._thread.join(timeout)
        self._watchdog.join(timeout)
        for _key, _p, _sp, future in self._take_queue():
            _settle(future, error=EngineError("the engine scheduler closed before this request ran"))
        for future in self._running.values():
            _settle(future, error=EngineError("the engine scheduler closed while this request ran"))
        self._running.clear()
        if self.engine is not None:
            self.engine.close()

    # -- the scheduler thread ----------------------------------------------------------------------------------------
    def _withdrawn(self, key: str) -> None:
        with self._cv:
            self._aborts.append(key)
            self._cv.notify_all()

    def _take_queue(self) -> list:
        with self._cv:
            queued, self._queue = self._queue, []
        return queued

    def _dead_message(self) -> str:
        h = self._health
        doing = "being restarted" if h.state == "restarting" else "not restarted (restart the server)"
        return f"the model engine died ({h.reason}); it is {doing}"

    def _watch(self) -> None:
        """Ask the engine whether it died (``dead_reason``) every ``watch_s`` seconds (see the module docstring)."""
        while True:
            with self._cv:
                if self._cv.wait_for(lambda: self._closing, timeout=self._watch_s):
                    return
                engine, ok = self.engine, self._health.ok
            probe = getattr(engine, "dead_reason", None)
            reason = probe() if ok and probe is not None else None
            if reason:
                with self._cv:
                    self._noticed = (engine, reason)
                    self._cv.notify_all()

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not (self._queue or self._running or self._aborts or self._closing or self._noticed):
                    self._cv.wait()
                if self._closing:
                    return
                noticed, self._noticed = self._noticed, None
                queued, self._queue = self._queue, []
                aborts, self._aborts = self._aborts, []
            if noticed is not None and noticed[0] is self.engine:  # between steps (a blocked one raises instead)
                self._queue_back(queued)
                self._died(noticed[1])
                continue
            try:
                self._abort(aborts)
                new = []
                for key, prompt, sp, future in queued:
                    if future.cancelled():
                        continue
                    self._running[key] = future
                    new.append((key, prompt, sp))
                if not self._running:
                    continue
                self.peak_batch = max(self.peak_batch, len(self._running))
                finished = self._step(new)
            except BaseException as exc:  # noqa: BLE001 - the engine is gone: see the module docstring
                self._died(f"{type(exc).__name__}: {exc}", exc)
                continue
            for key, gen in finished:
                future = self._running.pop(key, None)
                if future is not None:
                    _settle(future, gen)

    def _queue_back(self, queued: list) -> None:
        with self._cv:
            self._queue[:0] = queued

    def _step(self, new: list[tuple[str, tuple[int, ...], SamplingParams]]) -> list[tuple[str, Generation]]:
        engine = self.engine
        self.steps += 1
        if getattr(engine, "admits_between_steps", False):
            finished = engine.step(new, adapter=self.adapter, max_steps=1)
        else:
            finished = engine.step(new, adapter=self.adapter)
        if not finished and self._running and engine.in_flight() == 0:
            raise EngineError(f"the engine holds none of the {len(self._running)} requests in flight")
        return finished

    def _abort(self, keys: list[str]) -> None:
        gone = [k for k in keys if k in self._running]
        if not gone:
            return
        abort = getattr(self.engine, "abort", None)
        if abort is not None:
            abort(gone)
            for key in gone:
                self._running.pop(key, None)
        # else: the completion is discarded when it finishes (its future is cancelled)

    def _died(self, reason: str, exc: BaseException | None = None) -> None:
        reason = reason[:500]
        log.error("the model engine failed: %s", reason, exc_info=exc)
        with self._cv:
            self._noticed = None
            self._health = EngineHealth("restarting" if self._restart else "dead", reason, self._health.restarts)
            message = self._dead_message()
            queued, self._queue = self._queue, []
        for future in [*self._running.values(), *(q[3] for q in queued)]:
            _settle(future, error=EngineDead(message))
        self._running.clear()
        dead, self.engine = self.engine, None
        try:
            dead.close()
        except Exception:  # noqa: BLE001 - best effort: a dead engine may fail to close too
            log.warning("closing the dead engine failed", exc_info=True)
        if self._restart is not None:
            self._rebuild(reason)

    def _rebuild(self, reason: str) -> None:
        wait = self._backoff
        while True:
            with self._cv:
                if self._closing:
                    return
            try:
                engine = self._restart()
            except Exception as exc:  # noqa: BLE001 - keep trying; health says why
                log.error("restarting the model engine failed: %s", exc)
                with self._cv:
                    self._cv.wait_for(lambda: self._closing, timeout=wait)
                wait = min(MAX_BACKOFF_S, wait * 2)
                continue
            with self._cv:
                self.engine = engine
                self._health = EngineHealth("ok", "", self._health.restarts + 1)
            log.warning("the model engine was restarted after: %s", reason)
            return


class PooledTurns:
    """The turn source of an HTTP engine: one pool thread per request in flight (see the module docstring)."""

    def __init__(self, engine: Any, workers: int, *, adapter: Any = None):
        self.engine, self.adapter = engine, adapter
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="engine-call")
        self._closed = False

    def submit(self, prompt_ids: Sequence[int], params: SamplingParams) -> Future:
        if self._closed:
            raise EngineError("the engine pool is closed")
        prompt = list(prompt_ids)
        return self._pool.submit(lambda: self.engine.generate([prompt], [params], adapter=self.adapter)[0])

    def health(self) -> EngineHealth:
        return EngineHealth("ok")

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._pool.shutdown(wait=True, cancel_futures=True)


def turn_source(engine: Any, kind: str, *, workers: int, restart: Callable[[], Any] | None = None
                ) -> BatchScheduler | PooledTurns:
    """`PooledTurns` for an HTTP engine kind (`HTTP_KINDS`), else a `BatchScheduler` (see the module docstring)."""
    if kind in HTTP_KINDS:
        return PooledTurns(engine, workers)
    return BatchScheduler(engine, restart=restart)
