"""Served questions as budgeted episodes: one request = one episode of the model agent, logged exactly once.

Contract of `Asker.ask(db, question, level, on_turn=None, control=None)` (blocking; the web app calls
`Asker.submit`, which admits the request (`bapsql.serve.control.Admission`: at most ``concurrency`` running and
``max_queue`` waiting, else ``None`` and the app answers 429) and runs it on `Asker.pool`):

- the question becomes a `Task` over the registered database (no gold: the episode is scored by nobody) and plays
  in a `BudgetedSQLEnv` under the service's condition and the requested budget, driven by
  `bapsql.rollout.agent.ModelAgent`, one engine request per turn — the agent loop sweeps use, on one request;
- engine requests go through one turn source (`bapsql.rollout.engines.batching`): a local engine (vllm, hf) is
  owned by ONE scheduler thread that runs every episode's pending turn in one continuous batch (``restart``, when
  given, rebuilds it after it dies); an HTTP engine gets one pool thread per request;
- ``control`` (`bapsql.serve.control.EpisodeControl`; by default one with the ``request_timeout_s`` deadline counted
  from ``submitted``) bounds the episode: past its deadline, or once cancelled (the client went away), the episode
  stops at once — its engine request is withdrawn — its turns so far are logged with failure ``timed_out`` /
  ``cancelled`` (`bapsql.logs.schema.SERVED_FAILURE_KINDS`), and `RequestTimeout` / `RequestCancelled` is raised;
- every pool thread keeps its own warm `DatabaseHandles` and env (neither is thread-safe), so at most
  ``concurrency`` episodes run at once and a database handle never crosses threads; the shield is the only path to
  SQLite (read-only connection, authorizer, VM-step caps);
- prompts are rendered, and the context charged, with the engine config's ``chat_template_kwargs`` (e.g.
  ``enable_thinking: false``), the options an ``openai_chat`` engine sends its server;
- time is split per turn into ``model_s`` (the engine call), ``db_s`` (estimator and shield calls, catalog loads)
  and ``harness_s`` (the rest: env bookkeeping, rendering, the agent); ``on_turn(view)`` gets each turn's view
  (`bapsql.serve.views.turn_view`) as soon as it is played;
- a finished episode goes to the trajectory writer (schema v3: the turns carry the latency split) once, under its
  own episode id, with method ``model.<served model>@<condition>`` — so `bapsql analyze LOG_DIR` reads served
  traffic; `flush()` writes the finished episodes to Parquet off the request path (the app calls it every
  ``flush_s`` seconds and at shutdown; a crash loses at most the episodes of the last ``flush_s`` seconds);
- an engine failure propagates (`EngineError` / `EngineUnavailable` / `EngineDead`: the app answers 503) and that
  unfinished episode is not logged; `Asker.health` is the turn source's (a dead local engine: not ok, with why).
"""

from __future__ import annotations

import re
import threading
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from bapsql.errors import ConfigError, RequestCancelled, RequestTimeout
from bapsql.serve.control import Admission, EpisodeControl
from bapsql.serve.registry import DatabaseRegistry
from bapsql.serve import views

RUN = "serve"


@dataclass(frozen=True)
class ServeOptions:
    """How the service plays episodes. ``concurrency``: episodes at once (env threads); ``max_queue``: requests
    admitted to wait for one (more are refused: 429); ``request_timeout_s``: each request's deadline from its
    arrival (``None``: none); ``max_tokens`` / ``temperature``: sampling of each turn; ``log_dir``: the run folder
    of the Parquet logs."""

    condition: str = "full"
    default_budget: str = "S"
    concurrency: int = 8
    max_tokens: int = 512
    temperature: float = 0.0
    log_dir: str = "bapsql-serve-logs"
    flush_s: float = 2.0
    max_queue: int = 64
    request_timeout_s: float | None = None

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ConfigError(f"serve.concurrency: must be >= 1, got {self.concurrency}")
        if self.max_queue < 0:
            raise ConfigError(f"serve.max_queue: must be >= 0, got {self.max_queue}")
        if self.request_timeout_s is not None and not self.request_timeout_s > 0:
            raise ConfigError(f"serve.request_timeout_s: must be > 0 seconds (or None), got {self.request_timeout_s}")


