"""Table 2 in miniature: config loading, stage planning / resume records, and the report on planted results."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
import yaml

from bapsql.errors import ConfigError
from bapsql.train.experiments.stage_plan import plan_stages, read_stages, record_attempt, stages_path
from bapsql.train.experiments.table2 import load_table2_config, rl_config, table2_rows

REPO = Path(__file__).resolve().parents[3]
CPU = REPO / "configs" / "experiments" / "table2_cpu.yaml"
GPU = REPO / "configs" / "experiments" / "table2_gpu.yaml"


def _write(tmp_path: Path, doc: dict) -> Path:
    p = tmp_path / "t2.yaml"
    p.write_text(yaml.safe_dump(doc))
    return p


def _doc(**extra) -> dict:
    train = {"extends": str(REPO / "configs" / "train" / "cpu_learn_tiny.yaml"), "name": "t2", "monitor": {"kind": "none"}}
    return {"train": train, **extra}


def _touch_model(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text("{}")


# ------------------------------------------------------------------------------------------------------- config
def test_cpu_config_and_quick_preset_load():
    full = load_table2_config(CPU)
    quick = load_table2_config(CPU, quick=True)
    base = yaml.safe_load((REPO / "configs" / "train" / "cpu_learn_tiny.yaml").read_text())
    # extends cpu_learn_tiny.yaml: its training values are used as they are
    assert full.train.pretrain.steps == base["pretrain"]["steps"]
    assert full.train.grpo.updates == base["grpo"]["updates"]
    assert full.preset == "full" and full.reduced == ()
    assert full.train.eval.budgets == ("XS", "S", "M", "L")
    assert full.train.eval.seeds == full.train.seeds  # the sweep's seed is the training seed
    assert quick.preset == "quick" and quick.train.name != full.train.name
    assert quick.train.pretrain.steps < full.train.pretrain.steps and quick.train.grpo.updates < full.train.grpo.updates
    assert any(r.startswith("train.pretrain.steps:") for r in quick.reduced)
    assert [r.method for r in table2_rows(full)] == [
        "model:base@raw", "model:base@dashboard", "model:base@adaptive_posthoc",
        "model:sft@full", "model:sql_rl@full", "model:bap_rl@full"]


def test_gpu_config_loads_at_the_papers_scale():
    cfg = load_table2_config(GPU)
    t = cfg.train
    assert t.seeds == (0, 1, 2) and t.grpo.updates == 120
    assert t.rollout.engine["kind"] == "vllm" and t.rollout.use_ray
    assert t.eval.budgets == ("XS", "S", "M", "L") and t.eval.seeds == (0, 1, 2)
    assert t.data.benchmark.startswith("/") and not t.model.base.startswith("builtin:")


def test_prompting_model_sft_moves_the_prompting_rows(tmp_path):
    cfg = load_table2_config(_write(tmp_path, _doc(prompting_model="sft")))
    assert [r.engine for r in table2_rows(cfg)][:3] == ["sft"] * 3


def test_rows_are_selected_by_key_in_table_order_and_an_unknown_one_is_named(tmp_path):
    from bapsql.train.experiments.table2 import eval_models, select_rows

    cfg = load_table2_config(_write(tmp_path, _doc(prompting_model="sft")), out_dir=str(tmp_path / "runs"))
    assert select_rows(cfg, None) == table2_rows(cfg)
    assert [r.key for r in select_rows(cfg, ("bap_rl", "raw"))] == ["raw", "bap_rl"]
    with pytest.raises(ConfigError, match=r"--rows: unknown row\(s\) \['sqlrl'\]; .*raw,dashboard,adaptive_posthoc,sft"):
        select_rows(cfg, ("sft", "sqlrl"))
    # only the chosen rows' models need to exist
    _touch_model(cfg.train.run_dir(0) / "sft" / "merged")
    assert list(eval_models(cfg, 0, engines=("sft",))) == ["sft"]
    with pytest.raises(ConfigError, match="no model for bap_rl"):
        eval_models(cfg, 0, engines=("sft", "bap_rl"))


def test_part_of_the_rows_cannot_be_reported_in_the_same_call(tmp_path):
    from bapsql.train.experiments.table2_run import run_table2

    cfg = load_table2_config(_write(tmp_path, _doc()), out_dir=str(tmp_path / "runs"))
    with pytest.raises(ConfigError, match="--rows sft: the report needs every row .* --stages eval"):
        run_table2(cfg, rows=("sft",))
    with pytest.raises(ConfigError, match="--rows sft: picks the rows the eval stage plays; add eval"):
        run_table2(cfg, stages=("sft",), rows=("sft",))
    assert not (tmp_path / "runs").exists()  # refused before anything ran


@pytest.mark.parametrize("doc, named", [
    (_doc(prompting_modle="base"), ("prompting_modle",)),
    ({**_doc(), "train": {**_doc()["train"], "grpo": {"updatez": 3}}}, ("train.grpo", "updatez")),
    (_doc(quick={"train": {"sft": {"epochz": 1}}}), ("(quick)", "train.sft", "epochz")),
    (_doc(prompting_model="prompted"), ("prompting_model",)),
    (_doc(reference_condition="full"), ("reference_condition",)),
    (_doc(prompting_conditions=["raw", "nope"]), ("prompting_conditions[1]",)),
    ({**_doc(), "train": {**_doc()["train"], "eval": {"seeds": [0, 1]}}}, ("train.eval.seeds",)),
    (_doc(preset="quick"), ("preset",)),
])
def test_bad_keys_are_named(tmp_path, doc, named):
    with pytest.raises(ConfigError) as exc:
        load_table2_config(_write(tmp_path, doc))
    assert all(n in str(exc.value) for n in named), str(exc.value)


def test_quick_without_a_preset_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="no quick: preset"):
        load_table2_config(_write(tmp_path, _doc()), quick=True)


def test_rl_stages_differ_only_in_the_reward(tmp_path):
    t = load_table2_config(_write(tmp_path, _doc())).train
    full, sql = rl_config(t, "rl_full"), rl_config(t, "rl_sql")
    assert full.reward.variant == "full" and sql.reward.variant == "correctness"
    assert dataclasses.replace(sql, reward=full.reward) == full


# ------------------------------------------------------------------------------------------------------- report
def _plant(cfg, success: dict[str, list[float]], n_tasks: int = 240) -> None:
    from bapsql.analysis.synthetic import SyntheticSpec, synthetic_run, write_run

    rows = {r.key: r.logged for r in table2_rows(cfg)}
    levels = ("XS", "S", "M", "L")
    spec = SyntheticSpec(success={rows[k]: dict(zip(levels, v)) for k, v in success.items()},
                         tokens={rows[k]: dict.fromkeys(levels, 1000.0) for k in success},
                         n_tasks=n_tasks, n_databases=7, seeds=(0,), db_sd=0.0, coupling=0.9, turns_per_episode=0)
    ep, turns = synthetic_run(spec)
    write_run(cfg.train.run_dir(0) / "table2" / "eval", ep, turns)


def _planted_cfg(tmp_path):
    from bapsql.train.experiments.table2_report import PAPER_TABLE2

    cfg = load_table2_config(_write(tmp_path, _doc()), out_dir=str(tmp_path / "runs"))
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(
        cfg.train, eval=dataclasses.replace(cfg.train.eval, replicates=30)))
    # planted: the paper's ordering except that SQL-RL beats BAP-SQL RL everywhere by a wide margin
    planted = {k: [v / 100 for v in vals[:4]] for k, vals in PAPER_TABLE2.items()}
    planted["sql_rl"] = [0.6, 0.6, 0.6, 0.6]
    _plant(cfg, planted)
    record_attempt(stages_path(cfg, 0), "eval", "run", 7.0, True)
    return cfg


def test_orderings_are_computed_from_the_results(tmp_path):
    from bapsql.analysis.analyze import summarize
    from bapsql.analysis.load import load_runs
    from bapsql.train.experiments.table2_report import render_markdown, table2_result

    cfg = _planted_cfg(tmp_path)
    logs = load_runs([cfg.train.run_dir(0) / "table2" / "eval"])
    s2 = summarize(logs, reference="model.base@dashboard", replicates=30)
    s3 = summarize(logs, reference="model.sft@full", replicates=30)
    res = table2_result(cfg, s2, s3)
    by = {(o.higher, o.lower, o.level): o for o in res.orderings}
    assert by[("adaptive_posthoc", "dashboard", "XS")].holds is True
    assert by[("adaptive_posthoc", "dashboard", "XS")].clear is True
    assert by[("bap_rl", "sql_rl", "XS")].holds is False and not by[("bap_rl", "sql_rl", "XS")].clear
    assert by[("sql_rl", "sft", "FS")].holds is True and by[("sql_rl", "sft", "FS")].ci is None
    assert res.attenuation is not None and res.attenuation.paper_delta == pytest.approx(1.9)
    assert {g.method for g in res.gates} == {"model.sql_rl@full", "model.bap_rl@full"}
    md = render_markdown(cfg, res, s3, {0: read_stages(stages_path(cfg, 0))}, [])
    for label in ("Raw agent", "Dashboard", "Adaptive post-hoc", "BAP-SQL SFT", "SQL-RL (matched)", "BAP-SQL RL"):
        assert f"| {label} |" in md
    assert "34.8" in md  # the paper's BAP-SQL RL at XS sits beside the cell
    n = sum(o.holds is not None for o in res.orderings)
    assert f"of {n}** measured orderings hold here" in md


@pytest.mark.slow
def test_write_report_writes_both_analyses_and_table2_md(tmp_path):
    from bapsql.train.experiments.table2_report import write_report

    from bapsql.analysis.synthetic import write_run
    from tests.analysis.helpers import episodes_table

    cfg = _planted_cfg(tmp_path)
    # one BAP-SQL RL training group at XS whose two successes ran 1 and 2 queries: the full reward ranks them
    rollouts = [{"method": "model.policy@full", "budget": "XS", "task_id": "q1", "group_id": "q1@XS", "sample": i,
                 "condition": "full", "success": ok, "queries": q, "evidence_score": 0.75}
                for i, (ok, q) in enumerate([(True, 1), (True, 2), (False, 1)])]
    write_run(cfg.train.run_dir(0) / "rl_full" / "rollouts", episodes_table(rollouts), None)
    out = write_report(cfg)
    res = json.loads((out / "table2.json").read_text())
    assert res["spread"]["rl_full seed 0"][0]["full_differs_pct"] == 100.0 and "rl_sql seed 0" not in res["spread"]
    assert {r["key"] for r in res["rows"]} == {"raw", "dashboard", "adaptive_posthoc", "sft", "sql_rl", "bap_rl"}
    assert res["stages"]["0"]["eval"]["seconds"] == 7.0
    md = (out / "table2.md").read_text()
    assert "Table 3 gate" in md and "![table2/frontier.png](table2/frontier.png)" in md
    assert "## Mechanism diagnostics" in md and "| rl_full seed 0 | XS | 1 | 1 | 1 | 100.0 | 0.0 | 100.0 |" in md
    assert "| BAP-SQL RL | XS |" in md  # the sweep's warning flow, per row and level
    assert (out / "table2" / "report.md").is_file() and (out / "table2" / "frontier.png").is_file()
    assert json.loads((out / "gate" / "summary.json").read_text())["reference"] == "model.sft@full"
    assert json.loads((out / "table2" / "summary.json").read_text())["reference"] == "model.base@dashboard"


def test_attenuation_needs_a_positive_gain_at_xs_that_narrows_by_l():
    from bapsql.train.experiments.table2_report import attenuates

    assert attenuates(3.4, 1.5)
    assert not attenuates(1.5, 3.4)  # the gain grows
    assert not attenuates(-1.6, -3.2)  # RL below SFT at XS: nothing to attenuate, even if L is lower still
    assert not attenuates(0.0, -1.0)


# ------------------------------------------------------------------------ issue 30, item 8: the RL rows' start
def test_both_rl_stages_record_the_sft_adapter_they_start_from_and_differ_only_in_the_reward(tmp_path):
    from bapsql.train.experiments.table2 import rl_pair
    from bapsql.train.recipe.pipeline import sft_dir, tree_sha256, write_grpo_start

    cfg = load_table2_config(_write(tmp_path, _doc()), out_dir=str(tmp_path / "runs"))
    t = cfg.train
    run = t.run_dir(0)
    adapter = sft_dir(t, 0) / "adapter"
    adapter.mkdir(parents=True)
    (adapter / "adapter_model.safetensors").write_bytes(b"lora-weights")
    _touch_model(sft_dir(t, 0) / "merged")
    for stage in ("rl_full", "rl_sql"):
        write_grpo_start(rl_config(t, stage), 0, sft_dir(t, 0) / "merged", run / stage)
    pair = rl_pair(cfg, 0)
    assert pair.same_start and pair.sft_adapter_sha256 == tree_sha256(adapter)
    assert pair.differences == ("reward.variant",)
    # another learning rate, or another adapter, is caught
    other = dataclasses.replace(t, grpo=dataclasses.replace(t.grpo, lr=2e-6))
    (adapter / "adapter_model.safetensors").write_bytes(b"retrained")
    write_grpo_start(rl_config(other, "rl_sql"), 0, sft_dir(t, 0) / "merged", run / "rl_sql")
    pair = rl_pair(cfg, 0)
    assert not pair.same_start and pair.differences == ("grpo.lr", "reward.variant")


# ------------------------------------------------------------------------------------------------ protocol model
SMOLLM2 = REPO / "configs" / "experiments" / "table2_smollm2.yaml"


def test_smollm2_config_runs_the_prompting_rows_on_a_protocol_only_adapter():
    from bapsql.policies.registry import WORKFLOW_NAMES
    from bapsql.train.experiments.protocol import BUDGET_AWARE

    cfg = load_table2_config(SMOLLM2)
    t = cfg.train
    assert t.model.base == "smollm2-135m-instruct" and not t.pretrain.enabled
    assert [r.method for r in table2_rows(cfg)] == [
        "model:protocol@raw", "model:protocol@dashboard", "model:protocol@adaptive_posthoc",
        "model:sft@full", "model:sql_rl@full", "model:bap_rl@full"]
    # BAP-SQL SFT: all nine workflows at all four levels; the protocol adapter: budget-blind workflows only
    assert t.sft.workflows is None and len(WORKFLOW_NAMES) == 9 and t.sft.budgets == ("XS", "S", "M", "L")
    assert not set(cfg.protocol.workflows) & BUDGET_AWARE
    assert set(cfg.protocol.conditions) == set(cfg.prompting_conditions)
    assert t.eval.budgets == ("XS", "S", "M", "L") and t.budgets.levels == ("XS", "S", "M", "L")
    plan = plan_stages(cfg, 0)
    assert plan["pretrain"] == "skip" and plan["protocol"] == "run"
    quick = load_table2_config(SMOLLM2, quick=True)
    assert quick.protocol.export_pairs < cfg.protocol.export_pairs and quick.train.name != t.name


def test_smollm2_recover_variant_adds_recovery_episodes_and_nothing_else():
    """table2_smollm2_recover.yaml: the nine workflows plus three slots of workflow.recover_from_error (a quarter of
    the episodes) in BAP-SQL SFT; every other setting, the protocol adapter's included, is table2_smollm2.yaml's."""
    import dataclasses

    from bapsql.policies.registry import WORKFLOW_NAMES

    base, var = load_table2_config(SMOLLM2), load_table2_config(SMOLLM2.with_name("table2_smollm2_recover.yaml"))
    assert var.train.sft.workflows == (*WORKFLOW_NAMES, *["workflow.recover_from_error"] * 3)
    same = dataclasses.replace(var.train, name=base.train.name,
                               sft=dataclasses.replace(var.train.sft, workflows=None))
    assert same == base.train and var.protocol == base.protocol and var.train.name != base.train.name


def test_smollm2_slips_variant_replays_the_shipped_bank_and_nothing_else():
    """table2_smollm2_slips.yaml: table2_smollm2_recover.yaml with the recovery episodes playing issue 37's bank."""
    rec = load_table2_config(SMOLLM2.with_name("table2_smollm2_recover.yaml"))
    var = load_table2_config(SMOLLM2.with_name("table2_smollm2_slips.yaml"))
    assert var.train.sft.slips == "configs/train/slips/cpu_learn_recover.jsonl" and (REPO / var.train.sft.slips).is_file()
    same = dataclasses.replace(var.train, name=rec.train.name, sft=dataclasses.replace(var.train.sft, slips=None))
    assert same == rec.train and var.protocol == rec.protocol
    quick = load_table2_config(SMOLLM2.with_name("table2_smollm2_slips.yaml"), quick=True)
    assert quick.train.name == "table2-smollm2-slips-quick" and quick.train.sft.slips == var.train.sft.slips


