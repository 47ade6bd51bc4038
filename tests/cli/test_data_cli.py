"""``bapsql data``: build-demo writes a folder every command accepts; stats --json keeps its contract; catalog and
calibrate run on it; bad input is a one-line error, never a traceback."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from bapsql.cli import cli

pytestmark = pytest.mark.slow  # every test builds or reads a whole embedded benchmark


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli_demo") / "bench"
    res = CliRunner().invoke(cli, ["data", "build-demo", "--scale", "small", "--out", str(out), "--workers", "1"])
    assert res.exit_code == 0, res.output
    assert "wrote 14 databases" in res.output
    return out


def run(*args):
    return CliRunner().invoke(cli, ["data", *map(str, args)])


def test_stats_json_contract(demo, tmp_path):
    res = run("stats", "--benchmark", demo, "--json", "--cache-dir", tmp_path)
    assert res.exit_code == 0, res.output
    st = json.loads(res.stdout)
    assert st["databases"] == 14 and st["tasks"] > 200
    assert st["missing_databases"] == [] and st["failed_gold"] == 0
    assert set(st["answer_types"]) == {"scalar", "list", "ordered_list"}
    assert set(st["splits"]) == {"train", "test", "validation", "dev"}  # test: held-out tasks of train DBs


def test_stats_table(demo, tmp_path):
    res = run("stats", "--benchmark", demo, "--cache-dir", tmp_path)
    assert res.exit_code == 0, res.output
    assert "budget_sensitive" in res.stdout and "validation" in res.stdout


def test_catalog_and_calibrate(demo, tmp_path):
    res = run("catalog", "--benchmark", demo, "--cache-dir", tmp_path)
    assert res.exit_code == 0, res.output
    assert "catalogs ready for 14 databases" in res.stdout
    assert len(list((tmp_path / "catalogs").glob("*.json"))) == 14
    out = tmp_path / "cal.json"
    res = run("calibrate", "--benchmark", demo, "--out", out, "--max-sqls-per-db", 6, "--json", "--cache-dir",
              tmp_path)
    assert res.exit_code == 0, res.output
    rep = json.loads(res.stdout)
    assert rep["train_samples"] > 0 and rep["heldout_samples"] > 0
    assert set(rep["coverage_heldout"]) == {"rows", "result_tokens", "vm_steps"}
    assert json.loads(out.read_text())["source"]


@pytest.mark.parametrize("args, code, text", [
    (["stats", "--benchmark", "/no/such/folder"], 1, "benchmark folder not found"),
    (["build-demo", "--scale", "huge", "--out", "x"], 2, "huge"),
    (["stats"], 2, "--benchmark"),
])
def test_bad_input_is_one_clear_line(args, code, text):
    res = run(*args)
    assert res.exit_code == code
    assert text in res.output and "Traceback" not in res.output


def test_build_demo_refuses_a_file_as_out(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    res = run("build-demo", "--out", f)
    assert res.exit_code == 2 and "is a file" in res.output


def test_help_is_useful():
    res = run("--help")
    assert res.exit_code == 0
    for cmd in ("build-demo", "stats", "catalog", "calibrate"):
        assert cmd in res.output
    assert "--benchmark" in run("calibrate", "--help").output


def test_check_reports_sound_hot_and_damaged_files(tmp_path):
    from tests.db.writers import crash_mid_write, make_db

    db = make_db(tmp_path / "ok.sqlite", wal=True)
    res = run("check", "--db", db, "--json")
    assert res.exit_code == 0, res.output
    rep = json.loads(res.stdout)
    assert rep["ok"] and rep["mode"] == "quick_check" and rep["journal_mode"] == "wal" and rep["problems"] == []
    hot = make_db(tmp_path / "hot.sqlite", wal=False, rows=20_000)
    crash_mid_write(hot)
    res = run("check", "--db", hot)
    assert res.exit_code == 1 and "hot rollback journal" in res.output and "Traceback" not in res.output
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"not a database at all" * 50)
    res = run("check", "--db", junk, "--json")
    assert res.exit_code == 1 and "not a SQLite database" in json.loads(res.stdout)["problems"][0]
