"""Observation text (bapsql/env/render.py)."""

from __future__ import annotations

import dataclasses

import pytest

from bapsql.db.estimator import Estimate, Quantiles
from bapsql.db.rows import render_table
from bapsql.env import render
from bapsql.env.evidence import EvidenceOp, EvidenceStore
from bapsql.env.ledger import Usage


def _est(error=None):
    return Estimate(Quantiles(10, 40), Quantiles(55.4, 210), Quantiles(1000, 5000), ("name", "n"), 12, (), {}, error)


def test_system_prompt_lists_only_allowed_tools():
    full = render.system_prompt()
    assert all(f"- {t}(" in full for t in ("inspect_schema", "estimate_query", "answer", "abstain"))
    assert "<tool_call>" in full and "Budget:" in full
    small = render.system_prompt(("execute_query", "answer"), show_budget=False)
    assert "estimate_query" not in small and "Budget:" not in small and "- execute_query(sql)" in small


def test_dashboard_lists_every_channel():
    line = render.dashboard(Usage(1800, 1, 80, 250000, 4), Usage(2400, 1, 80, 250000, 5))
    assert line == ("[left] context 1800/2400 | queries 1/1 | result tokens 80/80 | VM steps 250000/250000 | "
                    "turns 4/5")


def test_estimate_observation_with_warning_and_error():
    text = render.estimate_observation("estimate", _est(), ["p95 exceeds what remains: result tokens 210 > 80"])
    lines = text.splitlines()
    assert lines[0] == ("estimate: rows p50 10 p95 40 | result tokens p50 55 p95 210 | VM steps p50 1000 p95 5000")
    assert lines[1] == "columns: name, n" and lines[2].startswith("WARNING: p95 exceeds")
    assert render.estimate_observation("estimate", _est("no such table: x"), []) == \
        "estimate: the query cannot run: no such table: x"


def test_block_body_by_state():
    store = EvidenceStore()
    b = store.add(sql="q", columns=("name", "n"), rows=[("a", 1), ("b", None)], status="truncated", truncated=True,
                  truncated_by="rows", rows_total=9, result_tokens=7, turn=1)
    assert render.block_body(b) == render_table(b.columns, b.rows) + "\n[truncated by the rows cap: 2 of 9 rows shown]"
    assert render.block_body(dataclasses.replace(b, state="archived")) == \
        "[E1 archived: 2 rows x 2 columns; restore to see the rows]"
    assert render.block_body(dataclasses.replace(b, state="compressed")).startswith("[E1 compressed profile] 2 of 9")
    assert render.block_body(dataclasses.replace(b, state="discarded")) == "[E1 discarded]"
    stopped = dataclasses.replace(b, truncated_by="vm_steps", rows_total=None)
    assert render.block_body(stopped).endswith("[stopped by the VM-step cap: 2 rows shown, the result is incomplete]")


def test_schema_observation_cut_note_and_unknown_tables():
    text = render.schema_observation(["a (1 rows): x INTEGER"], ["zzz"], ["a", "b"], total=3)
    assert "[2 more schema lines cut to fit the context; inspect fewer tables]" in text
    assert "Unknown table(s): zzz. Tables: a, b" in text


def test_invalid_and_evidence_observations():
    text = render.invalid_observation("no tool call found", ("execute_query", "answer"))
    assert text.startswith("Invalid action: no tool call found") and "Tools: execute_query, answer" in text
    assert "<tool>" not in text and "{...}" not in text  # a model copies a placeholder back verbatim
    from bapsql.env.actions import parse_action

    prose = render.invalid_observation(parse_action("The answer is: 1").reason)  # SmolLM2's zero-shot turn
    assert "no tool call found" in prose and "..." not in prose.split("for example")[0]


@pytest.mark.parametrize("tools", [("inspect_schema", "execute_query", "answer"), ("execute_query", "abstain")])
def test_the_invalid_action_example_is_itself_a_valid_call(tools):
    from bapsql.env.actions import InvalidAction, parse_action

    text = render.invalid_observation("no tool call found", tools)
    example = text.split("for example: ", 1)[1].rsplit("\nTools:", 1)[0]
    action = parse_action(example)
    assert not isinstance(action, InvalidAction), action
    assert type(action).__name__ in {"InspectSchema", "Abstain"}
    refused = EvidenceOp("restore", "E1", False, "discarded", "discarded", "cannot restore E1: it is discarded")
    assert render.evidence_observation(refused, None) == "manage_evidence refused: cannot restore E1: it is discarded"


def test_terse_system_prompt_has_one_line_per_offered_tool():
    terse = render.system_prompt(("execute_query", "answer"), style="terse")
    assert terse.splitlines() == ["SQLite questions. One tool call per turn. Tools:", "execute_query(sql)",
                                  "answer(kind, values, citations)"]
    assert len(render.system_prompt(style="terse")) < len(render.system_prompt()) / 4
