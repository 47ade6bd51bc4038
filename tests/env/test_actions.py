"""Tool-call parsing and rendering (bapsql/env/actions.py)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bapsql.env.actions import (
    TOOL_NAMES,
    TOOL_SCHEMAS,
    Abstain,
    AnswerAction,
    EstimateQuery,
    ExecuteQuery,
    InspectSchema,
    InvalidAction,
    ManageEvidence,
    RewriteQuery,
    action_from_json,
    parse_action,
    render_action,
)


def call(name, arguments, *, wrap=True):
    body = json.dumps({"name": name, "arguments": arguments})
    return f"<tool_call>\n{body}\n</tool_call>" if wrap else body


@pytest.mark.parametrize(
    "text, expected",
    [
        (call("inspect_schema", {}), InspectSchema(None)),
        (call("inspect_schema", {"tables": ["a", "b"]}), InspectSchema(("a", "b"))),
        (call("estimate_query", {"sql": "SELECT 1"}), EstimateQuery("SELECT 1")),
        (call("rewrite_query", {"sql": "SELECT 2", "reason": "smaller"}), RewriteQuery("SELECT 2", "smaller")),
        (call("execute_query", {"sql": "SELECT 3"}), ExecuteQuery("SELECT 3")),
        (call("manage_evidence", {"op": "archive", "ref": "e2"}), ManageEvidence("archive", "E2")),
        (call("answer", {"kind": "scalar", "values": [4], "citations": ["E1"]}), AnswerAction("scalar", (4,), ("E1",))),
        (call("answer", {"kind": "scalar", "values": 4}), AnswerAction("scalar", (4,), ())),
        (call("answer", {"kind": "list", "values": [["a", 1], ["b", None]]}),
         AnswerAction("list", (("a", 1), ("b", None)), ())),
        (call("abstain", {"reason": "too costly"}), Abstain("too costly")),
    ],
)
def test_parses_each_tool(text, expected):
    assert parse_action(text) == expected


def test_tolerates_prefix_text_fence_string_arguments_and_missing_close_tag():
    sql = {"sql": "SELECT 1"}
    expected = ExecuteQuery("SELECT 1")
    assert parse_action("I will run it.\n\n" + call("execute_query", sql) + "\nDone.") == expected
    fenced = "<tool_call>\n```json\n" + call("execute_query", sql, wrap=False) + "\n```\n</tool_call>"
    assert parse_action(fenced) == expected
    as_string = json.dumps({"name": "execute_query", "arguments": json.dumps(sql)})
    assert parse_action(f"<tool_call>{as_string}</tool_call>") == expected
    assert parse_action("<tool_call>\n" + call("execute_query", sql, wrap=False)) == expected
    # a closing tag quoted inside the SQL is part of the string, not the end of the call
    tricky = {"sql": "SELECT '</tool_call><tool_call>' AS x"}
    assert parse_action(call("execute_query", tricky)) == ExecuteQuery(tricky["sql"])


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("SELECT 1", "no tool call found"),
        ("", "no tool call found"),
        (call("execute_query", {"sql": "SELECT 1"}) * 2, "found 2 tool calls"),
        ("<tool_call>{\"name\": \"execute_query\", \"arguments\": {\"sql\": }</tool_call>", "not valid JSON"),
        ("<tool_call></tool_call>", "not valid JSON"),
        ("<tool_call>", "empty"),
        (call("drop_table", {}), "unknown tool 'drop_table'"),
        (call("execute_query", {}), "missing argument 'sql'"),
        (call("execute_query", {"sql": 5}), "'sql' must be a string"),
        (call("execute_query", {"sql": "  "}), "'sql' is empty"),
        (call("execute_query", {"sql": "x", "limit": 3}), "unexpected argument(s) ['limit']"),
        (call("manage_evidence", {"op": "delete", "ref": "E1"}), "'op' must be one of"),
        (call("manage_evidence", {"op": "archive", "ref": "block1"}), "'ref' must be an evidence id"),
        (call("answer", {"values": [1]}), "missing argument 'kind'"),
        (call("answer", {"kind": "number", "values": [1]}), "'kind' must be one of"),
        (call("answer", {"kind": "scalar", "values": [1, 2]}), "exactly one value"),
        (call("answer", {"kind": "list", "values": [{"a": 1}]}), "values[0] must be a string, number or null"),
        (call("answer", {"kind": "list", "values": [1], "citations": "E1"}), "'citations' must be an array"),
        (call("answer", {"kind": "list", "values": [1], "citations": ["row 3"]}), "not an evidence id"),
        (call("abstain", {}), "missing argument 'reason'"),
        ("<tool_call>[1, 2]</tool_call>", "must be a JSON object"),
        ("<tool_call>{\"name\": \"abstain\", \"arguments\": {\"reason\": \"x\"}, \"id\": 3}</tool_call>",
         "unexpected key(s) ['id']"),
        ("<tool_call>{\"name\": \"answer\", \"arguments\": {\"kind\": \"scalar\", \"values\": [NaN]}}</tool_call>",
         "NaN is not allowed"),
        ("<tool_call>{\"name\": \"abstain\", \"arguments\": \"{oops\"}</tool_call>", "not valid JSON"),
        ("<tool_call>{\"name\": \"abstain\", \"arguments\": {\"reason\": \"x\"}}} </tool_call>", "unexpected text"),
    ],
)
def test_invalid_with_precise_reason(text, fragment):
    a = parse_action(text)
    assert isinstance(a, InvalidAction)
    assert fragment in a.reason
    assert a.raw == text


def test_tool_schemas_cover_every_tool():
    names = [s["function"]["name"] for s in TOOL_SCHEMAS]
    assert tuple(names) == TOOL_NAMES
    for s in TOOL_SCHEMAS:
        f = s["function"]
        assert s["type"] == "function" and f["description"] and f["parameters"]["type"] == "object"
        assert set(f["parameters"]["required"]) <= set(f["parameters"]["properties"])
    json.dumps(TOOL_SCHEMAS)  # serializable for chat templates


def test_action_from_json_object():
    assert action_from_json({"name": "execute_query", "arguments": {"sql": "SELECT 1"}}) == ExecuteQuery("SELECT 1")
    assert isinstance(action_from_json({"name": "nope"}), InvalidAction)


# ------------------------------------------------------------------------------------------------ properties

text = st.text(max_size=40)
cell = st.one_of(st.none(), st.booleans(), st.integers(-(10**12), 10**12),
                 st.floats(allow_nan=False, allow_infinity=False), text)
refs = st.integers(1, 50).map(lambda i: f"E{i}")
nonempty = text.filter(lambda s: s.strip() != "")
actions = st.one_of(
    st.builds(InspectSchema, st.none() | st.lists(nonempty, min_size=1, max_size=3).map(tuple)),
    st.builds(EstimateQuery, nonempty),
    st.builds(RewriteQuery, nonempty, text),
    st.builds(ExecuteQuery, nonempty),
    st.builds(ManageEvidence, st.sampled_from(["archive", "compress", "discard", "restore"]), refs),
    st.builds(AnswerAction, st.just("scalar"), st.tuples(cell), st.lists(refs, max_size=3).map(tuple)),
    st.builds(AnswerAction, st.sampled_from(["list", "ordered_list"]),
              st.lists(cell | st.lists(cell, min_size=1, max_size=3).map(tuple), max_size=5).map(tuple),
              st.lists(refs, max_size=3).map(tuple)),
    st.builds(Abstain, text),
)


@settings(max_examples=150, deadline=None)
@given(actions)
def test_render_parse_round_trip(action):
    rendered = render_action(action)
    assert parse_action(rendered) == action
    assert render_action(parse_action(rendered)) == rendered


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200))
def test_parser_never_raises_on_arbitrary_text(t):
    a = parse_action(t)
    assert a.name in TOOL_NAMES + ("invalid",)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3),
    max_leaves=10,
)


@settings(max_examples=120, deadline=None)
@given(st.sampled_from(TOOL_NAMES + ("x",)), json_values, st.text(max_size=20), st.booleans())
def test_parser_never_raises_on_fuzzed_calls(name, arguments, junk, close):
    payload = json.dumps({"name": name, "arguments": arguments})
    t = junk + "<tool_call>" + payload + ("</tool_call>" if close else "") + junk
    a = parse_action(t)
    assert isinstance(a, InvalidAction) or a.name == name
