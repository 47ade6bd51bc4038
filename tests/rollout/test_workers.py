"""The plain actor classes without Ray: env worker (scripted and model episodes), engine host, writer host."""

from __future__ import annotations

import pytest

from bapsql.data.tasks import load_tasks
from bapsql.errors import ConfigError
from bapsql.logs.reader import read_episodes, read_turns
from bapsql.logs.writer import existing_episode_ids
from bapsql.rollout.groups import GroupSampler, Prompt
from bapsql.rollout.runner import evaluate
from bapsql.rollout.groups import episode_rows
from bapsql.rollout.workers import EnvWorker, Lost
from bapsql.rollout.writer_host import WriterHost
from tests.rollout.rollout_bench import build_rollout_bench


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    return build_rollout_bench(tmp_path_factory.mktemp("bench"))


@pytest.fixture(scope="module")
def tasks(bench):
    return load_tasks(bench, "dev")


@pytest.fixture(scope="module")
def worker():
    w = EnvWorker(0)
    yield w
    w.close()


def test_scripted_episodes_in_a_worker_equal_the_in_process_runner(bench, tasks, worker, tmp_path):
    """Same ids, same outcomes, same turns: the worker plays exactly what `bapsql eval` plays."""
    specs = GroupSampler("r", samples_per_group=1).sweep(["workflow.estimate_rewrite@full"], tasks[:4], ["XS", "M"], [1])
    trajs = worker.run_scripted(specs)
    assert [t.episode_id for t in trajs] == [s.episode_id for s in specs]
    evaluate(bench, "dev", "workflow.estimate_rewrite", ["XS", "M"], [1], tmp_path / "r", run_name="r", limit=4)
    ref = read_episodes(tmp_path / "r").set_index("episode_id")
    ref_turns = read_turns(tmp_path / "r")
    for t in trajs:
        row = ref.loc[t.episode_id]
        for col in ("success", "correct", "queries", "result_tokens", "vm_steps", "turns", "total_tokens",
                    "group_id", "failure", "answer"):
            assert t.episode[col] == row[col], col
        assert [r["action"] for r in t.turns] == list(
            ref_turns[ref_turns.episode_id == t.episode_id].sort_values("turn")["action"])
        assert t.segments == () and t.worker == 0


def test_worker_keeps_database_handles_warm(worker, tasks):
    specs = GroupSampler("warm", samples_per_group=2).sweep(["scripted.drafter@raw"], tasks, ["S"], [0])
    worker.run_scripted(specs)
    stats = worker.ping()
    assert stats.open_databases == len({t.db_id for t in tasks}) == 2  # one handle per database, reused
    assert stats.episodes_finished >= len(specs)


def test_model_calls_on_unknown_ids_come_back_lost_and_scripted_specs_are_refused(worker, tasks):
    assert worker.step([("nope", object())]) == [Lost("nope")]
    assert worker.abort(["nope"]) == 0
    spec = GroupSampler("r").group("scripted.drafter@raw", Prompt(tasks[0], "XS", 0))[0]
    with pytest.raises(ConfigError):
        worker.start([spec])
    model_spec = GroupSampler("r").group("model.tiny", Prompt(tasks[0], "XS", 0))[0]
    with pytest.raises(ConfigError):  # not a model policy this worker was configured with
        worker.start([model_spec])
    with pytest.raises(ConfigError):  # nor a scripted policy name
        worker.run_scripted([model_spec])


def _items(worker, tasks, run="w", n=3):
    specs = GroupSampler(run, samples_per_group=1).sweep(["scripted.drafter@dashboard"], tasks[:n], ["S"], [0])
    return [(t.episode, t.turns) for t in worker.run_scripted(specs)]


def test_writer_host_dedups_and_acknowledges_durable_ids(worker, tasks, tmp_path):
    items = _items(worker, tasks)
    ids = [ep["episode_id"] for ep, _ in items]
    host = WriterHost(tmp_path, "w", flush_episodes=2)
    ack = host.write(items[:1])
    assert (ack.accepted, ack.duplicates, ack.durable) == (1, 0, ())  # buffered, not yet on disk
    assert existing_episode_ids(tmp_path) == set()
    ack = host.write(items[:1])  # a duplicate while buffered: dropped, not yet durable
    assert (ack.accepted, ack.duplicates, ack.durable) == (0, 1, ())
    ack = host.write(items[1:2])  # two buffered → flush
    assert ack.accepted == 1 and set(ack.durable) == set(ids[:2])
    assert existing_episode_ids(tmp_path) == set(ids[:2])
    ack = host.write(items)  # the first two again (on disk: acked durable), the third buffered
    assert (ack.accepted, ack.duplicates) == (1, 2) and set(ack.durable) == set(ids[:2])
    assert host.close().durable == (ids[2],)
    assert sorted(read_episodes(tmp_path)["episode_id"]) == sorted(ids)
    assert len(read_turns(tmp_path)) == sum(len(t) for _, t in items)


