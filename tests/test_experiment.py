"""Experiment YAML: strict at load (bad key → ConfigError naming it), canonical method names, cross-field checks."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from bapsql.errors import ConfigError
from bapsql.experiment import ExperimentConfig, load_experiment
from bapsql.models.resolve import resolve_model

CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "experiments"


@pytest.mark.parametrize("name", ["smoke", "main", "cluster", "table2", "table4", "table2_demo", "table4_demo",
                                  "smollm2_heldout_dev", "smollm2_heldout_spider"])
def test_shipped_configs_load(name):
    cfg = load_experiment(CONFIGS / f"{name}.yaml")
    assert cfg.run and cfg.methods and cfg.budgets and cfg.seeds
    assert all(":" not in m and "@" in m for m in cfg.methods)  # canonical POLICY@CONDITION, path-safe
    for m in cfg.model_methods:
        assert cfg.engine_of(m) in cfg.engines


def _write(tmp_path, data) -> Path:
    p = tmp_path / "exp.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


BASE = {"run": "t", "methods": ["workflow:estimate_rewrite", "workflow:drill_down@no_interface",
                                "model:tiny"],
        "engines": {"tiny": {"kind": "hf", "model": "builtin:tiny", "max_model_len": 12288}}}


def test_methods_are_canonicalized_and_defaults_apply(tmp_path):
    cfg = load_experiment(_write(tmp_path, BASE))
    assert cfg.methods == ("workflow.estimate_rewrite@full", "workflow.drill_down@no_interface", "model.tiny@full")
    assert cfg.model_methods == ("model.tiny@full",) and cfg.engines["tiny"].kind == "hf"
    assert cfg.engine_of("model.tiny@full") == "tiny"
    assert cfg.budgets == ("XS", "S", "M", "L") and cfg.seeds == (0, 1, 2) and cfg.samples_per_group == 1
    assert cfg.run_dir == Path("runs/t")
    assert load_experiment(_write(tmp_path, BASE), out_dir="x/{run}-2").run_dir == Path("x/t-2")
    assert cfg.reference is None  # the analysis compares against nothing unless told
    named = load_experiment(_write(tmp_path, {**BASE, "reference": "workflow:estimate_rewrite"}))
    assert named.reference == "workflow.estimate_rewrite@full"  # canonicalized like the methods


@pytest.mark.parametrize("patch,where", [
    ({"methdos": ["scripted.drafter@raw"]}, "methdos"),
    ({"workers": {"env_wrokers": 2}}, "workers"),
    ({"engines": {"tiny": {"kind": "hf", "model": "m", "max_model_len": 12288, "dtyp": "float32"}}}, "engines.tiny"),
    ({"budgets": ["XS", "XXL"]}, "budgets[1]"),
    ({"seeds": [0, 0]}, "seeds"),
    ({"methods": ["workflow:nope"]}, "methods[0]"),
    ({"methods": ["model:other"]}, "methods[0]"),
    ({"engines": {"tiny": {"kind": "hf", "model": "m", "max_model_len": 4096}}}, "engines.tiny.max_model_len"),
    ({"workers": {"env_workers": 0}}, "workers.env_workers"),
    ({"monitor": {"kind": "tensorboard"}}, "monitor.kind"),
    ({"samples_per_group": 0}, "samples_per_group"),
    ({"limit": 0}, "limit"),
    ({"run": "a/b"}, "run"),
    ({"reference": "baseline:raw"}, "reference"),
    ({"reference": "workflow:nope"}, "reference"),
])
def test_bad_configs_name_the_key(tmp_path, patch, where):
    with pytest.raises(ConfigError, match=re.escape(where)):
        load_experiment(_write(tmp_path, {**BASE, **patch}))


def test_missing_required_keys_and_bad_files(tmp_path):
    with pytest.raises(ConfigError, match="methods"):
        load_experiment(_write(tmp_path, {"run": "x"}))
    with pytest.raises(ConfigError, match="not found"):
        load_experiment(tmp_path / "nope.yaml")
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_experiment(tmp_path / "list.yaml")


def test_to_dict_is_plain_data(tmp_path):
    import json

    d = load_experiment(_write(tmp_path, BASE)).to_dict()
    assert json.loads(json.dumps(d, default=str))["engines"]["tiny"]["kind"] == "hf"
    assert isinstance(ExperimentConfig("r", ("scripted.drafter@raw",)).to_dict()["workers"], dict)


def test_sampling_template_kwargs_reach_every_engine_and_clashes_name_the_key(tmp_path):
    """The chat-template options a sweep's agents render with are the engine's (an openai_chat engine sends them):
    sampling.template_kwargs merged into each engine's chat_template_kwargs."""
    chat = {"kind": "openai_chat", "model": "m", "base_url": "http://127.0.0.1:9/v1", "max_model_len": 12288,
            "chat_template_kwargs": {"reasoning_effort": "low"}}
    data = {**BASE, "methods": ["model:tiny", "model:chat"], "engines": {**BASE["engines"], "chat": chat},
            "sampling": {"template_kwargs": {"enable_thinking": False}}}
    cfg = load_experiment(_write(tmp_path, data))
    assert cfg.engines["tiny"].chat_template_kwargs == {"enable_thinking": False}
    assert cfg.engines["chat"].chat_template_kwargs == {"reasoning_effort": "low", "enable_thinking": False}
    assert load_experiment(_write(tmp_path, {**BASE})).engines["tiny"].chat_template_kwargs == {}
    clash = {**data, "engines": {"chat": {**chat, "chat_template_kwargs": {"enable_thinking": True}}},
             "methods": ["model:chat"]}
    with pytest.raises(ConfigError, match=r"engines\.chat\.chat_template_kwargs\.enable_thinking"):
        load_experiment(_write(tmp_path, clash))


