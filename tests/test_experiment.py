"""Experiment YAML: strict at load (bad key → ConfigError naming it), canonical method names, cross-field checks."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from bapsql.errors import ConfigError
from bapsql.experiment import ExperimentConfig, load_experiment
from bapsql.models.registry import resolve_model

CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "experiments"


@pytest.mark.parametrize("name", ["smoke", "main", "cluster", "table2", "table4", "table2_demo", "table4_demo"])
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