class _Clock:
    """Seconds spent inside wrapped calls, per thread."""

    def __init__(self) -> None:
        self._local = threading.local()

    @property
    def total(self) -> float:
        return getattr(self._local, "total", 0.0)

    def add(self, dt: float) -> None:
        self._local.total = self.total + dt


class _Timed:
    """Forwards every attribute of ``inner``; calls of its methods add their wall time to ``clock``."""

    def __init__(self, inner: Any, clock: _Clock):
        self._inner, self._clock = inner, clock

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if not callable(attr):
            return attr

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return attr(*args, **kwargs)
            finally:
                self._clock.add(time.perf_counter() - t0)
        return timed


def _timed_handles(handles_cls: type, clock: _Clock) -> type:
    class TimedHandles(handles_cls):  # type: ignore[misc, valid-type]
        """`DatabaseHandles` whose handles time their estimator and shield calls (and the opening itself)."""

        def get(self, db_path):
            t0 = time.perf_counter()
            handle = super().get(db_path)
            clock.add(time.perf_counter() - t0)
            if not isinstance(handle.shield, _Timed):
                handle.estimator, handle.shield = _Timed(handle.estimator, clock), _Timed(handle.shield, clock)
            return handle
    return TimedHandles


@dataclass
class _Slot:
    env: Any
    handles: Any


