"""The single controller on the in-process backend: exactly-once logging, bounded in-flight episodes, sharding,
reruns after actor deaths, resume — the same logic that runs on Ray (tests/rollout/test_ray_sweep.py)."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest

from bapsql.data.tasks import load_tasks
from bapsql.errors import ConfigError, RolloutError
from bapsql.logs.reader import read_episodes, read_turns
from bapsql.logs.writer import existing_episode_ids
from bapsql.rollout.backend import ActorSpec, LocalBackend
from bapsql.rollout.driver import Driver, DriverConfig, assign_shards, cell_stats
from bapsql.rollout.groups import GroupSampler
from bapsql.rollout.workers import EnvWorker
from bapsql.rollout.writer_host import WriterHost
from tests.rollout.rollout_bench import build_rollout_bench

METHODS = ["workflow.estimate_rewrite", "scripted.drafter@raw"]


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    return load_tasks(build_rollout_bench(tmp_path_factory.mktemp("bench")), "dev")


@pytest.fixture(scope="module")
def specs(tasks):
    return GroupSampler("d", samples_per_group=1).sweep(METHODS, tasks, ["XS", "M"], [0])


class Recording(LocalBackend):
    """A local backend that records the episodes in flight and each call."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.outstanding: dict[int, int] = {}
        self.peak = 0
        self.calls: list[tuple] = []

    def submit(self, key, method, *args):
        ticket = super().submit(key, method, *args)
        self.calls.append((key, method, len(args[0]) if args and isinstance(args[0], list) else 0))
        if method in ("run_scripted", "start"):
            self.outstanding[ticket] = len(args[0])
            self.peak = max(self.peak, sum(self.outstanding.values()))
        return ticket

    def poll(self, timeout=0.0):
        out = super().poll(timeout)
        for o in out:
            self.outstanding.pop(o.ticket, None)
        return out


def _backend(run_dir, n=2, cls=Recording, **kw):
    be = cls(**kw)
    be.start([ActorSpec(("env", i), EnvWorker, (i,)) for i in range(n)]
             + [ActorSpec(("writer", 0), WriterHost, (str(run_dir), "d"), {"flush_episodes": 8})])
    return be


def _close(be):
    be.actors[("writer", 0)].close()


def _assert_exactly_once(run_dir, specs):
    eps = read_episodes(run_dir)
    assert Counter(eps["episode_id"]).most_common(1)[0][1] == 1
    assert set(eps["episode_id"]) == {s.episode_id for s in specs}
    assert eps.groupby("episode_id")["turns"].first().sum() == len(read_turns(run_dir))
    return eps


def test_every_episode_is_logged_exactly_once_and_returned_when_collected(specs, tmp_path):
    be = _backend(tmp_path, batch=1)
    result = Driver(be, 2, config=DriverConfig(in_flight=6, scripted_batch=2)).run(specs, collect=True)
    _close(be)
    eps = _assert_exactly_once(tmp_path, specs)
    assert result.episodes_run == len(specs) and result.episodes_skipped == 0 and result.reruns == 0
    assert sorted(t.episode_id for t in result.trajectories) == sorted(eps["episode_id"])
    assert be.peak <= 6  # the in-flight bound holds
    assert {(c.method, c.budget) for c in result.cells} == {(m, b) for m in METHODS for b in ("XS", "M")}
    assert sum(c.successes for c in result.cells) == int(eps["success"].sum())
    assert not eps["breach"].any() and (eps["invalid_actions"] == 0).all()


def test_episodes_shard_by_database(specs, tmp_path):
    be = _backend(tmp_path)
    result = Driver(be, 2).run(specs, collect=True)
    _close(be)
    worker_of = {}
    for t in result.trajectories:
        assert worker_of.setdefault(t.spec.db_id, t.worker) == t.worker  # one worker per database
    assert set(worker_of.values()) == {0, 1}  # two databases, two workers: both busy
    assert assign_shards(specs, 2) == {db: w for db, w in worker_of.items()}


def test_assign_shards_balances_databases():
    fake = [dataclasses.make_dataclass("S", ["db_id"])(db) for db in "a" * 9 + "b" * 5 + "c" * 4 + "d" * 1]
    shards = assign_shards(fake, 2)
    load = Counter()
    for s in fake:
        load[shards[s.db_id]] += 1
    assert sorted(load.values()) == [9, 10]


