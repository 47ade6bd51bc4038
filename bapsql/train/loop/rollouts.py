"""The rollout side of GRPO: actors, the driver, and the engine replicas as weight sync sees them.

`TrainingRollouts` owns one `bapsql.rollout.driver.Driver` over a backend (`LocalBackend` in this process, or the
Ray backend of `bapsql.rollout.ray_shell` on a cluster) with ``env_workers`` `EnvWorker` s, one or more `EngineHost`
replicas of the policy model, and optionally a `WriterHost` that logs every training trajectory as Parquet (under
``<run>/rollouts``; ids are deterministic, so a resumed run never writes an episode twice; ``log_text`` says which
episodes' turns keep their completion / observation text, `bapsql.logs.text`).

- `play(prompts, policy_version)` expands (task, level, seed) prompts into groups of ``group_size`` episodes of the
  model policy, plays them with the current adapter, and returns the groups in prompt order (samples in order).
- `validate(prompts, policy_version)`: one episode per prompt with the same engines and adapter, sampled by the
  ``eval_agent`` given at construction (the evaluation's decoding), logged under the method ``eval_method``.
- As the engine side of `bapsql.train.learner.weight_sync.WeightSync`: `load_adapter(path, name, version)` loads the new
  adapter on EVERY engine replica (in place) and makes it the one the next rollouts use; `replica_served_adapters`
  and `replica_logprobs(...)` return each replica's served adapter and probe logprobs, so the checks cover every
  replica.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any, Sequence

from bapsql.errors import EngineError
from bapsql.rollout.agent import AgentConfig
from bapsql.rollout.backend import ActorSpec
from bapsql.rollout.driver import Driver, DriverConfig, RolloutResult
from bapsql.rollout.engine_host import AdapterSpec, EngineHost
from bapsql.rollout.groups import GroupSampler
from bapsql.rollout.groups import Prompt as GroupPrompt
from bapsql.rollout.workers import EnvWorker
from bapsql.rollout.writer_host import WriterHost
from bapsql.train.algo.sampler import Prompt
from bapsql.types import Task


def call_all(backend: Any, keys: Sequence[tuple], method: str, *args: Any, timeout_s: float = 600.0) -> list[Any]:
    """Call ``method(*args)`` on every actor of ``keys`` and wait for all; values in key order. An actor that
    raises or dies fails the call with `EngineError`."""
    tickets = {backend.submit(k, method, *args): i for i, k in enumerate(keys)}
    values: list[Any] = [None] * len(keys)
    deadline = time.monotonic() + timeout_s
    while tickets:
        if time.monotonic() > deadline:
            raise EngineError(f"{method} on {list(keys)} did not answer within {timeout_s:.0f} s")
        for o in backend.poll(1.0):
            if o.ticket not in tickets:
                continue
            i = tickets.pop(o.ticket)
            if o.error is not None or o.died:
                raise EngineError(f"{o.key}.{method} failed: {'actor died' if o.died else repr(o.error)}")
            values[i] = o.value
    return values


class TrainingRollouts:
    """See the module docstring. ``engine`` is what `EngineHost` accepts (an `EngineConfig`, a factory, or an
    engine object — the latter only with the local backend)."""

    def __init__(self, backend: Any, *, run_name: str, method: str, agent: AgentConfig, engine: Any,
                 tasks: Sequence[Task], group_size: int, env_workers: int = 1, engine_replicas: int = 1,
                 env_options: Any = None, writer_dir: str | None = None, driver_config: DriverConfig = DriverConfig(),
                 engine_threads: int | None = 1, engine_gpus: float = 0.0, worker_cpus: float = 1.0,
                 env_resources: dict[str, float] | None = None, calibration: str | None = None,
                 eval_agent: AgentConfig | None = None, eval_method: str | None = None,
                 log_text: Any = None):
        self.backend = backend
        self.method = method
        self.tasks = {t.task_id: t for t in tasks}
        self.groups = GroupSampler(run_name, samples_per_group=group_size)
        self.engine_keys = [("engine", method, r) for r in range(engine_replicas)]
        agents = {method: agent}
        self.eval_method = None
        if eval_agent is not None:
            if not eval_method or eval_method == method:
                raise ValueError("eval_agent needs its own eval_method name (the logs tell the two apart by it)")
            agents[eval_method] = eval_agent
            self.eval_method = eval_method
        specs = [ActorSpec(("env", i), EnvWorker, kwargs={"index": i, "agents": agents,
                                                           "env_options": env_options, "calibration": calibration},
                           num_cpus=worker_cpus, resources=dict(env_resources or {}), placement="spread")
                 for i in range(env_workers)]
        specs += [ActorSpec(k, EngineHost, args=(engine,), kwargs={"threads": engine_threads}, num_gpus=engine_gpus)
                  for k in self.engine_keys]
        if writer_dir is not None:
            specs.append(ActorSpec(("writer", 0), WriterHost, args=(writer_dir, run_name), kwargs={"text": log_text},
                                   num_cpus=0.5))
        backend.start(specs)
        self.driver = Driver(backend, env_workers, engines={m: self.engine_keys for m in agents},
                             writer=writer_dir is not None, config=driver_config)
        self.adapter: AdapterSpec | None = None
        self.last: RolloutResult | None = None

    # ----------------------------------------------------------------------------------------------- rollouts
    def set_group_size(self, size: int) -> None:
        """Play ``size`` episodes per prompt from now on (an evaluation may want more or fewer than training)."""
        self.groups = GroupSampler(self.groups.run, samples_per_group=size)  # it checks the size

    def play(self, prompts: Sequence[Prompt], policy_version: int) -> list[list[Any]]:
        """Play one group per prompt with the current adapter; groups in prompt order, samples in order."""
        return self._play(self.method, self.groups, prompts, policy_version)

    def validate(self, prompts: Sequence[Prompt], policy_version: int) -> list[Any]:
        """One episode per prompt by the ``eval_agent`` with the current adapter, in prompt order. A prompt's seed
        is part of the episode id: give each validation round its own (e.g. the update) so none is logged twice."""
        if self.eval_method is None:
            raise ValueError("validate() needs the eval_agent and eval_method given at construction")
        one = GroupSampler(self.groups.run, samples_per_group=1)
        return [g[0] for g in self._play(self.eval_method, one, prompts, policy_version)]

    def _play(self, method: str, sampler: GroupSampler, prompts: Sequence[Prompt],
              policy_version: int) -> list[list[Any]]:
        if not prompts:
            return []
        gp = [GroupPrompt(self.tasks[p.task_id], p.level, p.seed) for p in prompts]
        specs = sampler.groups(method, gp, policy_version=policy_version)
        self.driver.adapter = self.adapter
        self.driver.policy_version = policy_version
        self.last = self.driver.run(specs, collect=True)
        by_group: dict[str, list[Any]] = defaultdict(list)
        for t in self.last.trajectories:
            by_group[t.spec.group_id].append(t)
        order = list(dict.fromkeys(s.group_id for s in specs))
        return [sorted(by_group[g], key=lambda t: t.spec.sample) for g in order]

    # ------------------------------------------------------------------------------------- weight-sync engine
    def load_adapter(self, path: str, name: str, version: int) -> AdapterSpec:
        """Load the adapter on every replica in place; later rollouts sample with it."""
        spec = AdapterSpec(str(path), name, int(version))
        call_all(self.backend, self.engine_keys, "load_adapter", spec)
        self.adapter = spec
        return spec

    def replica_logprobs(self, prompt_ids: Sequence[int], completion_ids: Sequence[int],
                         adapter: AdapterSpec | None) -> list[list[float]]:
        """Each replica's logprobs of the probe completion."""
        return call_all(self.backend, self.engine_keys, "logprobs_of", list(prompt_ids), list(completion_ids),
                        adapter)

    def replica_served_adapters(self, adapter: AdapterSpec | None) -> list[Any]:
        """What each replica reports serving for ``adapter`` (`EngineHost.served_adapter`: name, version and digest
        of the files its engine loaded), in replica order: weight sync checks every one against the learner's."""
        return call_all(self.backend, self.engine_keys, "served_adapter", adapter)

    def logprobs_of(self, prompt_ids: Sequence[int], completion_ids: Sequence[int], *,
                    adapter: AdapterSpec | None = None) -> list[float]:
        """The first replica's probe logprobs."""
        return self.replica_logprobs(prompt_ids, completion_ids, adapter)[0]

    def close(self) -> None:
        if self.driver.writer is not None:
            call_all(self.backend, [self.driver.writer], "close")
        self.backend.shutdown()