def test_an_experiment_file_extends_another_from_its_own_folder(tmp_path):
    """Top-level ``extends:``: the parent's keys (``quick:`` too) under the variant's, lists replaced, and the
    parent's ``train.extends`` still relative to the parent's folder."""
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "t2.yaml").write_text(yaml.safe_dump({
        "train": {"extends": str(REPO / "configs" / "train" / "cpu_learn_tiny.yaml"), "name": "base",
                  "monitor": {"kind": "none"}, "eval": {"budgets": ["XS", "S"]}},
        "description": "the base", "quick": {"train": {"name": "base-quick", "grpo": {"updates": 1}}}}))
    variant = tmp_path / "variant.yaml"
    variant.write_text(yaml.safe_dump({"extends": "base/t2.yaml", "train": {"name": "variant",
                                       "eval": {"budgets": ["XS"]}}, "quick": {"train": {"name": "variant-quick"}}}))
    base, var = load_table2_config(tmp_path / "base" / "t2.yaml"), load_table2_config(variant)
    assert var.train.name == "variant" and var.train.eval.budgets == ("XS",) and var.description == "the base"
    assert dataclasses.replace(var.train, name="base", eval=base.train.eval) == base.train
    quick = load_table2_config(variant, quick=True)
    assert quick.train.name == "variant-quick" and quick.train.grpo.updates == 1