@pytest.mark.slow  # a fault drill of a few seconds
def test_a_killed_env_worker_reruns_its_episodes_and_nothing_is_duplicated(specs, tmp_path):
    be = _backend(tmp_path, batch=1)
    killed = []

    def progress(done, total):
        busy = any(key == ("env", 0) for _, key, _, _ in be._queue)  # a call is pending on worker 0
        if done >= 5 and busy and not killed:
            be.kill(("env", 0))
            killed.append(done)

    result = Driver(be, 2, config=DriverConfig(in_flight=8, scripted_batch=2), progress=progress).run(specs)
    _close(be)
    _assert_exactly_once(tmp_path, specs)
    assert killed and result.restarts == {"env": 1} and result.reruns > 0
    assert result.episodes_run == len(specs)


@pytest.mark.slow  # a fault drill of a few seconds
def test_a_killed_writer_gets_its_lost_rows_again(specs, tmp_path):
    """Killed twice while holding unflushed rows: with a call pending (the call dies), then between calls (silently:
    only the new incarnation's acknowledgement tells)."""
    be = _backend(tmp_path, batch=1)
    kills = []

    def progress(done, total):
        w = be.actors[("writer", 0)]
        pending = any(key == ("writer", 0) for _, key, _, _ in be._queue)
        if w._buffered and ((not kills and pending and done >= 9) or (kills == ["busy"] and not pending)):
            be.kill(("writer", 0))
            kills.append("busy" if pending else "idle")

    result = Driver(be, 2, config=DriverConfig(in_flight=4, scripted_batch=2), progress=progress).run(specs)
    _close(be)
    _assert_exactly_once(tmp_path, specs)
    assert kills == ["busy", "idle"] and result.restarts == {"writer": 2}


@pytest.mark.slow  # a fault drill of a few seconds
def test_resume_skips_episodes_already_on_disk(specs, tmp_path):
    be = _backend(tmp_path)
    first = Driver(be, 2).run(specs[:10])
    _close(be)
    done = existing_episode_ids(tmp_path)
    assert first.episodes_run == 10 and len(done) == 10
    be = _backend(tmp_path)  # a fresh session: the writer reads the ids on disk too
    second = Driver(be, 2).run(specs, skip=done)
    _close(be)
    assert second.episodes_skipped == 10 and second.episodes_run == len(specs) - 10
    _assert_exactly_once(tmp_path, specs)


class Crashing(LocalBackend):
    """Every call to env worker 0 crashes it (a poison episode)."""

    def submit(self, key, method, *args):
        ticket = super().submit(key, method, *args)
        if key == ("env", 0):
            self.kill(key)
        return ticket


def test_an_episode_that_keeps_dying_stops_the_run(specs, tmp_path):
    be = _backend(tmp_path, n=1, cls=Crashing)
    with pytest.raises(RolloutError, match="rerun 2 times"):
        Driver(be, 1, config=DriverConfig(in_flight=2, max_reruns=2)).run(specs[:4])
    assert be.restarts()[("env", 0)] == 3  # first run + two reruns


def test_an_error_in_a_worker_is_raised_not_retried(specs, tmp_path):
    bad = dataclasses.replace(specs[0], task=dataclasses.replace(specs[0].task, db_path=str(tmp_path / "no.db")),
                              episode_id="bad")
    be = _backend(tmp_path)
    with pytest.raises(RolloutError, match="run_scripted"):
        Driver(be, 2).run([bad, *specs[1:3]])


def test_bad_driver_arguments(specs, tmp_path):
    with pytest.raises(ConfigError):
        DriverConfig(in_flight=0)
    with pytest.raises(ConfigError):
        Driver(_backend(tmp_path), 0)
    with pytest.raises(ConfigError, match="unique"):
        Driver(_backend(tmp_path), 1, writer=False).run([specs[0], specs[0]])


def test_cell_stats_pool_rows_per_method_and_budget():
    rows = [{"method": "m", "budget": b, "success": s, "total_tokens": 10, "queries": q, "result_tokens": 5,
             "vm_steps": 7, "invalid_actions": 0, "breach": False} for b, s, q in
            [("S", True, 1), ("XS", False, 2), ("S", False, 3)]]
    cells = cell_stats(rows)
    assert [(c.budget, c.episodes, c.successes, c.mean_queries) for c in cells] == [("XS", 1, 0, 2.0),
                                                                                   ("S", 2, 1, 2.0)]


