"""``bapsql estimate`` (bapsql/cli/db.py): the JSON contract, the table, and clean errors."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from bapsql.cli import cli
from tests.db.shop_db import build_shop


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    return build_shop(tmp_path_factory.mktemp("cli") / "shop.sqlite", n_orders=3_000)


def run(*args, env_dir):
    return CliRunner().invoke(cli, ["estimate", *args, "--tokenizer", "regex", "--cache-dir", str(env_dir)])


def test_json_contract(db, tmp_path):
    r = run("--db", str(db), "--sql", "SELECT status, count(*) FROM orders GROUP BY status", "--json",
            env_dir=tmp_path)
    assert r.exit_code == 0, r.output
    obj = json.loads(r.output)
    for q in ("rows", "result_tokens", "vm_steps"):
        assert set(obj[q]) == {"p50", "p95"} and obj[q]["p50"] <= obj[q]["p95"]
    assert obj["columns"] == ["status", "count(*)"] and obj["error"] is None
    assert isinstance(obj["probe_vm_steps"], int) and obj["plan"] and isinstance(obj["features"], dict)
    assert obj["rows"]["p95"] <= 3  # three statuses


def test_budget_and_table_output(db, tmp_path):
    r = run("--db", str(db), "--sql", "SELECT * FROM orders", "--budget", "XS", env_dir=tmp_path)
    assert r.exit_code == 0, r.output
    assert "rows" in r.output and "EXCEEDS XS" in r.output and "plan:" in r.output and "SCAN orders" in r.output
    j = json.loads(run("--db", str(db), "--sql", "SELECT count(*) FROM orders", "--budget", "S", "--json",
                       env_dir=tmp_path).output)
    assert j["budget"]["level"] == "S" and j["budget"]["fits"]["vm_steps"] is True


def test_bad_sql_exits_2_with_the_message(db, tmp_path):
    r = run("--db", str(db), "--sql", "DELETE FROM orders", env_dir=tmp_path)
    assert r.exit_code == 2 and "DELETE" in r.output and "Traceback" not in r.output
    r = run("--db", str(db), "--sql", "SELECT nope FROM orders", "--json", env_dir=tmp_path)
    assert r.exit_code == 2 and "no such column" in json.loads(r.output)["error"]


def test_usage_errors(db, tmp_path):
    r = run("--db", str(tmp_path / "missing.sqlite"), "--sql", "SELECT 1", env_dir=tmp_path)
    assert r.exit_code == 2 and "not found" in r.output
    r = run("--db", str(db), "--sql", "SELECT 1", "--budget", "XXL", env_dir=tmp_path)
    assert r.exit_code == 2 and "XXL" in r.output
    r = CliRunner().invoke(cli, ["estimate", "--help"])
    assert r.exit_code == 0 and "--budget" in r.output and "p50/p95" in r.output
