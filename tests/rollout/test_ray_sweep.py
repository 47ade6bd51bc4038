"""Sweeps on a private local Ray (slow tier): every episode written exactly once, also when an env worker AND an
engine actor are killed mid-sweep (`ray.kill(actor, no_restart=False)`), and a resumed sweep skips written ids."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from bapsql.logs.reader import read_episodes, read_turns
from bapsql.logs.writer import existing_episode_ids
from tests.rollout.ray_fixtures import local_ray_fixture, tiny_model_fixture  # noqa: F401  (fixtures)
from tests.rollout.rollout_bench import build_rollout_bench

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    return build_rollout_bench(tmp_path_factory.mktemp("bench"))


def _config(bench, methods, *, engines=None, budgets=("XS", "S"), seeds=(0, 1), **workers):
    from bapsql.experiment import ExperimentConfig, SamplingConfig, WorkersConfig, validate

    w = {"env_workers": 2, "env_worker_cpus": 0.5, "engine_cpus": 0.5, "in_flight": 24, "scripted_batch": 2}
    return validate(ExperimentConfig(run="ray", methods=tuple(methods), benchmark=str(bench), split="dev",
                                     budgets=budgets, seeds=seeds, engines=engines or {},
                                     sampling=SamplingConfig(max_tokens=16),
                                     workers=WorkersConfig(**{**w, **workers})))


def _exactly_once(run_dir, n):
    eps = read_episodes(run_dir)
    assert len(eps) == n and Counter(eps["episode_id"]).most_common(1)[0][1] == 1
    assert eps.groupby("episode_id")["turns"].first().sum() == len(read_turns(run_dir))
    return eps


def test_a_sweep_with_a_killed_env_worker_and_engine_actor_writes_every_episode_once(local_ray, bench, tiny_model,
                                                                                     tmp_path):
    from bapsql.rollout.engines.base import EngineConfig
    from bapsql.rollout.sweep import run_sweep

    engine = EngineConfig(kind="hf", model=str(tiny_model), max_model_len=12288, num_threads=1)
    cfg = _config(bench, ["workflow.estimate_rewrite", "scripted.drafter@raw", "model:tiny"], engines={"tiny": engine},
                  budgets=("XS",))
    kills = []

    def on_progress(done, total, be):
        pending = {key for _, key, _ in be._refs.values()}
        if "env" not in kills and done >= 10 and ("env", 0) in pending:
            be.kill(("env", 0))  # ray.kill(actor, no_restart=False): Ray restarts it
            kills.append("env")
        if "engine" not in kills and done >= 10 and ("engine", "tiny", 0) in pending:
            be.kill(("engine", "tiny", 0))
            kills.append("engine")

    s = run_sweep(cfg, out_dir=tmp_path / "run", on_progress=on_progress)
    eps = _exactly_once(tmp_path / "run", 3 * 1 * 2 * 12)
    assert sorted(kills) == ["engine", "env"]
    assert s.result.restarts.get("env", 0) >= 1 and s.result.restarts.get("engine", 0) >= 1
    assert s.result.reruns >= 1 and s.result.episodes_run == len(eps)
    model = eps[eps.method == "model.tiny@full"]
    assert len(model) == 24 and (model["turns"] >= 1).all()
    assert s.result.generated_tokens > 0
    record = json.loads((tmp_path / "run" / "sweep.json").read_text())
    assert record["episodes_run"] == len(eps) and record["reruns"] == s.result.reruns


def test_an_interrupted_sweep_resumes_without_duplicates(local_ray, bench, tmp_path):
    from bapsql.rollout.sweep import run_sweep

    cfg = _config(bench, ["workflow.direct_aggregation", "scripted.drafter@dashboard"], scripted_batch=1, in_flight=4)

    class Interrupted(Exception):
        pass

    def stop(done, total, be):
        if done >= 30:
            raise Interrupted

    with pytest.raises(Interrupted):
        run_sweep(cfg, out_dir=tmp_path / "run", on_progress=stop)
    written = existing_episode_ids(tmp_path / "run")
    assert 0 < len(written) < 96  # what the writer had was flushed when the sweep stopped
    s = run_sweep(cfg, out_dir=tmp_path / "run")
    assert s.result.episodes_skipped == len(written) and s.result.episodes_run == 96 - len(written)
    _exactly_once(tmp_path / "run", 96)


def test_actors_the_cluster_cannot_schedule_fail_loudly_instead_of_hanging(local_ray):
    from bapsql.errors import PlacementError
    from bapsql.rollout.backend import ActorSpec
    from bapsql.rollout.ray_shell import RayBackend
    from bapsql.rollout.workers import EnvWorker

    be = RayBackend(placement_timeout_s=3)
    with pytest.raises(PlacementError, match=r"actor env/0 was not placed on any node within 3 s: it asks for CPU 64, "
                                             r"on any node\. The cluster's nodes offer: \w{8} \(head, .*\): CPU "):
        be.start([ActorSpec(("env", 0), EnvWorker, (0,), num_cpus=64)])
    assert not be.handles  # released
    be.shutdown()


def test_one_model_under_two_conditions_in_one_ray_sweep(local_ray, bench, tiny_model, tmp_path):
    """A model policy runs under any condition: model:tiny@full and @no_interface in one sweep, each logged with its
    condition, and the no_interface prompts offer no estimate / rewrite tools."""
    from bapsql.rollout.engines.base import EngineConfig
    from bapsql.rollout.sweep import run_sweep

    engine = EngineConfig(kind="hf", model=str(tiny_model), max_model_len=12288, num_threads=1)
    cfg = _config(bench, ["model:tiny@full", "model:tiny@no_interface"], engines={"tiny": engine},
                  budgets=("XS",), seeds=(0,))
    assert cfg.methods == ("model.tiny@full", "model.tiny@no_interface")
    run_sweep(cfg, out_dir=tmp_path / "run")
    eps = _exactly_once(tmp_path / "run", 2 * 12)
    assert dict(Counter(zip(eps["method"], eps["condition"]))) == {("model.tiny@full", "full"): 12,
                                                                   ("model.tiny@no_interface", "no_interface"): 12}
    turns = read_turns(tmp_path / "run")
    assert set(turns["condition"]) == {"full", "no_interface"}
    planless = turns[turns.condition == "no_interface"]
    # an untrained model may emit any tool name; under no_interface the planning tools are never valid
    assert not planless.action.isin(["estimate_query", "rewrite_query"]).any()
