"""Engine phases (``workers.engine_phases``): the groups a sweep runs one after another, the narrowed config of each,
and a local sweep of two engines in two phases — every episode written once, the methods naming one engine served by
one shared engine host, one ``sweep.json`` for the whole config."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from bapsql.experiment import ExperimentConfig, MethodScope, WorkersConfig
from bapsql.logs.reader import read_episodes
from bapsql.rollout.phases import engine_phases, phase_experiment
from tests.rollout.ray_fixtures import tiny_model_fixture  # noqa: F401  (fixture)
from tests.rollout.rollout_bench import build_rollout_bench

METHODS = ("model.a@raw", "workflow.direct_aggregation@full", "model.b@full", "model.a@dashboard",
           "model.b@shuffled_estimate")


def _cfg(phased: bool, methods=METHODS, **kw) -> ExperimentConfig:
    return ExperimentConfig(run="p", methods=methods, engines={"a": object(), "b": object(), "c": object()},
                            workers=WorkersConfig(engine_phases=phased), **kw)


def test_one_phase_per_engine_in_the_order_first_named():
    assert engine_phases(_cfg(True)) == [
        ("workflow.direct_aggregation@full", "model.a@raw", "model.a@dashboard"),  # engine-less methods go first
        ("model.b@full", "model.b@shuffled_estimate"),  # the placebo runs with the method whose estimates it permutes
    ]


def test_a_single_phase_when_off_or_one_engine():
    assert engine_phases(_cfg(False)) == [METHODS]
    one = ("model.a@raw", "workflow.direct_aggregation@full", "model.a@full")
    assert engine_phases(_cfg(True, one)) == [one]


def test_a_phase_config_keeps_only_its_engines_scopes_and_reference():
    cfg = _cfg(True, reference="model.b@full", scopes={"model.a@raw": MethodScope(budgets=("S",)),
                                                        "model.b@full": MethodScope(seeds=(0,))})
    first, second = engine_phases(cfg)
    p1, p2 = phase_experiment(cfg, first), phase_experiment(cfg, second)
    assert p1.methods == first and set(p1.engines) == {"a"} and set(p1.scopes) == {"model.a@raw"}
    assert p1.reference is None and p2.reference == "model.b@full"
    assert set(p2.engines) == {"b"} and set(p2.scopes) == {"model.b@full"}
    assert not p1.workers.engine_phases and engine_phases(p1) == [first]  # a phase never splits again


def test_every_method_of_a_phase_sweep_is_covered_once():
    from hypothesis import given, strategies as st

    names = st.lists(st.sampled_from(["model.a@raw", "model.a@full", "model.b@raw", "model.c@dashboard",
                                      "workflow.schema_first@full", "scripted.drafter@raw"]), unique=True, min_size=1)

    @given(names, st.booleans())
    def check(methods, phased):
        phases = engine_phases(_cfg(phased, tuple(methods)))
        flat = [m for p in phases for m in p]
        assert sorted(flat) == sorted(methods) and all(phases)
        engines_per_phase = [{m.split("@")[0] for m in p if m.startswith("model.")} for p in phases]
        if len(phases) > 1:
            assert all(len(e) == 1 for e in engines_per_phase)

    check()


def test_a_phased_local_sweep_writes_every_episode_once_and_one_record(tiny_model, tmp_path_factory, tmp_path):
    from bapsql.experiment import SamplingConfig, validate
    from bapsql.rollout.engines.base import EngineConfig
    from bapsql.rollout.sweep import run_sweep

    bench = build_rollout_bench(tmp_path_factory.mktemp("bench"))
    engine = EngineConfig(kind="hf", model=str(tiny_model), max_model_len=12288, num_threads=1)
    cfg = validate(ExperimentConfig(
        run="phased", methods=("model:a@raw", "workflow.direct_aggregation", "model:b@full", "model:a@dashboard"),
        benchmark=str(bench), split="dev", budgets=("XS",), seeds=(0,), engines={"a": engine, "b": engine},
        sampling=SamplingConfig(max_tokens=8), workers=WorkersConfig(env_workers=1, engine_phases=True)))
    s = run_sweep(cfg, out_dir=tmp_path / "run", backend="local")
    eps = read_episodes(tmp_path / "run")
    n = eps.task_id.nunique()
    assert Counter(eps["episode_id"]).most_common(1)[0][1] == 1
    assert dict(Counter(eps["method"])) == {m: n for m in cfg.methods}
    assert s.episodes_total == s.result.episodes_run == 4 * n
    assert s.engines == {"model.a@raw": "hf", "model.a@dashboard": "hf", "model.b@full": "hf"}
    record = json.loads((tmp_path / "run" / "sweep.json").read_text())
    assert record["config"]["methods"] == list(cfg.methods)  # the whole config, not the last phase's
    assert {c["method"] for c in record["cells"]} == set(cfg.methods)
    again = run_sweep(cfg, out_dir=tmp_path / "run", backend="local")  # resumes: nothing left to run
    assert again.result.episodes_run == 0 and again.result.episodes_skipped == 4 * n


def test_methods_naming_one_engine_share_its_replicas(tmp_path):
    from bapsql.rollout.sweep import actor_specs

    cfg = _cfg(False, ("model.a@raw", "model.a@dashboard", "model.b@full"))
    specs, keys = actor_specs(cfg, tmp_path, 1, {}, {"a": object(), "b": object()})
    engines = [s.key for s in specs if s.key[0] == "engine"]
    assert engines == [("engine", "a", 0), ("engine", "b", 0)]
    assert keys == {"model.a@raw": [("engine", "a", 0)], "model.a@dashboard": [("engine", "a", 0)],
                    "model.b@full": [("engine", "b", 0)]}
