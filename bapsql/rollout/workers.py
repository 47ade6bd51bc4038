"""The plain classes behind the rollout actors: env worker, engine host, trajectory writer host.

They import no Ray: `bapsql.rollout.ray_shell` wraps each in an actor, the in-process backend of the driver uses
them directly, and tests drive them without Ray.

- `EnvWorker` hosts many concurrent episodes over the databases sharded to it (one warm `DatabaseHandles` per
  tokenizer, so SQLite connections and catalogs stay open across episodes). Scripted policies run whole episodes
  inside the worker (`run_scripted`); model policies advance one turn at a time: `start(specs)` resets their envs
  and returns the first `GenerationRequest` s, `step([(episode_id, generation), ...])` applies completions and
  returns the next requests or the finished `Trajectory` s. An episode id the worker does not host (it was restarted
  and lost its state) comes back as `Lost`, so the driver reruns that episode from scratch.
- `EngineHost` wraps one engine (`bapsql.rollout.engines`): `generate(requests, adapter)` for all waiting episodes
  in one batched call; the adapter (LoRA) named by the caller is loaded on first use, so a restarted host catches
  up by itself. Sets the process's torch threads (CPU engines collapse under thread oversubscription).
- `WriterHost` owns a `bapsql.logs.writer.TrajectoryWriter`: dedups by episode id (ids on disk when it starts, and
  every id it accepted since), flushes every ``flush_episodes`` episodes or ``flush_s`` seconds, and acknowledges
  which episode ids are durable on disk, so the driver can resend only what a crashed writer lost.
"""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from bapsql.errors import ConfigError, EnvStateError
from bapsql.rollout.agent import AgentConfig, GenerationRequest, ModelAgent, load_template
from bapsql.rollout.groups import EpisodeSpec, Trajectory, episode_rows


@dataclass(frozen=True)
class Lost:
    """An episode the worker no longer hosts (its state died with a previous incarnation of the worker)."""

    episode_id: str


@dataclass(frozen=True)
class WorkerStats:
    """What a worker reports about itself."""

    index: int
    pid: int
    live_episodes: int
    episodes_finished: int
    open_databases: int
    busy_s: float


