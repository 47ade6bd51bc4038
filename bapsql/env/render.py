"""Every piece of text the policy sees is made here (DESIGN §3; the paper's policy-visible interface).

One function per observation kind, all pure (data in, text out). Observations are compact because they cost live
context tokens. Query results are always rendered with `bapsql.db.rows.render_table`, the same canonical text the
shield charges result tokens for. The episode appends `dashboard(...)` (remaining budget per channel) to every
observation when the interface shows it, and fits long observations to the context headroom by asking these
functions for fewer rows / lines (``max_rows`` / ``max_lines``), each cut announced with a note.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from bapsql.db.rows import render_table
from bapsql.env.actions import CLOSE_TAG, OPEN_TAG, TOOL_NAMES, Abstain, InspectSchema, render_action
from bapsql.env.evidence import EvidenceBlock, EvidenceOp

if TYPE_CHECKING:  # pragma: no cover
    from bapsql.db.catalog import Catalog, TableStats
    from bapsql.db.estimator import Estimate
    from bapsql.db.shield import ShieldResult
    from bapsql.env.ledger import Usage
    from bapsql.types import Task

_TOOL_LINES = {
    "inspect_schema": "inspect_schema(tables?: [str]) - columns, types, keys, row counts (all tables if omitted)",
    "estimate_query": "estimate_query(sql) - p50/p95 rows, result tokens, VM steps of a query; no query spent",
    "rewrite_query": "rewrite_query(sql, reason) - replace the candidate query and estimate it; no query spent",
    "execute_query": "execute_query(sql) - run one read-only SELECT; shown rows become evidence E<n>",
    "manage_evidence": "manage_evidence(op, ref) - op: archive | compress | discard | restore (restore re-charges "
                       "result tokens); ref like E1",
    "answer": "answer(kind, values, citations) - kind: scalar | list | ordered_list; values: array (a multi-column "
              "row is an array); citations: evidence ids. Ends the episode",
    "abstain": "abstain(reason) - give up when the budget cannot support an answer. Ends the episode",
}
_BUDGET_LINE = (
    "Budget: context is the live prompt (archive/compress free it); queries, result tokens and VM steps are "
    "cumulative and never refunded; every action costs a turn. Rows beyond the caps are cut."
)


_TERSE_LINES = {
    "inspect_schema": "inspect_schema(tables?)",
    "estimate_query": "estimate_query(sql)",
    "rewrite_query": "rewrite_query(sql, reason)",
    "execute_query": "execute_query(sql)",
    "manage_evidence": "manage_evidence(op, ref)",
    "answer": "answer(kind, values, citations)",
    "abstain": "abstain(reason)",
}


def system_prompt(tools: Sequence[str] = TOOL_NAMES, *, show_budget: bool = True, style: str = "full") -> str:
    """Instructions + the tool list (the system message; its tokens count toward live context).

    ``style="terse"`` (`EnvOptions.prompt_style`) keeps one line of instructions and one signature line per offered
    tool (about 60 tokens instead of about 350): for small models that must read the question and schema, not the
    manual."""
    if style == "terse":
        return "\n".join(["SQLite questions. One tool call per turn. Tools:",
                          *(_TERSE_LINES[t] for t in TOOL_NAMES if t in tools)])
    lines = [
        "You answer questions about a SQLite database by calling tools. Call exactly one tool per turn:",
        f'{OPEN_TAG}\n{{"name": "<tool>", "arguments": {{...}}}}\n{CLOSE_TAG}',
        "Tools:",
        *(f"- {_TOOL_LINES[t]}" for t in TOOL_NAMES if t in tools),
    ]
    if show_budget:
        lines.append(_BUDGET_LINE)
    lines.append("Answer only from rows you were shown, and cite them.")
    return "\n".join(lines)


def dashboard(remaining: "Usage", budget: "Usage") -> str:
    """One line: what remains of each channel (context: headroom for the next completion)."""
    r, b = remaining, budget
    return (
        f"[left] context {r.context_tokens}/{b.context_tokens} | queries {r.queries}/{b.queries} | "
        f"result tokens {r.result_tokens}/{b.result_tokens} | VM steps {r.vm_steps}/{b.vm_steps} | "
        f"turns {r.turns}/{b.turns}"
    )


def schema_summary(catalog: "Catalog", *, max_tables: int | None = None) -> str:
    """Compact schema: one line per table, ``name (N rows): col1, col2, ...``."""
    tables = catalog.tables if max_tables is None else catalog.tables[:max_tables]
    lines = [f"{t.name} ({t.rows} rows): " + ", ".join(c.name for c in t.columns) for t in tables]
    if max_tables is not None and len(catalog.tables) > max_tables:
        lines.append(f"[{len(catalog.tables) - max_tables} more tables cut to fit the context; use inspect_schema]")
    return "\n".join(lines)


def initial_observation(task: "Task", catalog: "Catalog", *, max_tables: int | None = None) -> str:
    """The first user message: question, the task's evidence hint (if any) and the schema summary."""
    parts = [f"Question: {task.question.strip()}"]
    if task.evidence.strip():
        parts.append(f"Hint: {task.evidence.strip()}")
    parts.append("Schema:\n" + schema_summary(catalog, max_tables=max_tables))
    return "\n".join(parts)


