"""The single controller of rollouts: schedules episodes on env workers and engines, streams them to the writer.

`Driver(backend, ...).run(specs)` plays every `EpisodeSpec` exactly once and returns a `RolloutResult`:

- episodes are sharded to env workers by database (`assign_shards`: balanced over the sweep's databases, a stable
  hash for databases first seen later), so each worker's SQLite handles stay warm; at most ``in_flight`` episodes
  are in flight at once;
- scripted episodes run whole inside their worker, ``scripted_batch`` per call; model episodes advance a turn at a
  time through the engines' continuous batching (`Engine.step`): each engine replica always has one ``step`` call
  outstanding while it holds requests, every call admits the requests that became ready since the last one (the
  least loaded replica takes them), and returns as soon as one request finishes — so an episode's next turn joins
  the running batch while the other episodes keep decoding, across episodes and workers;
- finished trajectories stream to the writer actor (which dedups by episode id and acknowledges durable ids); with
  ``collect=True`` they are also returned (training needs the token ids, masks and logprobs);
- faults: when an env worker dies, every episode it hosted reruns from scratch on its restarted incarnation (an
  episode id a restarted worker does not know comes back `Lost` and reruns too); when an engine dies, the episodes
  that had a request in flight on it rerun from scratch; when the writer dies — noticed by a failed call or, if it
  died between calls, by a new incarnation id in its next acknowledgement — every row not yet acknowledged durable
  is resent.
  Results of a dead incarnation's calls are ignored (epochs, tickets), episode ids are deterministic and the
  writer dedups, so nothing is lost or written twice. An episode rerun more than ``max_reruns`` times, or an actor
  raising in its own code, stops the run with `RolloutError` (the caller then closes the writer, which flushes
  what it holds; a rerun of the sweep skips it).

The attributes ``adapter`` (the `AdapterSpec` engines sample with) and ``policy_version`` may be changed between
runs (a training loop does, after each weight sync).
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict, deque
from typing import Any, Callable, Sequence

from bapsql.errors import ConfigError, RolloutError
from bapsql.rollout.agent import GenerationRequest
from bapsql.rollout.engine_host import AdapterSpec
from bapsql.rollout.groups import EpisodeSpec, Trajectory, shard_of
from bapsql.rollout.scheduling import DriverConfig, RolloutResult, assign_shards
from bapsql.rollout.stats import CellStats, cell_stats, monitor_metrics, sample_row
from bapsql.rollout.workers import Lost

__all__ = ["CellStats", "Driver", "DriverConfig", "RolloutResult", "assign_shards"]


class _Ep:
    """Driver-side state of one episode in flight."""

    __slots__ = ("spec", "worker", "epoch", "phase", "ticket", "request", "engine", "rkey")

    def __init__(self, spec: EpisodeSpec, worker: int, epoch: int):
        self.spec, self.worker, self.epoch = spec, worker, epoch
        self.phase = "queued"  # queued | worker | awaiting | generating
        self.ticket: int | None = None
        self.request: GenerationRequest | None = None
        self.engine: tuple | None = None  # the engine replica holding its request (phase generating)
        self.rkey: str | None = None  # that request's key (unique per request: results of a rerun's past are stale)


class Driver:
    """See the module docstring.

    ``engines`` maps each model-policy method to the keys of its engine replicas (``("engine", name, r)``); methods
    given the same keys share those replicas, their waiting requests batched into one ``step`` call;
    ``adapter`` is the LoRA adapter engines sample with (None: base weights); ``monitor`` a
    `bapsql.logs.monitor.Monitor`; ``progress(done, total)`` is called as episodes finish.
    """

    def __init__(self, backend: Any, n_env_workers: int, *, engines: dict[str, list[tuple]] | None = None,
                 writer: bool = True, config: DriverConfig = DriverConfig(), monitor: Any = None,
                 progress: Callable[[int, int], None] | None = None, adapter: AdapterSpec | None = None):
        if n_env_workers < 1:
            raise ConfigError(f"at least one env worker is needed, got {n_env_workers}")
        self.backend = backend
        self.n_workers = n_env_workers
        self.engines = {m: list(keys) for m, keys in (engines or {}).items()}
        self._sharing: dict[tuple, list[str]] = {}  # replicas -> the methods they serve, batched together
        for method, keys in self.engines.items():
            self._sharing.setdefault(tuple(keys), []).append(method)
        self.writer = ("writer", 0) if writer else None
        self.config = config
        self.monitor = monitor
        self.progress = progress
        self.adapter = adapter
        self.policy_version = adapter.version if adapter is not None else 0

    # ---------------------------------------------------------------------------------------------------------------
    def run(self, specs: Sequence[EpisodeSpec], *, skip: set[str] | frozenset[str] = frozenset(),
            collect: bool = False) -> RolloutResult:
        """Play every spec whose id is not in ``skip`` (see the module docstring)."""
        t0 = time.perf_counter()
        todo = [s for s in specs if s.episode_id not in skip]
        if len({s.episode_id for s in todo}) != len(todo):
            raise ConfigError("episode ids must be unique within a run")
        missing = {s.method for s in todo if s.method in self.engines and not self.engines[s.method]}
        if missing:
            raise ConfigError(f"no engine replicas for model methods {sorted(missing)}")
        self._shards = assign_shards(todo, self.n_workers)
        # per worker: model episodes and scripted episodes queue separately (neither waits behind the other)
        self._queues: list[dict[bool, deque[EpisodeSpec]]] = [{True: deque(), False: deque()}
                                                              for _ in range(self.n_workers)]
        for s in todo:
            self._queues[self._shard(s.db_id)][s.method in self.engines].append(s)
        self._eps: dict[str, _Ep] = {}
        self._tickets: dict[int, tuple[str, list[str]]] = {}  # ticket -> (kind, episode ids)
        self._awaiting: dict[str, list[str]] = defaultdict(list)  # method -> episode ids awaiting generation
        self._engine_busy: dict[tuple, int | None] = {k: None for keys in self.engines.values() for k in keys}
        self._engine_load: dict[tuple, int] = {k: 0 for k in self._engine_busy}  # requests in flight per replica
        self._rkeys: dict[str, str] = {}  # request key -> episode id
        self._rseq = 0
        self._scripted_busy = [False] * self.n_workers
        self._epoch = [0] * self.n_workers  # handled deaths per env worker
        self._epoch_of: dict[int, int] = {}  # env ticket -> worker epoch when it was submitted
        self._reruns: Counter[str] = Counter()
        self._pending_write: dict[str, tuple[dict, tuple[dict, ...]]] = {}
        self._write_tickets: dict[int, list[str]] = {}
        self._to_write: list[str] = []
        self._writer_incarnation: str | None = None
        self._flush_rounds = 0
        self._collected: list[Trajectory] = []
        self._collect = collect
        self._rows: list[dict] = []
        self._samples: dict[str, Trajectory] = {}  # first finished trajectory per method (the monitor's table)
        self._generated = self._engine_calls = 0
        self._restarts: Counter[str] = Counter()
        total, done = len(todo), 0
        self._last_log, self._t0 = time.monotonic(), time.monotonic()
        try:
            while done < total or self._tickets or self._pending_write:
                self._fill()
                self._dispatch_generation()
                self._send_writes()
                if done == total and not self._write_tickets and self._pending_write and self.writer:
                    self._submit(self.writer, "flush", kind="flush", ids=list(self._pending_write))
                if not self._tickets:
                    raise RolloutError(f"the rollout stalled with {total - done} episodes unfinished and no call "
                                       "in flight (a scheduling bug)")
                for outcome in self.backend.poll(self.config.poll_s):
                    done += self._handle(outcome)
                if self.progress is not None:
                    self.progress(done, total)
                self._maybe_log(done, total)
        finally:
            self._tickets.clear()
        self._maybe_log(done, total, force=True)
        if self.monitor is not None and self._samples:
            self.monitor.log_table("sample_trajectories", [sample_row(t) for t in self._samples.values()])
        return RolloutResult(
            episodes_run=len(self._rows), episodes_skipped=len(specs) - len(todo), reruns=sum(self._reruns.values()),
            restarts=dict(self._restarts), generated_tokens=self._generated, engine_calls=self._engine_calls,
            wall_s=time.perf_counter() - t0, cells=cell_stats(self._rows), trajectories=tuple(self._collected))

    # ---------------------------------------------------------------------------------------------------------------
    def _shard(self, db_id: str) -> int:
        return self._shards[db_id] if db_id in self._shards else shard_of(db_id, self.n_workers)

    def _submit(self, key: tuple, method: str, *args: Any, kind: str, ids: list[str]) -> int:
        ticket = self.backend.submit(key, method, *args)
        self._tickets[ticket] = (kind, ids)
        if key[0] == "env":
            self._epoch_of[ticket] = self._epoch[key[1]]
        if kind in ("write", "flush"):
            self._write_tickets[ticket] = ids
        return ticket

    def _fill(self) -> None:
        """Start queued episodes, worker by worker, up to the in-flight bound."""
        room = self.config.in_flight - len(self._eps)
        progress = True
        while room > 0 and progress:
            progress = False
            for w, queues in enumerate(self._queues):
                if room > 0 and queues[False] and not self._scripted_busy[w]:
                    batch = self._take(queues[False], min(room, self.config.scripted_batch))
                    self._scripted_busy[w] = True
                    self._launch(w, batch, "run_scripted")
                    room -= len(batch)
                    progress = True
                if room > 0 and queues[True]:
                    # a fair share of the room, so every worker's model episodes get started
                    share = max(1, room // self.n_workers)
                    batch = self._take(queues[True], min(room, share))
                    self._launch(w, batch, "start")
                    room -= len(batch)
                    progress = True

    @staticmethod
    def _take(queue: deque, n: int) -> list[EpisodeSpec]:
        return [queue.popleft() for _ in range(min(n, len(queue)))]

    def _launch(self, w: int, batch: list[EpisodeSpec], method: str) -> None:
        ids = []
        for s in batch:
            ep = _Ep(s, w, self._epoch[w])
            ep.phase = "worker"
            self._eps[s.episode_id] = ep
            ids.append(s.episode_id)
        ticket = self._submit(("env", w), method, batch, kind=method, ids=ids)
        for eid in ids:
            self._eps[eid].ticket = ticket

    def _dispatch_generation(self) -> None:
        """Every replica without a call outstanding gets a ``step`` call if it holds requests or new ones wait; the
        waiting requests go to the least loaded of those replicas."""
        for keys, methods in self._sharing.items():
            idle = [k for k in keys if self._engine_busy[k] is None]
            if not idle:
                continue
            waiting = [eid for method in methods for eid in self._awaiting.get(method, ())
                       if eid in self._eps and self._eps[eid].phase == "awaiting"]
            for method in methods:
                self._awaiting[method] = []
            parts: dict[tuple, list[str]] = {k: [] for k in idle}
            for eid in waiting:
                parts[min(idle, key=lambda k: self._engine_load[k] + len(parts[k]))].append(eid)
            for key in idle:
                if not parts[key] and not self._engine_load[key]:
                    continue
                items = []
                for eid in parts[key]:
                    ep = self._eps[eid]
                    self._rseq += 1
                    ep.phase, ep.engine, ep.rkey, ep.ticket = "generating", key, f"{eid}#{self._rseq}", None
                    self._rkeys[ep.rkey] = eid
                    items.append((ep.rkey, ep.request))
                self._engine_busy[key] = self._submit(key, "step", items, self.adapter, kind="generate",
                                                      ids=parts[key])
                self._engine_load[key] += len(items)
                self._engine_calls += 1

    def _send_writes(self) -> None:
        if self.writer and self._to_write:
            ids, self._to_write = self._to_write, []
            self._submit(self.writer, "write", [self._pending_write[eid] for eid in ids], kind="write", ids=ids)

    # ---------------------------------------------------------------------------------------------------------------
    def _handle(self, o: Any) -> int:
        """Apply one outcome; returns how many episodes finished."""
        kind, ids = self._tickets.pop(o.ticket, (None, []))
        if kind is None:
            return 0
        if kind in ("write", "flush"):
            self._write_tickets.pop(o.ticket, None)
        if o.key[0] == "env" and o.ticket in self._epoch_of and not o.died:
            self._epoch_of.pop(o.ticket)
        if o.error is not None:
            raise RolloutError(f"{o.key} failed in {o.method}: {type(o.error).__name__}: {o.error}") from o.error
        if o.key[0] == "engine":
            self._engine_busy[o.key] = None
        if o.died:
            return self._died(o, kind, ids)
        if kind in ("write", "flush"):
            return self._acked(o.value, final=kind == "flush")
        if kind == "abort":
            return 0
        if kind == "generate":
            return self._generated_batch(o, ids)
        if kind == "run_scripted":
            self._scripted_busy[o.key[1]] = False
        finished = 0
        for item in o.value:
            finished += self._worker_result(o.ticket, item)
        return finished

    def _acked(self, ack: Any, *, final: bool = False) -> int:
        """A writer acknowledgement: drop durable rows; if the writer restarted since the last answer (it may have
        died between calls, silently), resend everything not yet durable — the writer dedups. After the final
        flush every row sent must be durable; any that is not was lost and is resent (a few rounds at most)."""
        for eid in ack.durable:
            self._pending_write.pop(eid, None)
        restarted = self._writer_incarnation is not None and ack.incarnation != self._writer_incarnation
        if restarted:
            self._restarts["writer"] += 1
        self._writer_incarnation = ack.incarnation
        if final and self._pending_write:
            self._flush_rounds += 1
            if self._flush_rounds > 3:
                raise RolloutError(f"{len(self._pending_write)} episodes were never acknowledged durable by the "
                                   "writer after 3 resends")
        if restarted or (final and self._pending_write):
            self._to_write = list(dict.fromkeys([*self._to_write, *self._pending_write]))
        return 0

    def _generated_batch(self, o: Any, ids: list[str]) -> int:
        self._engine_load[o.key] -= len(o.value)
        by_worker: dict[int, list] = defaultdict(list)
        for rkey, gen in o.value:
            self._generated += len(gen.completion_ids)
            ep = self._eps.get(self._rkeys.pop(rkey, ""))
            if ep is None or ep.rkey != rkey:  # rerun since this request was made: stale
                continue
            ep.engine = ep.rkey = None
            by_worker[ep.worker].append((ep.spec.episode_id, gen))
        for w, items in by_worker.items():
            ticket = self._submit(("env", w), "step", items, kind="step", ids=[e for e, _ in items])
            for eid, _ in items:
                self._eps[eid].phase, self._eps[eid].ticket = "worker", ticket
        return 0

    def _worker_result(self, ticket: int, item: Any) -> int:
        eid = item.episode_id
        ep = self._eps.get(eid)
        if ep is None or ep.ticket != ticket:
            return 0
        if isinstance(item, Lost):
            self._rerun(ep, "lost by its worker")
            return 0
        if isinstance(item, GenerationRequest):
            ep.phase, ep.request, ep.ticket = "awaiting", item, None
            self._awaiting[ep.spec.method].append(eid)
            return 0
        assert isinstance(item, Trajectory)
        del self._eps[eid]
        self._rows.append(item.episode)
        self._samples.setdefault(item.spec.method, item)
        if self._collect:
            self._collected.append(item)
        if self.writer:
            self._pending_write[eid] = (item.episode, item.turns)
            self._to_write.append(eid)
        return 1

    def _died(self, o: Any, kind: str, ids: list[str]) -> int:
        what = o.key[0]
        if kind in ("write", "flush"):  # the restarted writer lost its buffer: resend what is not durable
            self._to_write = list(dict.fromkeys([*self._to_write, *self._pending_write]))
            return 0
        if what == "env":
            w = o.key[1]
            epoch = self._epoch_of.pop(o.ticket, self._epoch[w])
            if epoch < self._epoch[w]:  # this incarnation's death was already handled
                return 0
            self._epoch[w] += 1
            self._restarts[what] += 1
            self._scripted_busy[w] = False
            victims = [ep for ep in self._eps.values() if ep.worker == w and ep.epoch <= epoch]
        else:  # an engine: every request it held is gone
            self._restarts[what] += 1
            self._engine_load[o.key] = 0
            victims = [ep for ep in self._eps.values() if ep.phase == "generating" and ep.engine == o.key]
            for ep in victims:
                self._rkeys.pop(ep.rkey or "", None)
            by_worker: dict[int, list[str]] = defaultdict(list)
            for ep in victims:
                by_worker[ep.worker].append(ep.spec.episode_id)
            for w, eids in by_worker.items():
                self._submit(("env", w), "abort", eids, kind="abort", ids=[])
        for ep in victims:
            self._rerun(ep, f"{o.key} died")
        return 0

    def _rerun(self, ep: _Ep, why: str) -> None:
        eid = ep.spec.episode_id
        self._reruns[eid] += 1
        if self._reruns[eid] > self.config.max_reruns:
            raise RolloutError(f"episode {eid} ({ep.spec.method}, {ep.spec.task_id}@{ep.spec.level}) was rerun "
                               f"{self.config.max_reruns} times and failed again: {why}")
        del self._eps[eid]
        if eid in self._awaiting.get(ep.spec.method, ()):
            self._awaiting[ep.spec.method].remove(eid)
        self._queues[ep.worker][ep.spec.method in self.engines].appendleft(ep.spec)

    # ---------------------------------------------------------------------------------------------------------------
    def _maybe_log(self, done: int, total: int, *, force: bool = False) -> None:
        if self.monitor is None:
            return
        now = time.monotonic()
        if not force and now - self._last_log < self.config.log_every_s:
            return
        self._last_log = now
        elapsed = max(now - self._t0, 1e-9)
        metrics = monitor_metrics(self._rows, done=done, total=total, elapsed_s=elapsed, generated=self._generated,
                                  reruns=sum(self._reruns.values()))
        self.monitor.log(metrics, step=done)
