"""The seven typed actions, their tool schemas, and parsing / rendering of tool-call text (DESIGN §3 "Actions").

A policy emits one tool call per turn in the Qwen/Hermes format::

    <tool_call>
    {"name": "execute_query", "arguments": {"sql": "SELECT count(*) FROM t"}}
    </tool_call>

`parse_action(text)` turns model text into one of the seven action dataclasses, or an `InvalidAction` whose
``reason`` says exactly what to fix. It never raises. Tolerated: text before the call (e.g. reasoning), text after
it, a missing closing tag (engines often stop *on* ``</tool_call>`` and drop it), a ```json fence inside the tags,
and ``arguments`` given as a JSON-encoded string. Not tolerated (→ InvalidAction): no call, two or more calls,
invalid JSON (NaN/Infinity included), an unknown tool, a missing, unexpected or ill-typed argument.

`render_action(action)` is the canonical call text (what scripted policies emit); ``parse_action(render_action(a))
== a`` for every valid action. `TOOL_SCHEMAS` are OpenAI-style function schemas (``{"type": "function",
"function": {name, description, parameters}}``) for chat templates.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Union

from bapsql.env.evidence import EVIDENCE_OPS, normalize_ref
from bapsql.types import ANSWER_KINDS, Answer

OPEN_TAG = "<tool_call>"
CLOSE_TAG = "</tool_call>"


@dataclass(frozen=True)
class InspectSchema:
    """Show columns, types, keys and row counts of the given tables (all tables when ``tables`` is None)."""

    tables: tuple[str, ...] | None = None
    name = "inspect_schema"


@dataclass(frozen=True)
class EstimateQuery:
    """Estimate p50/p95 rows, result tokens and VM steps of a query without running it (costs VM steps, no query)."""

    sql: str
    name = "estimate_query"


@dataclass(frozen=True)
class RewriteQuery:
    """Replace the candidate query by ``sql`` (e.g. aggregate, filter, LIMIT); the env estimates the new candidate."""

    sql: str
    reason: str
    name = "rewrite_query"


@dataclass(frozen=True)
class ExecuteQuery:
    """Run a query under the runtime shield; the result becomes an evidence block."""

    sql: str
    name = "execute_query"


@dataclass(frozen=True)
class ManageEvidence:
    """Archive, compress, discard or restore an evidence block (``ref`` like ``"E1"``)."""

    op: str
    ref: str
    name = "manage_evidence"


@dataclass(frozen=True)
class AnswerAction:
    """Final typed answer with cited evidence ids; ends the episode."""

    kind: str
    values: tuple
    citations: tuple[str, ...] = ()
    name = "answer"

    def to_answer(self) -> Answer:
        """The typed `bapsql.types.Answer` (the parser has already validated kind and arity)."""
        return Answer(self.kind, self.values)


@dataclass(frozen=True)
class Abstain:
    """Decline to answer (with a justification); ends the episode."""

    reason: str
    name = "abstain"


@dataclass(frozen=True)
class InvalidAction:
    """Model output that is not exactly one well-formed tool call. ``reason`` tells the policy what to fix."""

    raw: str
    reason: str
    name = "invalid"


Action = Union[InspectSchema, EstimateQuery, RewriteQuery, ExecuteQuery, ManageEvidence, AnswerAction, Abstain]
ParsedAction = Union[Action, InvalidAction]
TOOL_NAMES: tuple[str, ...] = (
    "inspect_schema", "estimate_query", "rewrite_query", "execute_query", "manage_evidence", "answer", "abstain",
)

_CELL_SCHEMA = {"type": ["string", "number", "integer", "boolean", "null"]}


def _fn(name: str, description: str, properties: dict, required: list[str]) -> dict:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }


_SQL = {"type": "string", "description": "one read-only SQLite SELECT/WITH statement"}
TOOL_SCHEMAS: tuple[dict, ...] = (
    _fn("inspect_schema", "Show columns, types, keys and row counts of tables (all tables when 'tables' is omitted).",
        {"tables": {"type": "array", "items": {"type": "string"}, "description": "table names"}}, []),
    _fn("estimate_query", "Estimate p50/p95 rows, result tokens and VM steps of a query without running it. "
        "Costs VM steps, not a query.", {"sql": _SQL}, ["sql"]),
    _fn("rewrite_query", "Replace the candidate query (e.g. aggregate, filter or LIMIT it) and estimate the new one. "
        "Costs VM steps, not a query.", {"sql": _SQL, "reason": {"type": "string"}}, ["sql", "reason"]),
    _fn("execute_query", "Run a query under the budget shield; its shown rows become an evidence block E<n>.",
        {"sql": _SQL}, ["sql"]),
    _fn("manage_evidence", "archive (stub), compress (profile), discard (gone) or restore (rows back; charges result "
        "tokens again) an evidence block.",
        {"op": {"type": "string", "enum": list(EVIDENCE_OPS)}, "ref": {"type": "string", "description": "e.g. E1"}},
        ["op", "ref"]),
    _fn("answer", "Give the final answer and cite the evidence blocks that show it. Ends the episode.",
        {"kind": {"type": "string", "enum": list(ANSWER_KINDS)},
         "values": {"type": "array", "description": "one value for scalar; a row of several columns is an array",
                    "items": {"anyOf": [_CELL_SCHEMA, {"type": "array", "items": _CELL_SCHEMA}]}},
         "citations": {"type": "array", "items": {"type": "string"}, "description": "evidence ids, e.g. [\"E1\"]"}},
        ["kind", "values"]),
    _fn("abstain", "Decline to answer when the budget cannot support a justified answer. Ends the episode.",
        {"reason": {"type": "string"}}, ["reason"]),
)

_FENCE_OPEN = re.compile(r"```(?:json)?\s*", re.IGNORECASE)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed (numbers must be finite)")


_DECODER = json.JSONDecoder(parse_constant=_reject_constant)


class _Bad(Exception):
    """Internal: a precise reason the call is invalid."""


def _skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i].isspace():
        i += 1
    return i


def _extract_calls(text: str) -> list[Any]:
    """Decode the JSON payload of every ``<tool_call>`` in ``text`` (decoding skips over tags quoted in strings)."""
    calls: list[Any] = []
    pos = 0
    while True:
        start = text.find(OPEN_TAG, pos)
        if start < 0:
            return calls
        i = _skip_ws(text, start + len(OPEN_TAG))
        fence = _FENCE_OPEN.match(text, i)
        if fence:
            i = fence.end()
        if i >= len(text):
            raise _Bad("the tool call is empty; put a JSON object {\"name\": ..., \"arguments\": {...}} inside it")
        try:
            obj, end = _DECODER.raw_decode(text, i)
        except ValueError as exc:
            raise _Bad(f"the tool call is not valid JSON ({exc}); write one JSON object "
                       f"{{\"name\": ..., \"arguments\": {{...}}}} between {OPEN_TAG} and {CLOSE_TAG}") from None
        calls.append(obj)
        j = _skip_ws(text, end)
        if text.startswith("```", j):
            j = _skip_ws(text, j + 3)
        if text.startswith(CLOSE_TAG, j):
            j += len(CLOSE_TAG)
        elif j < len(text) and not text.startswith(OPEN_TAG, j):
            raise _Bad(f"unexpected text after the JSON object inside the tool call; close it with {CLOSE_TAG}")
        pos = j


def _str_arg(args: dict, key: str, tool: str, *, nonempty: bool = True) -> str:
    if key not in args:
        raise _Bad(f"{tool}: missing argument '{key}' (a string)")
    v = args[key]
    if not isinstance(v, str):
        raise _Bad(f"{tool}: argument '{key}' must be a string, got {type(v).__name__}")
    if nonempty and not v.strip():
        raise _Bad(f"{tool}: argument '{key}' is empty")
    return v


def _cell(v: Any, where: str) -> Any:
    if v is None or isinstance(v, (str, int, float)):
        return v
    raise _Bad(f"answer: {where} must be a string, number or null, got {type(v).__name__}")


def _answer(args: dict) -> AnswerAction:
    kind = args.get("kind")
    if "kind" not in args:
        raise _Bad("answer: missing argument 'kind' (one of scalar, list, ordered_list)")
    if kind not in ANSWER_KINDS:
        raise _Bad(f"answer: 'kind' must be one of {list(ANSWER_KINDS)}, got {kind!r}")
    if "values" not in args:
        raise _Bad("answer: missing argument 'values' (an array; one element for a scalar)")
    raw = args["values"]
    if kind == "scalar" and not isinstance(raw, list):
        raw = [raw]
    if not isinstance(raw, list):
        raise _Bad(f"answer: 'values' must be an array, got {type(raw).__name__}")
    values = []
    for i, v in enumerate(raw):
        if isinstance(v, list):
            if not v:
                raise _Bad(f"answer: values[{i}] is an empty row")
            values.append(tuple(_cell(c, f"values[{i}][{k}]") for k, c in enumerate(v)))
        else:
            values.append(_cell(v, f"values[{i}]"))
    if kind == "scalar" and len(values) != 1:
        raise _Bad(f"answer: a scalar answer has exactly one value, got {len(values)}; use kind 'list' for several")
    cites = args.get("citations", [])
    if cites is None:
        cites = []
    if not isinstance(cites, list) or not all(isinstance(c, str) for c in cites):
        raise _Bad("answer: 'citations' must be an array of evidence ids such as [\"E1\"]")
    refs = []
    for c in cites:
        r = normalize_ref(c)
        if r is None:
            raise _Bad(f"answer: citation {c!r} is not an evidence id like 'E1'")
        refs.append(r)
    return AnswerAction(kind, tuple(values), tuple(refs))


_ALLOWED_ARGS = {
    "inspect_schema": {"tables"}, "estimate_query": {"sql"}, "rewrite_query": {"sql", "reason"},
    "execute_query": {"sql"}, "manage_evidence": {"op", "ref"}, "answer": {"kind", "values", "citations"},
    "abstain": {"reason"},
}


def _build(name: str, args: dict) -> Action:
    extra = sorted(set(args) - _ALLOWED_ARGS[name])
    if extra:
        raise _Bad(f"{name}: unexpected argument(s) {extra}; allowed: {sorted(_ALLOWED_ARGS[name])}")
    if name == "inspect_schema":
        tables = args.get("tables")
        if tables is None:
            return InspectSchema(None)
        if isinstance(tables, str):
            tables = [tables]
        if not isinstance(tables, list) or not all(isinstance(t, str) and t.strip() for t in tables):
            raise _Bad("inspect_schema: 'tables' must be an array of table names (or omitted for all tables)")
        return InspectSchema(tuple(tables) if tables else None)
    if name == "estimate_query":
        return EstimateQuery(_str_arg(args, "sql", name))
    if name == "rewrite_query":
        return RewriteQuery(_str_arg(args, "sql", name), _str_arg(args, "reason", name, nonempty=False))
    if name == "execute_query":
        return ExecuteQuery(_str_arg(args, "sql", name))
    if name == "manage_evidence":
        op = _str_arg(args, "op", name)
        if op not in EVIDENCE_OPS:
            raise _Bad(f"manage_evidence: 'op' must be one of {list(EVIDENCE_OPS)}, got {op!r}")
        ref = normalize_ref(_str_arg(args, "ref", name))
        if ref is None:
            raise _Bad(f"manage_evidence: 'ref' must be an evidence id like 'E1', got {args['ref']!r}")
        return ManageEvidence(op, ref)
    if name == "answer":
        return _answer(args)
    return Abstain(_str_arg(args, "reason", name, nonempty=False))


def parse_action(text: str) -> ParsedAction:
    """Parse one completion into an action; any problem yields `InvalidAction` with a precise reason."""
    if not isinstance(text, str):
        return InvalidAction(repr(text), "the completion is not text")
    try:
        calls = _extract_calls(text)
        if not calls:
            raise _Bad(f"no tool call found (a call is one JSON object between {OPEN_TAG} and {CLOSE_TAG})")
        if len(calls) > 1:
            raise _Bad(f"found {len(calls)} tool calls; emit exactly one per turn")
        call = calls[0]
        if not isinstance(call, dict):
            raise _Bad(f"the tool call must be a JSON object with 'name' and 'arguments', got {type(call).__name__}")
        extra = sorted(set(call) - {"name", "arguments"})
        if extra:
            raise _Bad(f"unexpected key(s) {extra} in the tool call; use only 'name' and 'arguments'")
        name = call.get("name")
        if not isinstance(name, str):
            raise _Bad("the tool call needs a string 'name'")
        if name not in TOOL_NAMES:
            raise _Bad(f"unknown tool {name!r}; tools are {list(TOOL_NAMES)}")
        args = call.get("arguments", {})
        if isinstance(args, str):
            try:
                args = _DECODER.decode(args) if args.strip() else {}
            except ValueError as exc:
                raise _Bad(f"{name}: 'arguments' is a string that is not valid JSON ({exc})") from None
        if args is None:
            args = {}
        if not isinstance(args, dict):
            raise _Bad(f"{name}: 'arguments' must be a JSON object, got {type(args).__name__}")
        return _build(name, args)
    except _Bad as exc:
        return InvalidAction(text, str(exc))
    except RecursionError:
        return InvalidAction(text, "the tool call JSON is nested too deeply")


def action_arguments(action: Action) -> dict:
    """The canonical ``arguments`` object of an action (what `render_action` serializes)."""
    if isinstance(action, InspectSchema):
        return {} if action.tables is None else {"tables": list(action.tables)}
    if isinstance(action, (EstimateQuery, ExecuteQuery)):
        return {"sql": action.sql}
    if isinstance(action, RewriteQuery):
        return {"sql": action.sql, "reason": action.reason}
    if isinstance(action, ManageEvidence):
        return {"op": action.op, "ref": action.ref}
    if isinstance(action, AnswerAction):
        vals = [list(v) if isinstance(v, tuple) else v for v in action.values]
        return {"kind": action.kind, "values": vals, "citations": list(action.citations)}
    if isinstance(action, Abstain):
        return {"reason": action.reason}
    raise TypeError(f"not an action: {action!r}")


def render_action(action: ParsedAction) -> str:
    """The canonical tool-call text of an action (an `InvalidAction` renders as its raw text)."""
    if isinstance(action, InvalidAction):
        return action.raw
    payload = json.dumps({"name": action.name, "arguments": action_arguments(action)}, ensure_ascii=False)
    return f"{OPEN_TAG}\n{payload}\n{CLOSE_TAG}"


def action_from_json(obj: Any) -> ParsedAction:
    """Build an action from a decoded ``{"name": ..., "arguments": {...}}`` object (as in an actions file)."""
    try:
        text = f"{OPEN_TAG}\n{json.dumps(obj, ensure_ascii=False)}\n{CLOSE_TAG}"
    except (TypeError, ValueError) as exc:
        return InvalidAction(repr(obj), f"not JSON-serializable: {exc}")
    return parse_action(text)
