"""`bapsql episode` (bapsql/cli/env.py): scripted and interactive episodes."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from bapsql.cli import cli
from bapsql.env.actions import EstimateQuery, render_action
from tests.env.people_db import build_people_db

PARIS = "SELECT count(*) FROM person p JOIN city c ON p.city_id = c.id WHERE c.name = 'Paris'"


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    return build_people_db(tmp_path_factory.mktemp("db") / "people.sqlite")


@pytest.fixture
def run(tmp_path, monkeypatch):
    monkeypatch.setenv("BAPSQL_CACHE_DIR", str(tmp_path / "cache"))

    def invoke(*args, input=None):
        return CliRunner().invoke(cli, ["episode", *args, "--tokenizer", "regex"], input=input)

    return invoke


def _actions_file(tmp_path, lines):
    p = tmp_path / "actions.txt"
    p.write_text("\n".join(lines) + "\n")
    return p


def test_episode_scripted_json(run, db, tmp_path):
    lines = [
        render_action(EstimateQuery(PARIS)).replace("\n", ""),  # a one-line tool call
        json.dumps({"name": "execute_query", "arguments": {"sql": PARIS}}),
        "",
        json.dumps({"name": "answer", "arguments": {"kind": "scalar", "values": [120], "citations": ["E1"]}}),
        json.dumps({"name": "abstain", "arguments": {"reason": "never reached"}}),
    ]
    r = run("--db", str(db), "--question", "How many people live in Paris?", "--budget", "S",
            "--actions", str(_actions_file(tmp_path, lines)), "--gold-sql", PARIS, "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert [s["action"] for s in out["steps"]] == ["reset", "estimate_query", "execute_query", "answer"]
    s = out["summary"]
    assert s["success"] and s["correct"] and s["queries"] == 1 and s["turns"] == 3 and s["evidence_score"] == 0.75
    assert out["done"] and out["ledger"]["spent"]["queries"] == 1 and len(out["turns"]) == 3


def test_episode_text_output_and_invalid_line(run, db, tmp_path):
    lines = ["please run the query", json.dumps({"name": "abstain", "arguments": {"reason": "cannot"}})]
    r = run("--db", str(db), "--question", "How many?", "--budget", "XS",
            "--actions", str(_actions_file(tmp_path, lines)))
    assert r.exit_code == 0, r.output
    assert "Invalid action: no tool call found" in r.output and "=== turn 2: abstain ===" in r.output
    assert "queries: 0 / 1" in r.output and "failure: unjustified_abstention" in r.output


def test_episode_reads_stdin_until_eof(run, db):
    stdin = json.dumps({"name": "inspect_schema", "arguments": {"tables": ["city"]}}) + "\n"
    r = run("--db", str(db), "--question", "Which cities?", "--budget", "XS", input=stdin)
    assert r.exit_code == 0, r.output
    assert "city (5 rows)" in r.output and "ran out before the episode ended" in r.output


def test_episode_missing_db(run, tmp_path):
    r = run("--db", str(tmp_path / "x.sqlite"), "--question", "q", input="")
    assert r.exit_code == 2 and "database file not found" in r.output


def test_episode_help():
    r = CliRunner().invoke(cli, ["episode", "--help"])
    assert r.exit_code == 0 and "--actions" in r.output and "--gold-sql" in r.output
