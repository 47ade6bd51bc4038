"""The slip bank: a policy's own failed first queries, harvested from turn logs and replayed in recovery SFT."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bapsql.errors import ConfigError, DataError
from bapsql.policies.slips import SlipBank, first_query_errors, harvest_slips, is_slip, prepare_error


def _turn(ep, task, turn, action, sql="", status="ok"):
    return {"episode_id": ep, "task_id": task, "turn": turn, "action": action, "sql": sql, "status": status}


def _write_turns(path, rows):
    path.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows), path / "part-00000.parquet")
    return path


@pytest.fixture()
def shop_tasks(mini_tasks):
    return sorted((t for t in mini_tasks.values() if t.db_id == "shop"), key=lambda t: t.task_id)


def test_prepare_error_tells_a_missing_name_from_other_refusals(shop_tasks):
    from bapsql.db.sandbox import Sandbox

    with Sandbox(shop_tasks[0].db_path) as db:
        assert prepare_error(db, "SELECT COUNT(*) FROM orders") is None
        missing_col = prepare_error(db, "SELECT COUNT(*) FROM orders WHERE shipped_flag = 1")
        missing_table = prepare_error(db, "SELECT COUNT(*) FROM shipments")
        syntax = prepare_error(db, "SELECT COUNT(*) FROM orders WHERE")
    assert is_slip(missing_col) and is_slip(missing_table)
    assert syntax is not None and not is_slip(syntax)


def test_prepare_error_compiles_without_running(shop_tasks):
    """A slip is judged by compiling it (EXPLAIN) on a read-only connection: a logged write never runs."""
    import sqlite3

    from bapsql.db.sandbox import Sandbox

    db = shop_tasks[0].db_path
    count = lambda: sqlite3.connect(db).execute("SELECT COUNT(*) FROM orders").fetchone()[0]  # noqa: E731
    before = count()
    with Sandbox(db) as sandbox:
        assert prepare_error(sandbox, "DELETE FROM orders") is not None  # refused by the sandbox
    assert count() == before > 0


def test_first_query_errors_keeps_the_first_query_of_each_episode():
    rows = [
        _turn("e1", "t1", 2, "execute_query", "SELECT later", "error"),  # not the first query of e1
        _turn("e1", "t1", 1, "execute_query", "SELECT first", "error"),
        _turn("e2", "t1", 1, "inspect_schema"),
        _turn("e2", "t1", 2, "execute_query", "SELECT first", "error"),  # a repeat on the same task: kept once
        _turn("e3", "t2", 1, "execute_query", "SELECT fine", "ok"),  # succeeded: no slip
        _turn("e4", "t2", 1, "execute_query", "SELECT other", "error"),
        _turn("e5", "t3", 1, "execute_query", "", "error"),  # no SQL logged
    ]
    assert first_query_errors(rows) == {"t1": ["SELECT first"], "t2": ["SELECT other"]}


def test_harvest_keeps_only_missing_names_on_given_tasks_and_separates_runs(shop_tasks, tmp_path):
    a, b = shop_tasks[0], shop_tasks[1]
    bad_col, bad_table = "SELECT COUNT(*) FROM orders WHERE shipped_flag = 1", "SELECT * FROM shipments"
    run0 = _write_turns(tmp_path / "r0", [
        _turn("e1", a.task_id, 1, "execute_query", bad_col, "error"),
        _turn("e2", a.task_id, 1, "execute_query", "SELECT COUNT(*) FROM orders WHERE", "error"),  # syntax: dropped
        _turn("e3", "not-a-given-task", 1, "execute_query", bad_col, "error"),  # unknown task: dropped
    ])
    run1 = _write_turns(tmp_path / "r1", [_turn("e9", a.task_id, 1, "execute_query", bad_table, "error"),
                                          _turn("e8", b.task_id, 1, "execute_query", "SELECT 1", "ok")])
    one = harvest_slips([(run0, shop_tasks)])
    assert [t.task_id for t in one.tasks] == [a.task_id] and one.slips == {a.task_id: (bad_col,)}
    both = harvest_slips([(run0, shop_tasks), (run1, shop_tasks)])
    # GRPO seeds draw different questions under the same ids: each run's tasks keep their own slips
    assert both.slips == {f"{a.task_id}.r0": (bad_col,), f"{a.task_id}.r1": (bad_table,)}
    assert all(t.question == a.question and t.gold_sql == a.gold_sql for t in both.tasks) and both.n_slips == 2


def test_harvest_without_slips_or_logs_is_a_clear_error(shop_tasks, tmp_path):
    run = _write_turns(tmp_path / "r", [_turn("e1", shop_tasks[0].task_id, 1, "execute_query", "SELECT 1", "ok")])
    with pytest.raises(DataError, match="no slips"):
        harvest_slips([(run, shop_tasks)])
    with pytest.raises(DataError, match="do not exist"):
        harvest_slips([(tmp_path / "missing", shop_tasks)])


def test_bank_round_trips_and_rejects_bad_files(shop_tasks, tmp_path):
    task = shop_tasks[0]
    bank = SlipBank((task,), {task.task_id: ("SELECT nope FROM orders",)})
    path = bank.save(tmp_path / "bank.jsonl")
    back = SlipBank.load(path)
    assert back.tasks == bank.tasks and dict(back.slips) == dict(bank.slips)
    with pytest.raises(DataError, match="does not exist"):
        SlipBank.load(tmp_path / "none.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(path.read_text() + '{"task": {}}\n')
    with pytest.raises(DataError, match="bad.jsonl:2"):
        SlipBank.load(bad)
    moved = json.loads(path.read_text())
    moved["task"]["db_path"] = str(tmp_path / "gone.sqlite")
    (tmp_path / "moved.jsonl").write_text(json.dumps(moved) + "\n")
    with pytest.raises(DataError, match="harvest it again"):
        SlipBank.load(tmp_path / "moved.jsonl")
    with pytest.raises(DataError, match="without a slip"):
        SlipBank((task,), {})


def test_bank_saved_with_its_benchmark_root_loads_under_another(minibench, shop_tasks, tmp_path):
    """Database paths under the benchmark folder are stored relative to it: the bank moves with the benchmark."""
    import shutil

    task = shop_tasks[0]
    path = SlipBank((task,), {task.task_id: ("SELECT nope FROM orders",)}).save(tmp_path / "bank.jsonl", minibench)
    assert not json.loads(path.read_text())["task"]["db_path"].startswith("/")
    moved = shutil.copytree(minibench, tmp_path / "elsewhere")
    back = SlipBank.load(path, moved)
    assert back.tasks[0].db_path == str(moved / json.loads(path.read_text())["task"]["db_path"])
    with pytest.raises(DataError, match="does not exist"):
        SlipBank.load(path)  # relative paths need their root


def test_recovery_episodes_replay_the_banks_slips(minibench, shop_tasks, tmp_path):
    """With a bank, every recovery episode plays one of its tasks and stages one of its slips (in the prompt, out
    of the loss); the direct episodes keep the split's tasks, so the workflows' shares stay as listed."""
    from bapsql.env.records import EnvOptions
    from bapsql.policies.sft_export import export_sft

    task = shop_tasks[0]
    slip = "SELECT COUNT(*) FROM orders WHERE shipped_flag = 1"
    bank = SlipBank((task,), {task.task_id: (slip,)})
    res = export_sft(minibench, "train", 12, tmp_path / "e.parquet", per_episode=True, budgets=("XS",),
                     workflows=("workflow.direct_aggregation", "workflow.recover_from_error"), slips=bank,
                     env_options=EnvOptions(prompt_style="terse"))
    rows = pq.read_table(res.path).to_pylist()
    recovered = [r for r in rows if r["workflow"] == "workflow.recover_from_error"]
    assert recovered and res.per_workflow.get("workflow.direct_aggregation", 0) >= 1
    for r in recovered:
        assert r["task_id"] == task.task_id
        assert slip in r["prompt"] and "no such column: shipped_flag" in r["prompt"]
        assert slip not in r["completion"]
    with pytest.raises(ConfigError, match="recover_from_error"):
        export_sft(minibench, "train", 4, tmp_path / "x.parquet", workflows=("workflow.direct_aggregation",),
                   slips=bank)


def test_the_job_harvests_a_runs_grpo_rollouts(tmp_path):
    """`python -m jobs.harvest_slips`: reads the training partition of each seed's GRPO turn logs (never the
    validation one), rebuilds the prompts those episodes played and writes the bank."""
    from click.testing import CliRunner

    from bapsql.data.tasks import resolve_benchmark
    from bapsql.train.config import load_train_config
    from bapsql.train.loop.grpo_data import grpo_tasks
    from jobs.harvest_slips import main

    cfg_path = "configs/train/cpu_learn_slips.yaml"
    cfg = load_train_config(cfg_path, {"out_dir": str(tmp_path / "runs")})
    root = resolve_benchmark(cfg.data.benchmark)
    task = grpo_tasks(cfg, 0, root)[0]
    turns = cfg.run_dir(0) / "grpo" / "rollouts" / "turns"
    _write_turns(turns / "method=model.policy@full" / "budget=XS",
                 [_turn("e1", task.task_id, 1, "execute_query", "SELECT no_such_name FROM nowhere", "error")])
    _write_turns(turns / "method=model.policy.val@full" / "budget=XS",  # validation: must not be read
                 [_turn("v1", task.task_id, 1, "execute_query", "SELECT held_out FROM nowhere", "error")])
    out = tmp_path / "bank.jsonl"
    res = CliRunner().invoke(main, ["--config", cfg_path, "--out-dir", str(tmp_path / "runs"), "--seeds", "0",
                                    "--out", str(out)])
    assert res.exit_code == 0, res.output
    bank = SlipBank.load(out, root)  # database paths relative to the benchmark folder
    assert [t.question for t in bank.tasks] == [task.question]
    assert list(bank.slips.values()) == [("SELECT no_such_name FROM nowhere",)]
    res = CliRunner().invoke(main, ["--config", cfg_path, "--out-dir", str(tmp_path / "runs"), "--seeds", "1",
                                    "--out", str(out)])
    assert res.exit_code == 2 and "do not exist" in res.output
