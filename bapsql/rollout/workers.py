"""The env worker behind the rollout's env actors (`EnvWorker`), and the `Lost` marker it answers with.

It is one of the plain classes behind the rollout actors; the other two live in their own modules: the engine host
(`EngineHost`, `AdapterSpec`, `set_torch_threads`) in `bapsql.rollout.engine_host`, the trajectory writer host
(`WriterHost`, `WriteAck`) in `bapsql.rollout.writer_host`.

They import no Ray: `bapsql.rollout.ray_shell` wraps each in an actor, the in-process backend of the driver uses
them directly, and tests drive them without Ray.

- `EnvWorker` hosts many concurrent episodes over the databases sharded to it (one warm `DatabaseHandles` per
  tokenizer, so SQLite connections and catalogs stay open across episodes). Scripted policies run whole episodes
  inside the worker (`run_scripted`); model policies advance one turn at a time: `start(specs)` resets their envs
  and returns the first `GenerationRequest` s, `step([(episode_id, generation), ...])` applies completions and
  returns the next requests or the finished `Trajectory` s. An episode id the worker does not host (it was restarted
  and lost its state) comes back as `Lost`, so the driver reruns that episode from scratch.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from bapsql.errors import ConfigError
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
        self._handles: dict[tuple[str, str], Any] = {}  # (counter spec, template options) -> handles
        self._policies: dict[str, Any] = {}
        self._envs: dict[str, Any] = {}
        self._templates: dict[str, Any] = {}
        self._live: dict[str, tuple[EpisodeSpec, ModelAgent]] = {}
        self._finished = 0
        self._busy = 0.0

    # -- shared machinery --------------------------------------------------------------------------------------
    def _handles_for(self, counter_spec: str, template_kwargs: Mapping[str, Any] | None = None):
        """Database handles counting with ``counter_spec``'s tokenizer and the chat framing its template has under
        ``template_kwargs`` (a model policy's options, e.g. ``enable_thinking``)."""
        import json

        key = (counter_spec, json.dumps(dict(template_kwargs or {}), sort_keys=True, default=str))
        if key not in self._handles:
            from bapsql.env.handles import DatabaseHandles
            from bapsql.tokens import load_token_counter

            counter = load_token_counter(counter_spec, **dict(template_kwargs or {}))
            self._handles[key] = DatabaseHandles(counter, cache_dir=self.cache_dir, max_open=self.max_open,
                                                 calibration=self.calibration)
        return self._handles[key]

    def _new_env(self, counter_spec: str, options: Any, method: str = "",
                 template_kwargs: Mapping[str, Any] | None = None):
        from bapsql.env.episode import BudgetedSQLEnv

        handles = self._handles_for(counter_spec, template_kwargs)
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
            env = self._new_env(cfg.model_dir, self.options_for(spec.method), spec.method, cfg.template_kwargs)
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