def _table_detail(t: "TableStats") -> str:
    cols = []
    for c in t.columns:
        bits = [c.name, c.type or "ANY"]
        if c.pk:
            bits.append("pk")
        if c.notnull and not c.pk:
            bits.append("not null")
        bits.append(f"{c.distinct} distinct")
        if c.nulls:
            bits.append(f"{c.nulls} null")
        cols.append(" ".join(bits))
    lines = [f"{t.name} ({t.rows} rows): " + "; ".join(cols)]
    for fk in t.foreign_keys:
        lines.append(f"  fk {', '.join(fk.columns)} -> {fk.ref_table}({', '.join(fk.ref_columns)})")
    for ix in t.indexes:
        lines.append(f"  index {ix.name}({', '.join(ix.columns)}){' unique' if ix.unique else ''}")
    return "\n".join(lines)


def schema_detail_lines(catalog: "Catalog", tables: Sequence[str] | None) -> tuple[list[str], list[str]]:
    """(lines of detail for the requested tables — all when None —, names that are not tables)."""
    if tables is None:
        chosen, unknown = list(catalog.tables), []
    else:
        chosen, unknown = [], []
        for name in dict.fromkeys(tables):
            t = catalog.table(name)
            (chosen.append(t) if t is not None else unknown.append(name))
    lines: list[str] = []
    for t in chosen:
        lines.extend(_table_detail(t).split("\n"))
    return lines, unknown


def schema_observation(lines: Sequence[str], unknown: Sequence[str], known: Sequence[str], *, total: int) -> str:
    """inspect_schema's observation; ``lines`` may be a prefix of all ``total`` lines (then a cut note is added)."""
    out = list(lines)
    if len(lines) < total:
        out.append(f"[{total - len(lines)} more schema lines cut to fit the context; inspect fewer tables]")
    if unknown:
        out.append(f"Unknown table(s): {', '.join(unknown)}. Tables: {', '.join(known)}")
    return "\n".join(out) if out else "No tables."


def _fmt(x: float) -> str:
    return str(int(round(x)))


def estimate_observation(label: str, est: "Estimate", warnings: Sequence[str]) -> str:
    """estimate_query / rewrite_query observation: p50/p95 per quantity, output columns, then WARNING lines."""
    if est.error:
        return f"{label}: the query cannot run: {est.error}"
    lines = [
        f"{label}: rows p50 {_fmt(est.rows.p50)} p95 {_fmt(est.rows.p95)} | result tokens p50 "
        f"{_fmt(est.result_tokens.p50)} p95 {_fmt(est.result_tokens.p95)} | VM steps p50 {_fmt(est.vm_steps.p50)} "
        f"p95 {_fmt(est.vm_steps.p95)}",
        f"columns: {', '.join(est.columns)}",
    ]
    lines += [f"WARNING: {w}" for w in warnings]
    return "\n".join(lines)


def block_body(block: EvidenceBlock, *, max_rows: int | None = None) -> str:
    """The text of an evidence block in its current state (visible rows, archive stub, profile, discarded stub)."""
    shape = f"{len(block.rows)} rows x {len(block.columns)} columns"
    if block.state == "archived":
        return f"[{block.ref} archived: {shape}; restore to see the rows]"
    if block.state == "discarded":
        return f"[{block.ref} discarded]"
    if block.state == "compressed":
        return f"[{block.ref} compressed profile] " + block.profile.render()
    rows = block.rows if max_rows is None else block.rows[:max_rows]
    text = render_table(block.columns, rows)
    note = _truncation_note(block, len(rows))
    return text + (f"\n{note}" if note else "")


def _truncation_note(block: EvidenceBlock, shown: int) -> str:
    if block.truncated_by == "vm_steps":
        return f"[stopped by the VM-step cap: {shown} rows shown, the result is incomplete]"
    if block.truncated:
        total = f" of {block.rows_total}" if block.rows_total is not None else ""
        return f"[truncated by the {block.truncated_by} cap: {shown}{total} rows shown]"
    if shown < len(block.rows):
        return f"[{len(block.rows) - shown} more rows cut to fit the context]"
    return ""


