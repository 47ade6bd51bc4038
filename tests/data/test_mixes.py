"""Task mixes of the embedded benchmark: the binding mix makes gold queries outgrow XS and broad drafts outgrow S,
and that moves a scripted policy's success with the level and with how it spends the budget; the default mix is
unchanged."""

from __future__ import annotations

import json

import pytest

from bapsql.budgets import load_ladder
from bapsql.data.augment import augment_tasks
from bapsql.data.demo import DIFFICULTY, demo_is_current
from bapsql.data.load import load_benchmark
from bapsql.data.mixes import DEFAULT_MIX, MIXES, mix_named, recorded_mix
from bapsql.data.synth_tasks import TEMPLATES
from bapsql.data.tasks import demo_mix, load_tasks, resolve_benchmark
from bapsql.errors import ConfigError


def test_every_mix_names_known_templates_and_its_shares_sum_to_one():
    graded = {name for names in DIFFICULTY.values() for name in names}
    for mix in MIXES.values():
        assert set(mix.weights) <= set(TEMPLATES) and set(mix.weights) <= graded
        assert set(mix.shares) == {"calm", "budget_sensitive", "unanswerable_xs"}
        assert sum(mix.shares.values()) == pytest.approx(1.0)
        assert set(mix.heavy_per_db) == {"small", "full"}
    # the binding mix only adds: the default templates keep their weights
    assert MIXES["binding"].weights.items() >= MIXES["default"].weights.items()
    assert {"topk_long", "list_long"} <= set(MIXES["binding"].weights) - set(MIXES["default"].weights)


def test_an_unknown_mix_is_refused_with_the_known_names(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown task mix 'tight'; known: \['binding', 'default'\]"):
        mix_named("tight")
    with pytest.raises(ConfigError, match="unknown task mix 'tight'"):
        resolve_benchmark("demo:tight", cache_dir=tmp_path)
    assert not list(tmp_path.iterdir())  # nothing was built


def test_demo_specs_name_their_mix():
    assert demo_mix("demo") == DEFAULT_MIX and demo_mix("demo:binding") == "binding"
    assert demo_mix("runs/bench") is None and demo_mix("demonstration") is None


def _pool(task) -> str:
    return next((p for p in ("unanswerable_xs", "budget_sensitive") if p in task.tags), "calm")


def test_the_binding_mix_is_recorded_and_fills_a_third_of_test_with_gold_over_xs(demo_small, demo_binding):
    info = json.loads((demo_binding / "benchmark.json").read_text())
    assert info["mix"] == "binding" and "mix" not in json.loads((demo_small / "benchmark.json").read_text())
    assert demo_is_current(demo_binding, "binding") and not demo_is_current(demo_binding)
    assert demo_is_current(demo_small) and not demo_is_current(demo_small, "binding")
    assert recorded_mix(demo_binding) == "binding" and recorded_mix(demo_small) == DEFAULT_MIX
    ladder = load_ladder()
    costs = json.loads((demo_binding / "manifest.json").read_text())["costs"]
    for root, low, high in ((demo_small, 0.0, 0.05), (demo_binding, 0.2, 0.4)):
        test = load_tasks(root, "test")
        heavy = [t for t in test if _pool(t) == "unanswerable_xs"]
        assert low <= len(heavy) / len(test) <= high
    test = load_tasks(demo_binding, "test")
    for t in test:
        gold = costs[t.task_id]["gold"]
        if _pool(t) == "unanswerable_xs":  # over XS's result tokens or VM steps, within S's
            assert gold["result_tokens"] > ladder["XS"].result_tokens or gold["vm_steps"] > ladder["XS"].vm_steps
            assert "min_level:S" in t.tags or "min_level:M" in t.tags
    long = [t for t in test if any(tag in t.tags for tag in ("template:topk_long", "template:list_long"))]
    assert len(long) >= 10 and all(t.gold.kind in ("list", "ordered_list") and len(t.gold.values) >= 12 for t in long)


def test_augmented_prompts_follow_the_benchmark_mix(demo_small, demo_binding):
    def templates(root):
        return {tag for t in augment_tasks(root, "train", 1) for tag in t.tags if tag.startswith("template:")}

    assert {"template:topk_long", "template:list_long"} <= templates(demo_binding)
    assert not {"template:topk_long", "template:list_long"} & templates(demo_small)


def _success_by_level(root, policy: str, out) -> dict[str, float]:
    from bapsql.rollout.runner import evaluate

    summary = evaluate(root, "test", policy, ["XS", "S", "M", "L"], [0], out)
    return {b.budget: b.success_rate for b in summary.per_budget}


@pytest.mark.slow  # four scripted sweeps of the test split at XS-L (seconds each)
def test_under_the_binding_mix_a_broad_first_draft_costs_success_at_tight_budgets(demo_small, demo_binding, tmp_path):
    roots = (demo_small, demo_binding)
    careful = {r: _success_by_level(r, "workflow.estimate_rewrite", tmp_path / f"c{i}") for i, r in enumerate(roots)}
    broad = {r: _success_by_level(r, "workflow.recover_after_rejection", tmp_path / f"b{i}")
             for i, r in enumerate(roots)}
    # XS: the gold lists that outgrow XS fail for every policy; S-L: the careful policy fits everything
    assert careful[demo_binding]["XS"] <= 0.8 < careful[demo_small]["XS"]
    assert all(careful[demo_binding][b] == 1.0 for b in ("S", "M", "L"))
    # running the broad draft first spends S's result tokens before the list: a larger loss than on the default mix
    loss = {r: careful[r]["S"] - broad[r]["S"] for r in (demo_small, demo_binding)}
    assert loss[demo_binding] > loss[demo_small] + 0.1