class Asker:
    """Plays served questions (see the module docstring)."""

    def __init__(self, engine: Any, engine_config: Any, registry: DatabaseRegistry, options: ServeOptions = ServeOptions(),
                 *, calibration: Any = None, cache_dir: Path | None = None, restart: Callable[[], Any] | None = None):
        from bapsql.budgets import load_ladder
        from bapsql.env.conditions import method_name
        from bapsql.env.records import EnvOptions
        from bapsql.logs.writer import TrajectoryWriter
        from bapsql.rollout.agent import AgentConfig, load_template

        tok_dir = engine_config.tokenizer_dir
        if tok_dir is None:
            raise ConfigError("engine.tokenizer: the served engine needs a tokenizer folder (set tokenizer:)")
        self.engine_config, self.registry, self.options = engine_config, registry, options
        self.admission = Admission(options.concurrency, options.max_queue)
        self.ladder = load_ladder()
        self.ladder[options.default_budget]  # unknown default level: ConfigError now, not per request
        self.env_options = EnvOptions().under(options.condition)
        model = str(engine_config.model)
        model = Path(model).name if Path(model).is_dir() else model  # a local folder: its name, not its path
        served = re.sub(r"[^A-Za-z0-9_.-]+", "_", model).strip("._") or "model"
        self.method = method_name(f"model.{served}", options.condition)
        self.template = load_template(tok_dir)
        template_kwargs = dict(engine_config.chat_template_kwargs)  # e.g. enable_thinking: false, as the engine's
        self.agent_config = AgentConfig(model_dir=str(tok_dir), max_tokens=options.max_tokens,
                                        temperature=options.temperature, max_model_len=engine_config.max_model_len,
                                        template_kwargs=template_kwargs)
        from bapsql.tokens import load_token_counter

        # shared by the threads (the tokenizer is reentrant); charges the context as the agent renders it
        self.token_counter = load_token_counter(str(tok_dir), **template_kwargs)
        self.calibration, self.cache_dir = calibration, cache_dir
        self.pool = ThreadPoolExecutor(max_workers=options.concurrency, thread_name_prefix="serve-episode")
        self.db_clock = _Clock()
        self._local = threading.local()
        self._slots: list[_Slot] = []
        self._lock = threading.Lock()
        self.writer = TrajectoryWriter(options.log_dir, RUN, flush_every=1 << 30)
        self._unwritten: list[tuple[dict, tuple]] = []  # finished episodes' rows not yet handed to the writer
        self._flush_lock = threading.Lock()
        self.logged = 0  # episodes finished and queued for the log
        self._closed = False
        from bapsql.rollout.engines.batching import turn_source

        self.turns = turn_source(engine, engine_config.kind, workers=options.concurrency, restart=restart)  # last

    @property
    def engine(self) -> Any:
        """The engine the turn source calls (after a restart, the new one)."""
        return self.turns.engine

    @engine.setter
    def engine(self, engine: Any) -> None:
        self.turns.engine = engine

    def health(self) -> Any:
        """The engine's `bapsql.rollout.engines.batching.EngineHealth`."""
        return self.turns.health()

    # -- per-thread env ------------------------------------------------------------------------------------------
    def _slot(self) -> _Slot:
        slot = getattr(self._local, "slot", None)
        if slot is None:
            from bapsql.env.episode import BudgetedSQLEnv
            from bapsql.env.handles import DatabaseHandles

            handles = _timed_handles(DatabaseHandles, self.db_clock)(
                self.token_counter, calibration=self.calibration, cache_dir=self.cache_dir,
                max_open=max(1, len(self.registry)))
            env = BudgetedSQLEnv(token_counter=handles.token_counter, handles=handles, options=self.env_options)
            slot = self._local.slot = _Slot(env, handles)
            with self._lock:
                self._slots.append(slot)
        return slot

    # -- one request ---------------------------------------------------------------------------------------------
    def control(self, submitted: float | None = None) -> EpisodeControl:
        """A fresh `EpisodeControl` with the service's deadline (``request_timeout_s`` after ``submitted``)."""
        return EpisodeControl.within(self.options.request_timeout_s, submitted)

    def submit(self, db: str, question: str, level: str, control: EpisodeControl, *,
               on_turn: Callable[[dict], None] | None = None) -> Future | None:
        """Admit the request and run `ask` on the pool (the future holds its answer view or error); ``None`` when
        ``concurrency + max_queue`` requests are already in (the caller answers 429; `Admission.retry_after_s`)."""
        if not self.admission.enter():
            return None
        submitted = time.perf_counter()
        try:
            future = self.pool.submit(self.ask, db, question, level, submitted=submitted, on_turn=on_turn,
                                      control=control)
        except BaseException:
            self.admission.leave()
            raise
        future.add_done_callback(lambda _f: self.admission.leave(time.perf_counter() - submitted))
        return future

    def ask(self, db: str, question: str, level: str, *, submitted: float | None = None,
            on_turn: Callable[[dict], None] | None = None, control: EpisodeControl | None = None) -> dict:
        """Play ``question`` on registered database ``db`` under budget ``level``; returns the answer view
        (`bapsql.serve.views.ask_view`). ``submitted`` (a ``perf_counter`` time) counts the wait for a thread;
        ``control`` bounds the episode (see the module docstring)."""
        from bapsql.logs.writer import episode_id
        from bapsql.rollout.agent import ModelAgent
        from bapsql.types import Task

        start, cpu_start = time.perf_counter(), time.thread_time()
        queue_s = start - submitted if submitted is not None else 0.0
        control = control if control is not None else self.control(submitted)
        control.check()  # past its deadline while queued, or its client gone: no episode
        entry = self.registry[db]
        budget = self.ladder[level]
        slot = self._slot()
        task_id = f"q-{uuid.uuid4().hex[:16]}"
        eid = episode_id(RUN, self.method, level, 0, task_id)
        task = Task(task_id=task_id, db_id=entry.name, db_path=str(entry.path), question=question, gold_sql="",
                    source="serve")
        agent = ModelAgent(slot.env, self.template, self.agent_config, episode_key=eid, seed=0)
        db0 = self.db_clock.total
        agent.reset(task, budget)
        timings: list[tuple[float, float, float]] = []  # (model_s, db_s, harness_s) per turn played
        try:
            return self._play(agent, slot, eid, entry.name, level, task, control, on_turn, timings, start=start,
                              cpu_start=cpu_start, queue_s=queue_s, db0=db0)
        except (RequestCancelled, RequestTimeout):  # the turns so far are logged, marked with why it stopped
            self._log(eid, level, task, slot.env.summary(), slot.env.turn_records, timings, failure=control.outcome)
            raise

    def _play(self, agent: Any, slot: _Slot, eid: str, db: str, level: str, task: Any, control: EpisodeControl,
              on_turn: Callable[[dict], None] | None, timings: list[tuple[float, float, float]], *, start: float,
              cpu_start: float, queue_s: float, db0: float) -> dict:
        pending_harness = time.perf_counter() - start  # reset: charged to the first turn
        pending_db = self.db_clock.total - db0
        pending_cpu = time.thread_time() - cpu_start
        turns: list[dict] = []
        while not agent.done:
            control.check()
            t0, c0 = time.perf_counter(), time.thread_time()
            req = agent.request()
            t1, c1 = time.perf_counter(), time.thread_time()
            gen = control.wait(self.turns.submit(req.prompt_ids, req.params))
            t2, c2 = time.perf_counter(), time.thread_time()
            db0 = self.db_clock.total
            text = agent.advance(gen)
            t3, c3 = time.perf_counter(), time.thread_time()
            db_s = self.db_clock.total - db0 + pending_db
            harness_s = max(0.0, (t1 - t0) + (t3 - t2) + pending_harness - db_s)
            pending_harness = pending_db = 0.0
            timings.append((t2 - t1, db_s, harness_s))
            view = views.turn_view(agent.info, slot.env.turn_records[-1], gen, text, timings[-1])
            # CPU seconds of this thread in the harness and database work (load-independent, unlike wall time)
            view["latency"]["harness_cpu_s"] = round((c1 - c0) + (c3 - c2) + pending_cpu, 6)
            pending_cpu = 0.0
            turns.append(view)
            if on_turn is not None:
                on_turn(view)
        summary = slot.env.summary()
        t_log = time.perf_counter()
        self._log(eid, level, task, summary, slot.env.turn_records, timings)
        log_s = time.perf_counter() - t_log
        total_s = time.perf_counter() - start
        return views.ask_view(eid, db, level, self.options.condition, summary,
                              slot.env.ledger.snapshot(), slot.env.evidence, turns, timings,
                              queue_s=queue_s, log_s=log_s, total_s=total_s)

    # -- logging -------------------------------------------------------------------------------------------------
    def _log(self, eid: str, level: str, task: Any, summary: Any, records: Any,
             timings: list[tuple[float, float, float]], failure: str | None = None) -> None:
        """Queue the episode's rows for the writer; ``failure``: the served outcome of an episode that did not run
        to its end (``cancelled`` / ``timed_out``), which replaces the env's failure kind."""
        from bapsql.rollout.groups import EpisodeSpec, episode_rows, group_id

        spec = EpisodeSpec(eid, RUN, self.method, level, 0, 0, 0, task, group_id(task.task_id, level, 0))
        ep, turns = episode_rows(spec, summary, records)
        if failure is not None:
            ep["failure"] = failure
        for row, (model_s, db_s, harness_s) in zip(turns, timings):
            row.update(model_s=round(model_s, 6), db_s=round(db_s, 6), harness_s=round(harness_s, 6))
        with self._lock:
            self._unwritten.append((ep, turns))
            self.logged += 1

    def flush(self) -> int:
        """Hand the finished episodes to the writer and write them to Parquet (off the request path: the app calls
        it every ``flush_s`` seconds and at shutdown); returns how many became durable."""
        with self._flush_lock:
            with self._lock:
                batch, self._unwritten = self._unwritten, []
            for ep, turns in batch:
                self.writer.add_episode(ep, turns)
            if batch:
                self.writer.flush()
        return len(batch)

    def close(self) -> None:
        """Finish running episodes, stop the turn source (a local engine's scheduler closes that engine; an HTTP
        engine is the caller's), flush the log, close the databases (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self.pool.shutdown(wait=True)
        self.turns.close()
        self.flush()
        with self._lock:
            self.writer.close()
            for slot in self._slots:
                slot.handles.close()