class EnvWorker:
    """Hosts episodes of the databases sharded to it (see the module docstring).

    ``agents`` maps model-policy method names to their `AgentConfig`; every other method name is a scripted policy
    (`bapsql.policies.registry.make_policy`). ``token_counter`` is the scripted policies' tokenizer spec
    (`bapsql.tokens.load_token_counter`); a model policy's env counts with its own model folder's tokenizer.
    """

    def __init__(self, index: int = 0, *, agents: Mapping[str, AgentConfig] | None = None,
                 token_counter: str = "default", env_options: Any = None, cache_dir: str | None = None,
                 max_open: int = 16, calibration: str | None = None, placebo_dir: str | None = None):
        from bapsql.budgets import load_ladder
        from bapsql.env.records import EnvOptions

        self.index = int(index)
        self.agents = dict(agents or {})
        self.counter_spec = token_counter
        self.env_options = env_options if env_options is not None else EnvOptions()
        self.cache_dir = Path(cache_dir) if cache_dir else None
        self.max_open = max_open
        self.calibration = None
        if calibration is not None:
            from bapsql.db.calibration import load_calibration

            self.calibration = load_calibration(calibration)
        self.placebo_dir = Path(placebo_dir) if placebo_dir else None
        self._placebo: dict[str, Any] = {}
        self.ladder = load_ladder()
        self._handles: dict[str, Any] = {}
        self._policies: dict[str, Any] = {}
        self._envs: dict[str, Any] = {}
        self._templates: dict[str, Any] = {}
        self._live: dict[str, tuple[EpisodeSpec, ModelAgent]] = {}
        self._finished = 0
        self._busy = 0.0

    # -- shared machinery --------------------------------------------------------------------------------------
    def _handles_for(self, counter_spec: str):
        if counter_spec not in self._handles:
            from bapsql.env.handles import DatabaseHandles
            from bapsql.tokens import load_token_counter

            self._handles[counter_spec] = DatabaseHandles(load_token_counter(counter_spec), cache_dir=self.cache_dir,
                                                          max_open=self.max_open, calibration=self.calibration)
        return self._handles[counter_spec]

    def _new_env(self, counter_spec: str, options: Any, method: str = ""):
        from bapsql.env.episode import BudgetedSQLEnv

        handles = self._handles_for(counter_spec)
        placebo = self._placebo_for(method) if options.condition.estimates == "permuted" else None
        return BudgetedSQLEnv(token_counter=handles.token_counter, handles=handles, options=options, placebo=placebo)

    def _placebo_for(self, method: str):
        """The placebo pool of ``method`` (loaded once from the sweep's ``placebo/`` folder; a restarted worker
        reloads it)."""
        if method not in self._placebo:
            import json

            from bapsql.env.placebo import pool_from_json

            path = self.placebo_dir / f"{method}.json" if self.placebo_dir else None
            if path is None or not path.is_file():
                raise ConfigError(f"{method}: no placebo pool at {path}; a sweep records it before the method runs")
            self._placebo[method] = pool_from_json(json.loads(path.read_text()))
        return self._placebo[method]

    def options_for(self, method: str):
        """The env options of a method ``P@C``: the worker's options under the method's condition."""
        from bapsql.env.conditions import split_method

        return self.env_options.under(split_method(method)[1])

    def is_model(self, method: str) -> bool:
        return method in self.agents

    def ping(self) -> WorkerStats:
        """Liveness and load."""
        return WorkerStats(self.index, os.getpid(), len(self._live), self._finished,
                           sum(len(h) for h in self._handles.values()), round(self._busy, 6))

    # -- scripted policies ---------------------------------------------------------------------------------------
    def run_scripted(self, specs: Sequence[EpisodeSpec]) -> list[Trajectory]:
        """Play each spec's whole episode with its scripted policy, in order; one env per method stays warm."""
        from bapsql.policies.registry import make_policy
        from bapsql.rollout.runner import play_episode

        t0 = time.perf_counter()
        out = []
        for spec in specs:
            if self.is_model(spec.method):
                raise ConfigError(f"{spec.method} is a model policy; use start()/step(), not run_scripted()")
            if spec.method not in self._policies:
                policy = make_policy(spec.method)
                self._policies[spec.method] = policy
                self._envs[spec.method] = self._new_env(self.counter_spec, self.options_for(spec.method),
                                                        spec.method)
            policy, env = self._policies[spec.method], self._envs[spec.method]
            summary = play_episode(env, policy, spec.task, self.ladder[spec.level], spec.sample_seed)
            ep, turns = episode_rows(spec, summary, env.turn_records)
            out.append(Trajectory(spec, ep, turns, (), self.index))
        self._finished += len(out)
        self._busy += time.perf_counter() - t0
        return out

    # -- model policies --------------------------------------------------------------------------------------------
    def _template(self, method: str):
        if method not in self._templates:
            self._templates[method] = load_template(self.agents[method].model_dir)
        return self._templates[method]

    def _next(self, eid: str) -> GenerationRequest | Trajectory:
        spec, agent = self._live[eid]
        if not agent.done:
            return agent.request()
        del self._live[eid]
        self._finished += 1
        ep, turns = episode_rows(spec, agent.env.summary(), agent.env.turn_records)
        return Trajectory(spec, ep, turns, agent.segments(), self.index)

    def start(self, specs: Sequence[EpisodeSpec]) -> list[GenerationRequest | Trajectory]:
        """Reset one env per model episode; return each episode's first request (or its trajectory, when the
        episode ended at reset). Starting an id that is already live restarts it from scratch."""
        t0 = time.perf_counter()
        out = []
        for spec in specs:
            if not self.is_model(spec.method):
                raise ConfigError(f"{spec.method} is not a model policy of this worker; known: {sorted(self.agents)}")
            cfg = self.agents[spec.method]
            env = self._new_env(cfg.model_dir, self.options_for(spec.method), spec.method)
            agent = ModelAgent(env, self._template(spec.method), cfg, episode_key=spec.episode_id,
                               seed=spec.sample_seed)
            agent.reset(spec.task, self.ladder[spec.level])
            self._live[spec.episode_id] = (spec, agent)
            out.append(self._next(spec.episode_id))
        self._busy += time.perf_counter() - t0
        return out

    def step(self, items: Sequence[tuple[str, Any]]) -> list[GenerationRequest | Trajectory | Lost]:
        """Apply ``(episode_id, Generation)`` pairs; return, in order, each episode's next request, its finished
        trajectory, or `Lost` when this worker does not host the id."""
        t0 = time.perf_counter()
        out: list[GenerationRequest | Trajectory | Lost] = []
        for eid, gen in items:
            if eid not in self._live:
                out.append(Lost(eid))
                continue
            self._live[eid][1].advance(gen)
            out.append(self._next(eid))
        self._busy += time.perf_counter() - t0
        return out

    def abort(self, episode_ids: Sequence[str]) -> int:
        """Drop live episodes (their results are discarded); returns how many were live."""
        return sum(self._live.pop(eid, None) is not None for eid in episode_ids)

    def close(self) -> None:
        """Close every database handle."""
        self._live.clear()
        for h in self._handles.values():
            h.close()
        self._handles.clear()
        self._envs.clear()