def test_train_extends_relative_to_the_parent_file(tmp_path):
    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "tiny.yaml").write_text(
        (REPO / "configs" / "train" / "cpu_learn_tiny.yaml").read_text())
    (tmp_path / "exp").mkdir()
    (tmp_path / "exp" / "base.yaml").write_text(yaml.safe_dump(
        {"train": {"extends": "../train/tiny.yaml", "name": "b", "monitor": {"kind": "none"}}}))
    (tmp_path / "variant.yaml").write_text(yaml.safe_dump({"extends": "exp/base.yaml", "train": {"name": "v"}}))
    assert load_table2_config(tmp_path / "variant.yaml").train.name == "v"


def test_a_parents_quick_train_extends_stays_relative_to_the_parent(tmp_path):
    """A ``quick:`` preset in the parent that names its own training config finds it from the parent's folder,
    not from the variant's."""
    (tmp_path / "train").mkdir()
    tiny = (REPO / "configs" / "train" / "cpu_learn_tiny.yaml").read_text()
    (tmp_path / "train" / "tiny.yaml").write_text(tiny)
    (tmp_path / "train" / "tiny_quick.yaml").write_text(tiny + "\nseeds: [7]\n")
    (tmp_path / "exp").mkdir()
    (tmp_path / "exp" / "base.yaml").write_text(yaml.safe_dump(
        {"train": {"extends": "../train/tiny.yaml", "name": "b", "monitor": {"kind": "none"}},
         "quick": {"train": {"extends": "../train/tiny_quick.yaml", "grpo": {"updates": 1}}}}))
    (tmp_path / "variant.yaml").write_text(yaml.safe_dump({"extends": "exp/base.yaml", "train": {"name": "v"}}))
    quick = load_table2_config(tmp_path / "variant.yaml", quick=True)
    assert quick.train.seeds == (7,) and quick.train.grpo.updates == 1 and quick.train.name == "v"
    assert load_table2_config(tmp_path / "variant.yaml").train.seeds != (7,)