def test_a_restarted_writer_skips_what_is_on_disk_and_acks_it_as_durable(worker, tasks, tmp_path):
    items = _items(worker, tasks)
    first = WriterHost(tmp_path, "w", flush_episodes=100)
    first.write(items[:2])
    first.close()
    second = WriterHost(tmp_path, "w", flush_episodes=100)  # e.g. Ray restarted the actor
    assert second.known() == {ep["episode_id"] for ep, _ in items[:2]}
    ack = second.write(items)
    assert ack.accepted == 1 and ack.duplicates == 2
    assert set(ack.durable) == {ep["episode_id"] for ep, _ in items[:2]}  # already on disk: durable now
    second.close()
    assert len(read_episodes(tmp_path)) == 3


def test_writer_host_flushes_on_time(worker, tasks, tmp_path):
    items = _items(worker, tasks)
    now = [0.0]
    host = WriterHost(tmp_path, "w", flush_episodes=100, flush_s=5.0, clock=lambda: now[0])
    assert host.write(items[:1]).durable == ()
    now[0] = 6.0
    assert host.write(items[1:2]).durable == tuple(ep["episode_id"] for ep, _ in items[:2])
    with pytest.raises(ConfigError):
        WriterHost(tmp_path, "w", flush_episodes=0)


def test_episode_rows_label_every_turn(worker, tasks):
    spec = GroupSampler("lab", samples_per_group=1).group("workflow.direct_aggregation",
                                                          Prompt(tasks[0], "M", 4), policy_version=2)[0]
    (traj,) = worker.run_scripted([spec])
    ep, turns = traj.episode, traj.turns
    assert (ep["run"], ep["episode_id"], ep["group_id"], ep["policy_version"], ep["seed"]) == (
        "lab", spec.episode_id, spec.group_id, 2, 4)
    assert turns and all(t["episode_id"] == spec.episode_id and t["budget"] == "M" for t in turns)
    assert [t["turn"] for t in turns] == list(range(1, len(turns) + 1))
    env = worker._envs["workflow.direct_aggregation"]
    again, again_turns = episode_rows(spec, env.summary(), env.turn_records)
    assert {k: v for k, v in again.items() if k != "wall_s"} == {k: v for k, v in ep.items() if k != "wall_s"}
    assert again_turns == turns


# ------------------------------------------------------------------------------------------------- model episodes
def _plans(tasks):
    from tests.rollout.fakes import gold_plan

    return {t.question: gold_plan(t) for t in tasks}


def test_model_episodes_advance_turn_by_turn_through_an_engine_host(tasks):
    from functools import partial

    from bapsql.rollout.agent import AgentConfig, GenerationRequest
    from bapsql.rollout.groups import Trajectory
    from bapsql.rollout.engine_host import AdapterSpec, EngineHost
    from bapsql.tokens import DEFAULT_TOKENIZER_DIR
    from tests.rollout.fakes import PlanEngine

    worker = EnvWorker(3, agents={"model.plan": AgentConfig(str(DEFAULT_TOKENIZER_DIR), max_tokens=128)})
    host = EngineHost(partial(PlanEngine, _plans(tasks)), threads=None)
    specs = GroupSampler("m", samples_per_group=2).sweep(["model.plan"], tasks[:3], ["M"], [0])
    adapter = AdapterSpec("/nowhere", "policy", 4)
    pending = worker.start(specs)
    assert all(isinstance(p, GenerationRequest) for p in pending) and worker.ping().live_episodes == 6
    finished = []
    while pending:
        gens = host.generate(pending, adapter)
        out = worker.step([(r.episode_id, g) for r, g in zip(pending, gens)])
        finished += [o for o in out if isinstance(o, Trajectory)]
        pending = [o for o in out if isinstance(o, GenerationRequest)]
    assert sorted(t.episode_id for t in finished) == sorted(s.episode_id for s in specs)
    assert all(t.success and t.segments and t.worker == 3 for t in finished)
    assert host.engine.calls == [6, 6] and host.engine.adapters == [("policy", 4)]  # loaded once per version
    stats = host.stats()
    assert stats.requests == 12 and stats.generated_tokens == sum(sum(sum(s.loss_mask) for s in t.segments)
                                                                  for t in finished)
    assert worker.ping().live_episodes == 0
    # a restarted worker does not know the ids: they come back lost
    fresh = EnvWorker(3, agents=worker.agents)
    assert fresh.step([(specs[0].episode_id, gens[0])]) == [Lost(specs[0].episode_id)]
    # aborting drops live episodes
    worker.start(specs[:2])
    assert worker.abort([s.episode_id for s in specs]) == 2 and worker.ping().live_episodes == 0