def execution_header(block: EvidenceBlock) -> str:
    """First line of an execution observation: the evidence id, shape and status (a post-hoc profile: the whole
    result's row count)."""
    if block.state == "compressed" and block.profile.whole_result and block.profile.rows_total is not None:
        return f"{block.ref} (profiled): {block.profile.rows_total} rows x {len(block.columns)} columns"
    return f"{block.ref} ({block.status}): {len(block.rows)} rows x {len(block.columns)} columns"


_PREFLIGHT_WORDS = {
    "preflight_vm_steps": "it would almost surely exceed the database work (VM steps) left in the budget",
    "no_vm_steps": "no database work (VM steps) is left in the budget",
    "estimate_error": "it cannot run as written (a binding or syntax problem)",
}


def preflight_words(rejection: str | None) -> str | None:
    """Why a preflight rejected a query, in words only (no estimate, no figure); None for other rejections."""
    return _PREFLIGHT_WORDS.get(rejection) if rejection is not None else None


def shield_observation(res: "ShieldResult", *, numbers: bool = True) -> str:
    """execute_query outcomes that produce no evidence block: rejected or SQL error. ``numbers`` False (conditions
    without estimates): a preflight rejection says why in words only — no estimate, no figure at all."""
    if res.status == "rejected" and not numbers and res.rejection in _PREFLIGHT_WORDS:
        return (f"execute_query rejected before running: {preflight_words(res.rejection)}. The query did not run; "
                "no query was charged. Narrow it (filters, aggregation, LIMIT) or answer from what you have.")
    if res.status == "rejected":
        return f"execute_query rejected ({res.rejection}): {res.message} The query did not run; no query was charged."
    if res.status == "error":
        return f"SQL error: {res.message}"
    return f"execute_query {res.status}: {res.message}"


def busy_observation(action: str, message: str) -> str:
    """A database action met another program's write lock for the whole bounded wait (`bapsql.env.live`)."""
    return f"{action} rejected (busy): {message} Nothing ran; no query was charged."


def no_query_left() -> str:
    return "execute_query rejected: no queries left. Answer from the evidence you have, or abstain."


NO_RESULT_ROOM = "no result room left"
NO_CONTEXT_ROOM = "no context room left"


def no_room(channel: str) -> str:
    """A refusal's reason in words, without ledger figures (the dashboard is hidden: ``raw``): ``channel`` is
    ``result_tokens`` or ``context``."""
    return NO_RESULT_ROOM if channel == "result_tokens" else NO_CONTEXT_ROOM


def shield_message_words(res: "ShieldResult") -> str:
    """An executed result's shield message without the cap figures it quotes (which are the ledger's remaining
    result tokens and VM steps), for a hidden dashboard."""
    parts = []
    if res.truncated_by not in (None, "vm_steps"):
        parts.append(f"output truncated to {len(res.rows)} rows by the {res.truncated_by.replace('_', ' ')} cap")
    if res.truncated_by == "vm_steps":
        parts.append("stopped by the VM-step cap before the query finished; the result is incomplete")
    elif res.truncated_by is not None and res.rows_total is not None:
        parts.append(f"the query produced {res.rows_total} rows in all")
    return "; ".join(parts)


def no_result_room(why: str) -> str:
    return (f"execute_query rejected (no_result_tokens): {why}. The query did not run; no query was charged. "
            "Free context with manage_evidence, or answer.")


def no_vm_steps_left(action: str) -> str:
    return f"{action} rejected: no VM steps left. Answer from the evidence you have, or abstain."


def evidence_observation(res: EvidenceOp, block: EvidenceBlock | None, *, charged: int = 0,
                         show_budget: bool = True) -> str:
    """manage_evidence's observation (``show_budget`` False, the dashboard hidden: no ledger figure)."""
    if not res.ok:
        return f"manage_evidence refused: {res.message}"
    if res.op == "restore":
        cost = f"{charged} result tokens charged" if show_budget else "its result tokens charged again"
        return f"{res.ref} restored in place ({len(block.rows) if block else 0} rows; {cost})"
    return f"{res.ref} {res.after}"


def invalid_observation(reason: str, tools: Sequence[str] = TOOL_NAMES) -> str:
    """The explanation of an invalid action, with the expected format shown as a concrete, valid call.

    The example is a real call (``inspect_schema`` when offered, else ``abstain``), never a placeholder: SmolLM2 copied
    a ``{"name": "<tool>", "arguments": {...}}`` template back verbatim, turn after turn, until it ran out of turns."""
    example = render_action(InspectSchema() if "inspect_schema" in tools else Abstain("..."))
    return f"Invalid action: {reason}\nReply with exactly one call, for example: {example}\nTools: {', '.join(tools)}"


def final_observation(kind: str, detail: str) -> str:
    """The last observation (after answer / abstain, or when the episode is truncated)."""
    return f"Episode over ({kind}). {detail}".strip()