# ---------------------------------------------------------------------------------------------------- engine host
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


# ---------------------------------------------------------------------------------------------------- writer host
@dataclass(frozen=True)
class WriteAck:
    """What a writer call did: rows ``accepted`` (new ids), ``duplicates`` dropped, the episode ids that became
    durable on disk during the call (``durable``), and which incarnation of the writer answered (a change means it
    was restarted and lost whatever it had buffered)."""

    accepted: int
    duplicates: int
    durable: tuple[str, ...]
    incarnation: str = ""


class WriterHost:
    """A deduplicating, periodically flushing `TrajectoryWriter` (see the module docstring)."""

    def __init__(self, run_dir: str | Path, run_name: str, *, flush_episodes: int = 256, flush_s: float = 15.0,
                 clock: Callable[[], float] = time.monotonic):
        from bapsql.logs.writer import TrajectoryWriter, existing_episode_ids

        if flush_episodes < 1:
            raise ConfigError(f"flush_episodes must be at least 1, got {flush_episodes}")
        self.run_dir = Path(run_dir)
        self._writer = TrajectoryWriter(self.run_dir, run_name, flush_every=10**9)  # this class decides flushes
        self._seen: set[str] = existing_episode_ids(self.run_dir)
        self._durable: set[str] = set(self._seen)
        self._buffered: list[str] = []
        self.flush_episodes = flush_episodes
        self.flush_s = flush_s
        self._clock = clock
        self._last_flush = clock()
        self.episodes_written = 0
        self.incarnation = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"

    def known(self) -> set[str]:
        """Every episode id on disk or accepted (the ids a resumed sweep skips)."""
        return set(self._seen)

    def write(self, items: Sequence[tuple[Mapping[str, Any], Sequence[Mapping[str, Any]]]]) -> WriteAck:
        """Buffer ``(episode_row, turn_rows)`` items whose ids are new; flush when due. Duplicates already on disk
        are acknowledged as durable (a resend after a crash must not wait for them forever)."""
        accepted = dup = 0
        already: list[str] = []
        for ep, turns in items:
            eid = ep["episode_id"]
            if eid in self._seen:
                dup += 1
                if eid in self._durable:
                    already.append(eid)
                continue
            self._writer.add_episode(ep, turns)
            self._seen.add(eid)
            self._buffered.append(eid)
            accepted += 1
        due = len(self._buffered) >= self.flush_episodes or self._clock() - self._last_flush >= self.flush_s
        return WriteAck(accepted, dup, tuple(already) + (self._flush() if due else ()), self.incarnation)

    def _flush(self) -> tuple[str, ...]:
        self._writer.flush()
        self._last_flush = self._clock()
        done, self._buffered = tuple(self._buffered), []
        self._durable.update(done)
        self.episodes_written += len(done)
        return done

    def flush(self) -> WriteAck:
        """Write everything buffered now."""
        return WriteAck(0, 0, self._flush(), self.incarnation)

    def close(self) -> WriteAck:
        """Flush and close the writer."""
        ack = self.flush()
        self._writer.close()
        return ack

    def files(self) -> list[str]:
        return [str(p) for p in self._writer.files]
