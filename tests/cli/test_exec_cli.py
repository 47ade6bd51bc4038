"""`bapsql exec` (bapsql/cli/env.py): one execute_query turn of a fresh episode, as JSON."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from bapsql.cli import cli
from tests.env.people_db import build_people_db


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    return build_people_db(tmp_path_factory.mktemp("db") / "people.sqlite")


@pytest.fixture
def run(tmp_path, monkeypatch):
    monkeypatch.setenv("BAPSQL_CACHE_DIR", str(tmp_path / "cache"))

    def invoke(*args):
        return CliRunner().invoke(cli, ["exec", *args, "--tokenizer", "regex"])

    return invoke


def test_exec_ok_json(run, db):
    r = run("--db", str(db), "--sql", "SELECT count(*) AS n FROM person", "--budget", "XS", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["status"] == "ok" and out["rows"] == [[600]] and out["columns"] == ["n"]
    led = out["ledger"]
    assert led["queries"] == 1 and led["turns"] == 1 and led["vm_steps"] > 0 and 0 < led["result_tokens"] <= 80
    assert led["remaining"]["queries"] == 0


def test_exec_truncated_json(run, db):
    r = run("--db", str(db), "--sql", "SELECT * FROM person", "--budget", "XS", "--json")
    out = json.loads(r.output)
    assert r.exit_code == 0 and out["status"] == "truncated" and out["truncated_by"] == "result_tokens"
    assert 0 < len(out["rows"]) < 600 and out["rows_total"] == 600 and out["ledger"]["result_tokens"] <= 80


def test_exec_rejected_exits_zero(run, db):
    r = run("--db", str(db), "--sql", "DROP TABLE person", "--budget", "S", "--json")
    out = json.loads(r.output)
    assert r.exit_code == 0 and out["status"] == "rejected" and out["message"]
    assert out["ledger"]["queries"] == 0 and out["ledger"]["turns"] == 1


def test_exec_sql_error_exits_two(run, db):
    r = run("--db", str(db), "--sql", "SELECT missing_column FROM person", "--json")
    assert r.exit_code == 2
    out = json.loads(r.output)
    assert out["status"] == "error" and "missing_column" in out["message"]


def test_exec_missing_db_is_a_clear_error(run, tmp_path):
    r = run("--db", str(tmp_path / "nope.sqlite"), "--sql", "SELECT 1", "--json")
    assert r.exit_code == 2 and "database file not found" in r.output and "Traceback" not in r.output


def test_exec_not_a_database_is_a_clear_error(run, tmp_path):
    bad = tmp_path / "bad.sqlite"
    bad.write_text("this is not sqlite" * 100)
    r = run("--db", str(bad), "--sql", "SELECT 1")
    assert r.exit_code == 2 and "Error:" in r.output and "Traceback" not in r.output


def test_exec_unknown_budget_is_a_usage_error(run, db):
    r = run("--db", str(db), "--sql", "SELECT 1", "--budget", "XXL")
    assert r.exit_code == 2 and "unknown budget level" in r.output


def test_exec_text_output(run, db):
    r = run("--db", str(db), "--sql", "SELECT name FROM city ORDER BY id LIMIT 2", "--budget", "M")
    assert r.exit_code == 0 and "E1 (ok): 2 rows" in r.output and "Paris" in r.output


def test_exec_help():
    r = CliRunner().invoke(cli, ["exec", "--help"])
    assert r.exit_code == 0 and "--budget" in r.output and "execute_query" in r.output


@pytest.mark.parametrize("cached", [True, False])
def test_a_write_lock_past_the_timeout_is_a_busy_rejection(tmp_path, run, cached):
    from tests.db.writers import hold_lock, make_db, stop

    live = make_db(tmp_path / "live.sqlite", wal=False)
    if cached:  # the catalog is cached, but opening still needs the lock: rejected while opening
        assert run("--db", str(live), "--sql", "SELECT 1").exit_code == 0
    proc = hold_lock(live, 60)
    try:
        res = run("--db", str(live), "--sql", "SELECT count(*) FROM item", "--busy-timeout", "0.2", "--json")
    finally:
        stop(proc)
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["status"] == "rejected" and out["rejection"] == "busy" and "busy" in out["message"]
    assert out["ledger"]["queries"] == 0 and out["rows"] == []
    res = run("--db", str(live), "--sql", "SELECT count(*) FROM item", "--json")  # the writer is gone
    assert res.exit_code == 0 and json.loads(res.stdout)["rows"] == [[2_000]]


def test_a_short_write_lock_is_waited_for(tmp_path, run):
    from tests.db.writers import hold_lock, make_db, stop

    live = make_db(tmp_path / "live.sqlite", wal=False)
    proc = hold_lock(live, 0.5)
    try:
        res = run("--db", str(live), "--sql", "SELECT count(*) FROM item", "--json")
    finally:
        stop(proc)
    assert res.exit_code == 0 and json.loads(res.stdout)["rows"] == [[2_001]]  # the writer's row, committed


def test_exec_under_a_condition_and_a_chosen_calibration(run, db, tmp_path):
    r = run("--db", str(db), "--sql", "SELECT * FROM person", "--budget", "XS", "--condition", "adaptive_posthoc")
    assert r.exit_code == 0, r.output
    assert "E1 (profiled): 600 rows" in r.output and "post-hoc control" in r.output
    from bapsql.db.calibration import DEFAULT_PATH

    mine = tmp_path / "cal.json"
    mine.write_text(DEFAULT_PATH.read_text())
    ok = run("--db", str(db), "--sql", "SELECT count(*) FROM person", "--calibration", str(mine), "--json")
    assert ok.exit_code == 0, ok.output
    bad = run("--db", str(db), "--sql", "SELECT 1", "--calibration", str(tmp_path / "none.json"))
    assert bad.exit_code == 2 and "calibration file not found" in bad.output
    cond = run("--db", str(db), "--sql", "SELECT 1", "--condition", "nope")
    assert cond.exit_code == 2 and "unknown condition 'nope'" in cond.output