@pytest.mark.parametrize("files,named", [
    ({"a.yaml": {"extends": "b.yaml"}, "b.yaml": {"extends": "a.yaml"}}, "extends forms a cycle"),
    ({"a.yaml": {"extends": "missing.yaml"}}, "config file not found"),
    ({"a.yaml": {"extends": ["b.yaml"]}}, "extends: expected a path to another experiment file"),
])
def test_bad_experiment_extends_is_named(tmp_path, files, named):
    for name, doc in files.items():
        (tmp_path / name).write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError, match=re.escape(named)):
        load_table2_config(tmp_path / "a.yaml")


@pytest.mark.parametrize("extra,named", [
    ({"prompting_model": "protocol"}, "protocol: set it exactly when"),
    ({"protocol": {"export_pairs": 6}}, "protocol: set it exactly when"),
    ({"prompting_model": "protocol", "protocol": {"workflows": ["workflow.estimate_rewrite"]}},
     "protocol.workflows[0]: workflow.estimate_rewrite adapts to the budget"),
    ({"prompting_model": "protocol", "protocol": {"conditions": ["nope"]}}, "protocol.conditions[0]"),
    ({"prompting_model": "protocol", "protocol": {"budgets": ["XL"]}}, "protocol.budgets[0]"),
    ({"prompting_model": "protocol", "protocol": {"export_pairs": 2}}, "protocol.export_pairs"),
    ({"prompting_model": "protocol", "protocol": {"epochs": 1, "lr": 1.0}}, "unknown key(s) ['lr']"),
])
def test_bad_protocol_settings_are_named(tmp_path, extra, named):
    with pytest.raises(ConfigError, match=re.escape(named)):
        load_table2_config(_write(tmp_path, _doc(**extra)))


def test_protocol_pairs_split_evenly_over_the_conditions():
    from hypothesis import given, strategies as st

    from bapsql.policies.sft_export import split_pairs

    @given(st.integers(1, 500), st.integers(1, 6))
    def check(total, parts):
        got = split_pairs(total, parts)
        assert sum(got) == total and len(got) == parts and max(got) - min(got) <= 1

    check()
