"""The in-process runner: Parquet logs per episode and turn, deterministic ids, resume, DuckDB-readable."""

from __future__ import annotations

import duckdb
import pyarrow.parquet as pq
import pytest

from bapsql.data.tasks import resolve_benchmark
from bapsql.logs.reader import read_episodes, read_turns
from bapsql.logs.schema import EPISODES_SCHEMA, TURNS_SCHEMA
from bapsql.logs.writer import episode_id
from bapsql.rollout.runner import evaluate, summary_table
from tests.policies.minibench import build_minibench


@pytest.fixture(scope="module")
def bench(tmp_path_factory, monkeypatch_module):
    return build_minibench(tmp_path_factory.mktemp("bench"))


@pytest.fixture(scope="module")
def monkeypatch_module(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("BAPSQL_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
    yield mp
    mp.undo()


@pytest.fixture(scope="module")
def three_seed_run(bench, tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "r1"
    summary = evaluate(bench, "dev", "workflow.estimate_rewrite", ["XS", "S"], [0, 1, 2], out)
    return out, summary


def test_episodes_and_turns_are_logged(three_seed_run):
    out, summary = three_seed_run
    assert summary.episodes_run == 2 * 3 * 6 and summary.episodes_skipped == 0
    assert list((out / "episodes").glob("method=workflow.estimate_rewrite@full/budget=*/part-*.parquet"))
    eps, turns = read_episodes(out), read_turns(out)
    assert len(eps) == 36 and set(eps["budget"]) == {"XS", "S"} and set(eps["seed"]) == {0, 1, 2}
    for col in ("method", "budget", "seed", "task_id", "db_id", "correct", "feasible", "success", "total_tokens",
                "queries", "result_tokens", "vm_steps", "turns"):
        assert col in eps.columns
    assert (eps.groupby("episode_id")["turns"].first().sum()) == len(turns)
    assert not eps["breach"].any() and (eps["invalid_actions"] == 0).all()
    row = eps.iloc[0]
    assert row["episode_id"] == episode_id("r1", row["method"], row["budget"], int(row["seed"]), row["task_id"])
    assert summary.invalid_actions == 0 and summary.breaches == 0
    assert [b.budget for b in summary.per_budget] == ["XS", "S"]
    assert sum(b.successes for b in summary.per_budget) == int(eps["success"].sum())


def test_logs_follow_the_versioned_schema(three_seed_run):
    out, _ = three_seed_run
    ep_file = next((out / "episodes").rglob("part-*.parquet"))
    turn_file = next((out / "turns").rglob("part-*.parquet"))
    partition = {"method", "budget"}
    assert set(pq.read_schema(ep_file).names) == set(EPISODES_SCHEMA.names) - partition
    assert set(pq.read_schema(turn_file).names) == set(TURNS_SCHEMA.names) - partition


def test_duckdb_reads_a_three_seed_run(three_seed_run):
    out, _ = three_seed_run
    rows = duckdb.sql(
        f"SELECT budget, seed, count(*) AS n, avg(success::INT) AS s FROM read_parquet('{out}/episodes/**/*.parquet', "
        "hive_partitioning=1) GROUP BY budget, seed ORDER BY budget, seed").fetchall()
    assert [(b, s, n) for b, s, n, _ in rows] == [(b, s, 6) for b in ("S", "XS") for s in (0, 1, 2)]
    n_turns = duckdb.sql(f"SELECT count(*) FROM read_parquet('{out}/turns/**/*.parquet', hive_partitioning=1) "
                         "WHERE method = 'workflow.estimate_rewrite@full'").fetchall()[0][0]
    assert n_turns == len(read_turns(out))


def test_rerun_skips_logged_episodes_and_extends(three_seed_run, bench):
    out, first = three_seed_run
    before = len(read_episodes(out))
    again = evaluate(bench, "dev", "workflow.estimate_rewrite", ["XS", "S", "M"], [0, 1, 2], out)
    assert again.episodes_skipped == 36 and again.episodes_run == 18
    eps = read_episodes(out)
    assert len(eps) == before + 18 and eps["episode_id"].is_unique


def test_runs_are_deterministic_per_seed(bench, tmp_path):
    a = evaluate(bench, "dev", "scripted.drafter@raw", ["S"], [0, 1], tmp_path / "a", run_name="same", limit=4)
    evaluate(bench, "dev", "scripted.drafter@raw", ["S"], [0, 1], tmp_path / "b", run_name="same", limit=4)
    cols = ["episode_id", "success", "total_tokens", "queries", "answer"]
    ea = read_episodes(tmp_path / "a")[cols].sort_values("episode_id").reset_index(drop=True)
    eb = read_episodes(tmp_path / "b")[cols].sort_values("episode_id").reset_index(drop=True)
    assert ea.equals(eb) and a.tasks == 4


def test_turns_keep_the_policys_text_unless_log_text_says_none(three_seed_run, bench, tmp_path):
    """By default every turn logs the completion the env received and the observation it returned; with
    ``log_text`` none the columns are null and the rest of the row is the same."""
    from bapsql.logs.text import TextLogConfig

    out, _ = three_seed_run
    turns = read_turns(out)
    assert turns["completion"].str.startswith("<tool_call>").all() and turns["observation"].notna().all()
    assert (turns[turns.action == "execute_query"]["observation"].str.contains(r"E\d+ \(")).any()
    evaluate(bench, "dev", "workflow.estimate_rewrite", ["XS"], [0], tmp_path, run_name="r1", limit=3,
             log_text=TextLogConfig(mode="none"))
    bare = read_turns(tmp_path)
    assert len(bare) and bare["completion"].isna().all() and bare["observation"].isna().all()
    same = turns[turns.episode_id.isin(set(bare.episode_id))].sort_values(["episode_id", "turn"])
    assert list(same["action"]) == list(bare.sort_values(["episode_id", "turn"])["action"])


def test_conditions_are_logged_under_their_own_method(bench, tmp_path):
    s = evaluate(bench, "dev", "workflow.estimate_rewrite", ["XS"], [0], tmp_path, condition="no_interface")
    assert s.method == "workflow.estimate_rewrite@no_interface"
    eps = read_episodes(tmp_path)
    assert set(eps["method"]) == {"workflow.estimate_rewrite@no_interface"}
    assert set(eps["condition"]) == {"no_interface"}
    assert "estimate_query" not in set(read_turns(tmp_path)["action"])


def test_summary_table_renders(three_seed_run):
    from rich.console import Console

    _, summary = three_seed_run
    console = Console(record=True, width=140)
    console.print(summary_table(summary))
    text = console.export_text()
    assert "workflow.estimate_rewrite" in text and "XS" in text and "success %" in text


def test_demo_resolves_to_the_cached_benchmark(tmp_path, bench):
    import shutil

    import json

    from bapsql.data.demo import GENERATOR_VERSION

    shutil.copytree(bench, tmp_path / "demo-small")
    info_path = tmp_path / "demo-small" / "benchmark.json"  # written by this generator version: reused as is
    info_path.write_text(json.dumps({**json.loads(info_path.read_text()), "generator_version": GENERATOR_VERSION}))
    messages = []
    assert resolve_benchmark("demo", cache_dir=tmp_path, announce=messages.append) == tmp_path / "demo-small"
    assert messages == []  # already there: nothing built
    assert resolve_benchmark(str(bench)) == bench


def test_a_demo_spec_with_a_mix_resolves_to_its_own_cached_folder(tmp_path):
    messages: list[str] = []
    root = resolve_benchmark("demo:binding", cache_dir=tmp_path, announce=messages.append)
    assert root == tmp_path / "demo-small-binding" and (root / "benchmark.json").is_file()
    assert messages == [f"building the embedded demo benchmark (small scale, binding mix) into {root} ..."]
    assert resolve_benchmark("demo:binding", cache_dir=tmp_path, announce=messages.append) == root
    assert len(messages) == 1  # cached: not built again
