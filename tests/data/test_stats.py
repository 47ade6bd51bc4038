"""Benchmark statistics: the JSON contract keys and counts that agree with the loaded tasks."""

from __future__ import annotations

from bapsql.data.load import load_benchmark
from bapsql.data.stats import benchmark_stats


def test_stats_of_the_embedded_benchmark(demo_small):
    bench = load_benchmark(demo_small)
    st = benchmark_stats(bench).to_json()
    for key in ("databases", "tasks", "missing_databases", "failed_gold", "answer_types"):
        assert key in st
    assert st["databases"] == 14 and st["tasks"] == len(bench.tasks)
    assert st["missing_databases"] == [] and st["failed_gold"] == 0
    assert set(st["answer_types"]) == {"scalar", "list", "ordered_list"}
    assert sum(st["answer_types"].values()) == st["tasks"]
    assert sum(s["tasks"] for s in st["splits"].values()) == st["tasks"]  # train and test share databases
    assert set(st["splits"]) == {"train", "test", "validation", "dev"}
    assert 0 < st["shares"]["budget_sensitive"] < 1 and st["largest_table_rows"] >= 10_000
    assert {"gold_exceeds_XS", "naive_exceeds_XS", "gold_exceeds_S", "naive_exceeds_S"} <= set(st["measured"])
    assert st["database_bytes"] == sum(p.stat().st_size for p in (demo_small / "databases").rglob("*.sqlite"))
    bs = sum("budget_sensitive" in t.tags for t in bench.tasks) / len(bench.tasks)
    assert abs(st["shares"]["budget_sensitive"] - bs) < 1e-4


def test_empty_gold_answers_are_counted_per_benchmark_and_split(tmp_path):
    """Issue 30, item 9: where the gold query returns no rows, `[]` is correct without evidence; stats count them."""
    import json

    from click.testing import CliRunner

    from bapsql.cli import cli
    from bapsql.data.benchmark import empty_gold

    from tests.policies.minibench import build_minibench_with_empty_gold

    root = build_minibench_with_empty_gold(tmp_path / "mini")
    bench = load_benchmark(root)
    assert sorted(t.task_id for t in bench.tasks if empty_gold(t)) == ["library-empty", "shop-empty"]
    st = benchmark_stats(bench).to_json()
    assert st["empty_gold"] == 2
    assert st["splits"]["dev"]["empty_gold"] == 1
    assert st["splits"]["train"]["empty_gold"] + st["splits"]["test"]["empty_gold"] == 1
    out = CliRunner().invoke(cli, ["data", "stats", "--benchmark", str(root), "--json"])
    assert out.exit_code == 0 and json.loads(out.output)["empty_gold"] == 2
    text = CliRunner().invoke(cli, ["data", "stats", "--benchmark", str(root)]).output
    assert "empty gold" in text