def test_resolve_model_passes_paths_through():
    assert resolve_model("/models/qwen") == "/models/qwen"


def test_the_paper_tables_are_every_cell_as_a_method_under_a_condition():
    from bapsql.env.conditions import split_method

    t2 = load_experiment(CONFIGS / "table2.yaml")
    assert [split_method(m)[1] for m in t2.methods[:4]] == ["raw", "dashboard", "adaptive_posthoc", "full"]
    assert {split_method(m)[0] for m in t2.methods} == {"model.sft", "model.sql_rl", "model.bap_rl"}
    t4 = load_experiment(CONFIGS / "table4.yaml")
    assert {split_method(m)[1] for m in t4.methods} == {"full", "no_interface", "shuffled_estimate", "no_rewrite",
                                                        "deterministic_rewrite", "no_abstention"}
    assert {split_method(m)[0] for m in t4.methods} == {"model.bap_rl"}  # one trained adapter, fixed


def test_workers_placement_keys_are_checked():
    from bapsql.errors import ConfigError
    from bapsql.experiment import WorkersConfig

    w = WorkersConfig(env_resources={"env_node": 1.0}, writer="any", writer_resources={"storage": 1.0})
    assert w.env_resources == {"env_node": 1.0} and w.writer == "any"
    with pytest.raises(ConfigError, match="writer_resources"):
        WorkersConfig(writer_resources={"storage": 1.0})  # a writer pinned to the driver needs none
    with pytest.raises(ConfigError, match="engine_resources.GPU"):
        WorkersConfig(engine_resources={"GPU": 1.0})
    with pytest.raises(ConfigError, match="env_resources.env_node"):
        WorkersConfig(env_resources={"env_node": 0.0})


def test_prompt_style_reaches_the_sweeps_env_workers(tmp_path):
    from bapsql.experiment import ExperimentConfig, validate
    from bapsql.rollout.sweep import actor_specs

    cfg = validate(ExperimentConfig(run="terse", methods=("workflow:direct_aggregation",), prompt_style="terse"))
    specs, _ = actor_specs(cfg, tmp_path, 2, {}, {})
    envs = [s for s in specs if s.key[0] == "env"]
    assert len(envs) == 2 and all(s.kwargs["env_options"].prompt_style == "terse" for s in envs)


