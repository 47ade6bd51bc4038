"""The embedded benchmark generator: determinism, folder format, typed answers, measured tags, splits."""

from __future__ import annotations

import hashlib
import json

import pytest

from bapsql.budgets import load_ladder
from bapsql.data.load import load_benchmark
from bapsql.data.demo import DEMO_FRACTIONS, TASKS, build_demo, demo_is_current
from bapsql.data.splits import split_databases
from bapsql.data.synth_domains import DOMAINS
from bapsql.data.gold import derive_gold
from bapsql.data.measure import QueryCost, measure, measurement_token_counter
from bapsql.db.sandbox import Sandbox
from bapsql.errors import ConfigError


def _hashes(root):
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.slow  # several seconds: the slow tier
def test_same_seed_gives_the_same_bytes(demo_small, tmp_path):
    again = tmp_path / "again"
    build_demo(again, scale="small", seed=0, workers=2)  # two processes must not change a byte
    first, second = _hashes(demo_small), _hashes(again)
    assert len(first) == 18  # 14 databases + benchmark, tasks, splits, manifest
    assert first == second


def test_folder_format(demo_small):
    info = json.loads((demo_small / "benchmark.json").read_text())
    assert info["kind"] == "demo" and info["scale"] == "small" and info["seed"] == 0 and info["version"] == 1
    assert "generator_version" in info and info["name"]
    lines = (demo_small / "tasks.jsonl").read_text().splitlines()
    rec = json.loads(lines[0])
    assert rec["db_path"] == f"databases/{rec['db_id']}/{rec['db_id']}.sqlite"
    manifest = json.loads((demo_small / "manifest.json").read_text())
    assert manifest["tasks"] == len(lines)
    for name, digest in manifest["files"].items():
        assert hashlib.sha256((demo_small / name).read_bytes()).hexdigest() == digest
    for db in manifest["databases"].values():
        assert hashlib.sha256((demo_small / db["path"]).read_bytes()).hexdigest() == db["sha256"]


def test_tasks_are_typed_deduplicated_and_split_by_database(demo_small):
    bench = load_benchmark(demo_small)
    tasks = bench.tasks
    assert 250 <= len(tasks) <= 600
    assert len({" ".join(t.question.lower().split()) for t in tasks}) == len(tasks)
    assert {t.gold.kind for t in tasks} == {"scalar", "list", "ordered_list"}
    assert len(bench.databases) == 14
    assert any(t.evidence for t in tasks) and all(t.naive_sql for t in tasks)
    split_dbs = [set(v) for v in bench.splits.values()]
    assert set().union(*split_dbs) == set(bench.databases)
    assert sum(len(s) for s in split_dbs) == len(bench.databases)  # disjoint
    assert all(bench.select(name).tasks for name in ("train", "test", "validation", "dev"))
    counts = {name: len(bench.select(name).tasks) for name in ("train", "test", "validation", "dev")}
    assert sum(counts.values()) == len(tasks)  # every task in exactly one split
    assert 50 <= counts["dev"] <= TASKS["small"]["dev"]  # small enough for the main job
    templates = {tag for t in tasks for tag in t.tags if tag.startswith("template:")}
    assert len(templates) >= 15


def test_gold_answers_and_tags_match_a_fresh_measurement(demo_small):
    bench = load_benchmark(demo_small)
    manifest = json.loads((demo_small / "manifest.json").read_text())
    spec, counter = measurement_token_counter()
    assert json.loads((demo_small / "benchmark.json").read_text())["token_counter"] == spec
    xs = load_ladder()["XS"]
    by_db = {}
    for t in bench.tasks:
        by_db.setdefault(t.db_id, []).append(t)
    checked = 0
    for db, tasks in sorted(by_db.items())[:3]:
        with Sandbox(tasks[0].db_path) as sb:
            for t in tasks[::4]:
                g = derive_gold(sb, t.gold_sql, token_counter=counter)
                assert g.answer == t.gold and not g.flags
                cost = manifest["costs"][t.task_id]
                assert g.vm_steps == cost["gold"]["vm_steps"] and g.result_tokens == cost["gold"]["result_tokens"]
                naive = measure(sb, t.naive_sql, counter, vm_step_cap=xs.vm_steps + 1, token_limit=xs.result_tokens)
                gold_fits = QueryCost.from_json(cost["gold"]).fits(xs)
                assert ("budget_sensitive" in t.tags) == (gold_fits and not naive.fits(xs))
                assert ("unanswerable_xs" in t.tags) == (not gold_fits)
                checked += 1
    assert checked >= 15


def test_unknown_scale_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="scale"):
        build_demo(tmp_path, scale="huge")


@pytest.mark.parametrize("seed", range(8))
def test_at_least_six_dev_databases_at_every_seed_and_scale(demo_small, seed):
    """Scales share the domains and the split depends only on (database ids, seed): six dev databases always, and
    the built folder writes exactly that split."""
    splits = split_databases([d.db_id for d in DOMAINS], seed=seed, fractions=DEMO_FRACTIONS)
    assert len(splits["dev"]) >= 6 and len(splits["train"]) >= 6 and splits["validation"]
    if seed == 0:
        written = json.loads((demo_small / "splits.json").read_text())["splits"]
        assert {k: tuple(v) for k, v in written.items()} == splits
        bench = load_benchmark(demo_small, split="dev")
        assert len(bench.databases) >= 6


def test_in_domain_test_split_holds_out_tasks_of_the_train_databases(demo_small):
    bench = load_benchmark(demo_small)
    train, test = bench.select("train").tasks, bench.select("test").tasks
    assert {t.task_id for t in train}.isdisjoint(t.task_id for t in test)
    assert {t.db_id for t in test} <= set(bench.splits["train"])
    assert {t.db_id for t in test} == {t.db_id for t in train}  # in-domain: the same databases
    assert 0.1 < len(test) / (len(test) + len(train)) < 0.3


def test_a_folder_of_another_generator_version_is_not_current(demo_small, tmp_path):
    assert demo_is_current(demo_small) and not demo_is_current(tmp_path)
    info = json.loads((demo_small / "benchmark.json").read_text())
    (tmp_path / "benchmark.json").write_text(json.dumps({**info, "generator_version": "1.0"}))
    assert not demo_is_current(tmp_path)