# ------------------------------------------------------------------------------------------------- model episodes
def _model_backend(run_dir, tasks, *, n=2, replicas=1, cls=Recording, **kw):
    from functools import partial

    from bapsql.rollout.agent import AgentConfig
    from bapsql.rollout.engine_host import EngineHost
    from bapsql.tokens import DEFAULT_TOKENIZER_DIR
    from tests.rollout.fakes import PlanEngine, gold_plan

    plans = {t.question: gold_plan(t) for t in tasks}
    agents = {"model.plan": AgentConfig(str(DEFAULT_TOKENIZER_DIR), max_tokens=128)}
    be = cls(**kw)
    be.start([ActorSpec(("env", i), EnvWorker, (i,), {"agents": agents}) for i in range(n)]
             + [ActorSpec(("engine", "model.plan", r), EngineHost, (partial(PlanEngine, plans),), {"threads": None})
                for r in range(replicas)]
             + [ActorSpec(("writer", 0), WriterHost, (str(run_dir), "d"), {"flush_episodes": 8})])
    engines = {"model.plan": [("engine", "model.plan", r) for r in range(replicas)]}
    return be, engines


def test_model_and_scripted_episodes_share_a_sweep_and_generation_is_batched(tasks, tmp_path):
    specs = GroupSampler("d", samples_per_group=2).sweep(["model.plan", "scripted.drafter@raw"], tasks, ["M"], [0])
    be, engines = _model_backend(tmp_path, tasks, replicas=2)
    result = Driver(be, 2, engines=engines, config=DriverConfig(in_flight=16)).run(specs, collect=True)
    steps = [s for k in engines["model.plan"] for s in be.actors[k].engine.steps]  # (admitted, decoding) per call
    _close(be)
    eps = _assert_exactly_once(tmp_path, specs)
    model = eps[eps.method == "model.plan"]
    assert len(model) == 24 and model["success"].all()  # the plans execute the gold SQL and answer its values
    engine_calls = [c for c in be.calls if c[1] == "step" and c[0][0] == "engine"]
    sizes = [c[2] for c in engine_calls]
    assert sum(sizes) == 48 and max(sizes) > 1  # two turns each, admitted in batches across episodes
    assert any(0 < admitted < decoding for admitted, decoding in steps)  # new turns join a running batch
    assert {c[0] for c in engine_calls} == set(engines["model.plan"])  # both replicas serve
    assert result.engine_calls == len(sizes) and result.generated_tokens > 0
    model_trajs = [t for t in result.trajectories if t.spec.method == "model.plan"]
    assert all(t.segments and t.segments[0].logprobs is not None for t in model_trajs)
    assert all(t.segments == () for t in result.trajectories if t.spec.method == "scripted.drafter@raw")


def test_killed_engine_and_env_worker_rerun_model_episodes_exactly_once(tasks, tmp_path):
    specs = GroupSampler("d", samples_per_group=2).sweep(["model.plan"], tasks, ["XS", "M"], [0])
    be, engines = _model_backend(tmp_path, tasks, batch=1)
    kills = []

    def progress(done, total):
        queued = {key for _, key, _, _ in be._queue}
        if "engine" not in kills and done >= 4 and ("engine", "model.plan", 0) in queued:
            be.kill(("engine", "model.plan", 0))
            kills.append("engine")
        elif "env" not in kills and done >= 20 and ("env", 1) in queued:
            be.kill(("env", 1))
            kills.append("env")

    result = Driver(be, 2, engines=engines, config=DriverConfig(in_flight=12), progress=progress).run(specs)
    _close(be)
    eps = _assert_exactly_once(tmp_path, specs)
    assert kills == ["engine", "env"] and result.restarts == {"engine": 1, "env": 1} and result.reruns >= 2
    assert eps[eps.budget == "M"]["success"].all()  # reruns replay the same plans: nothing half-done is logged


def test_live_metrics_and_a_sample_table_go_to_the_monitor(specs, tmp_path):
    from bapsql.logs.monitor import MemoryMonitor

    monitor = MemoryMonitor()
    be = _backend(tmp_path)
    result = Driver(be, 2, monitor=monitor, config=DriverConfig(log_every_s=0.0)).run(specs[:12])
    _close(be)
    step, last = monitor.history[-1]
    assert step == 12 and last["progress/episodes"] == 12 and last["throughput/episodes_per_s"] > 0
    for c in result.cells:
        key = f"{c.method}/{c.budget}"
        assert last[f"success/{key}"] == c.success_rate and last[f"tokens/{key}"] == c.mean_total_tokens
        assert f"result_tokens/{key}" in last and f"vm_steps/{key}" in last and f"queries/{key}" in last
    table = monitor.tables["sample_trajectories"]
    assert {r["method"] for r in table} == {c.method for c in result.cells}
    assert all(r["actions"] and r["turns"] == len(r["actions"].split(" > ")) for r in table)