# -- per-method scopes: a costly method runs a subset of the sweep's cells ------------------------------------------

SCOPED = {**BASE, "budgets": ["XS", "S", "M", "L"], "seeds": [0, 1, 2],
          "engines": {"tiny": {"kind": "hf", "model": "builtin:tiny", "max_model_len": 8192}},
          "scopes": {"model:tiny": {"budgets": ["XS", "M"], "seeds": [0], "tasks_per_db": 2}}}


def test_a_scope_is_canonical_and_narrows_only_its_method(tmp_path):
    from bapsql.rollout.groups import GroupSampler
    from bapsql.types import Task

    cfg = load_experiment(_write(tmp_path, SCOPED))
    assert set(cfg.scopes) == {"model.tiny@full"}  # keyed by the canonical method name
    assert cfg.budgets_of("model.tiny@full") == ("XS", "M")
    assert cfg.budgets_of("workflow.estimate_rewrite@full") == ("XS", "S", "M", "L")
    tasks = [Task(task_id=f"{db}-{i}", db_id=db, db_path=f"/x/{db}.sqlite", question="q", gold_sql="SELECT 1")
             for db, n in (("a", 3), ("b", 1), ("c", 4)) for i in range(n)]
    specs = GroupSampler("t", samples_per_group=1).sweep(cfg.methods, tasks, cfg.budgets, cfg.seeds)
    kept = cfg.scoped(specs)
    model = [s for s in kept if s.method == "model.tiny@full"]
    # the first 2 tasks of every database (b has only 1), levels XS and M, seed 0
    assert sorted({s.task_id for s in model}) == ["a-0", "a-1", "b-0", "c-0", "c-1"]
    assert {s.level for s in model} == {"XS", "M"} and {s.seed for s in model} == {0}
    assert len(model) == 5 * 2 * 1
    others = [s for s in specs if s.method != "model.tiny@full"]
    assert [s for s in kept if s.method != "model.tiny@full"] == others  # unscoped methods keep every cell
    assert [s.episode_id for s in kept] == [s.episode_id for s in specs if s in set(kept)]  # order kept
    assert cfg.to_dict()["scopes"]["model.tiny@full"]["seeds"] == (0,)


def test_a_scope_lets_a_short_context_model_skip_the_levels_it_cannot_hold(tmp_path):
    """max_model_len is checked against the levels a model method runs: 8,192 positions hold M, not L."""
    unscoped = {k: v for k, v in SCOPED.items() if k != "scopes"}
    with pytest.raises(ConfigError, match="engines.tiny.max_model_len.*scopes"):
        load_experiment(_write(tmp_path, unscoped))
    wide = {**SCOPED, "scopes": {"model:tiny": {"budgets": ["XS", "L"]}}}
    with pytest.raises(ConfigError, match="engines.tiny.max_model_len"):
        load_experiment(_write(tmp_path, wide))


@pytest.mark.parametrize("scopes,where", [
    ({"workflow:drill_down": {"seeds": [0]}}, "scopes.workflow:drill_down"),  # not a method of the sweep
    ({"model:tiny": {"budgets": ["XS", "XXL"]}}, "scopes.model:tiny.budgets[1]"),
    ({"model:tiny": {"seeds": [0, 7]}}, "scopes.model:tiny.seeds[1]"),
    ({"model:tiny": {"tasks_per_db": 0}}, "tasks_per_db"),
    ({"model:tiny": {"seeds": []}}, "seeds"),
    ({"model:tiny": {"levels": ["XS"]}}, "scopes.model:tiny"),  # unknown key
    ({"model:tiny": {"seeds": [0]}, "model:tiny@full": {"seeds": [1]}}, "second scope"),
])
def test_bad_scopes_name_the_key(tmp_path, scopes, where):
    with pytest.raises(ConfigError, match=re.escape(where)):
        load_experiment(_write(tmp_path, {**SCOPED, "scopes": scopes}))
