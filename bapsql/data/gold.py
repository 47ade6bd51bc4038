"""Typed gold answers: execute a gold query once (read-only, through the sandbox), type its result, flag it.

Contract:
- `answer_from_rows`: a 1×1 result is a ``scalar``; a result whose query's OUTERMOST ORDER BY makes order part of
  the answer is an ``ordered_list``; anything else is a ``list`` (a multiset). Single-column rows become plain
  values, multi-column rows tuples. Blobs become their `cell_text` (answers are never binary).
- `derive_gold` flags results that are no sensible answer (``too_large``: > `MAX_ANSWER_ROWS` rows or
  > `MAX_ANSWER_TOKENS` result tokens; ``empty``) and non-deterministic ones (``ties_at_limit``: ORDER BY … LIMIT
  with a tie across the cut; ``order_ties``: an ordered answer whose order the keys leave open; ``limit_without_order``;
  ``random``; ``clock``). Ties are found by re-running the query with LIMIT n+1 (and the ORDER BY keys appended as
  output columns when they are not among them).
- Results are cached on disk by `bapsql.data.cache.GoldCache` (file fingerprint + SQL hash), so a benchmark's gold
  SQL runs once per machine. A failing query yields ``error`` (and no answer), never an exception.
- `official_ex`: BIRD's own unbudgeted EX, set equality of result rows exactly as BIRD's evaluation script computes it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

import sqlglot
from sqlglot import expressions as exp

from bapsql.tokens import TokenCounter
from bapsql.types import Answer, AnswerKind

MAX_ANSWER_ROWS = 100
MAX_ANSWER_TOKENS = 2_000
GOLD_VM_STEP_CAP = 200_000_000  # generous: gold SQL is trusted, but a runaway query must still stop
GOLD_ROW_CAP = 10_000  # rows kept from a gold result (larger results are flagged too_large anyway)

_RANDOM = re.compile(r"\brandom(blob)?\s*\(", re.IGNORECASE)
_CLOCK = re.compile(r"'now'|\bcurrent_(date|time|timestamp)\b", re.IGNORECASE)


@dataclass(frozen=True)
class GoldFlag:
    """Why a gold result is no sensible or no deterministic answer. ``code`` is machine-readable."""

    code: str
    reason: str


@dataclass(frozen=True)
class GoldResult:
    """The executed gold query: its typed answer (None when it failed), costs and flags."""

    answer: Answer | None
    columns: tuple[str, ...]
    rows: tuple[tuple, ...]  # at most GOLD_ROW_CAP rows
    rows_total: int
    vm_steps: int
    result_tokens: int
    flags: tuple[GoldFlag, ...] = ()
    error: str | None = None
    interrupted: bool = False  # the VM-step cap stopped the query (error is set)

    @property
    def ok(self) -> bool:
        return self.error is None


_ORDER_OR_LIMIT = re.compile(r"\b(order|limit)\b", re.IGNORECASE)


def _parse(sql: str) -> exp.Expression | None:
    if not _ORDER_OR_LIMIT.search(sql):
        return None  # nothing for the order analysis to find (saves a sqlglot parse)
    try:
        tree = sqlglot.parse_one(sql, read="sqlite")
    except Exception:  # sqlglot raises several error types; an unparseable query just gets no order analysis
        return None
    return tree if isinstance(tree, (exp.Select, exp.SetOperation)) else None


def outer_order_keys(sql: str) -> tuple[str, ...]:
    """The SQL of the outermost ORDER BY keys ('' tuple when the outermost statement has none)."""
    tree = _parse(sql)
    order = tree.args.get("order") if tree is not None else None
    return tuple(o.this.sql(dialect="sqlite") for o in order.expressions) if order else ()


def order_matters(sql: str) -> bool:
    """True when the outermost ORDER BY makes row order part of the answer (ORDER BY in subqueries does not)."""
    return bool(outer_order_keys(sql))


def clean_cell(value):
    """An answer cell: blobs as their rendered text, everything else unchanged."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        from bapsql.db.rows import cell_text

        return cell_text(bytes(value))
    return value


def answer_from_rows(sql: str, columns: Sequence[str], rows: Sequence[Sequence]) -> Answer:
    """Type a gold result: scalar (1×1), ordered_list (outermost ORDER BY) or list."""
    clean = [tuple(clean_cell(v) for v in r) for r in rows]
    if len(clean) == 1 and len(columns) == 1:
        return Answer("scalar", (clean[0][0],))
    kind: AnswerKind = "ordered_list" if order_matters(sql) else "list"
    if len(columns) == 1:
        return Answer(kind, tuple(r[0] for r in clean))
    return Answer(kind, tuple(clean))


# ----------------------------------------------------------------------------------------------------------------------
# non-determinism probes


def _limit_value(tree: exp.Expression) -> int | None:
    lim = tree.args.get("limit")
    if lim is None:
        return None
    node = lim.expression if isinstance(lim, exp.Limit) else lim
    try:
        return int(node.this) if isinstance(node, exp.Literal) and node.is_int else None
    except (TypeError, ValueError):
        return None


def _key_positions(tree: exp.Expression) -> list[int] | None:
    """Index of each ORDER BY key among the output columns, or None when some key is not an output column."""
    order = tree.args.get("order")
    if isinstance(tree, exp.SetOperation):
        first = tree
        while isinstance(first, exp.SetOperation):
            first = first.this
        projections = first.expressions if isinstance(first, exp.Select) else []
    else:
        projections = tree.expressions
    names = [p.alias_or_name.lower() for p in projections]
    bodies = [(p.this if isinstance(p, exp.Alias) else p).sql(dialect="sqlite").lower() for p in projections]
    out = []
    for o in order.expressions:
        key = o.this
        if isinstance(key, exp.Literal) and key.is_int and 1 <= int(key.this) <= len(projections):
            out.append(int(key.this) - 1)
            continue
        text = key.sql(dialect="sqlite").lower()
        if text in bodies:
            out.append(bodies.index(text))
        elif isinstance(key, exp.Column) and not key.table and key.name.lower() in names:
            out.append(names.index(key.name.lower()))
        else:
            return None
    return out


def _probe_sql(tree: exp.Expression, limit: int | None) -> tuple[str, list[int], int | None] | None:
    """SQL returning the rows (LIMIT n+1 when limited) and, where the ORDER BY keys are not output columns, the keys
    appended as extra columns. Returns (sql, key positions, original width or None when not extended); None when the
    keys cannot be recovered (a DISTINCT or ``*`` projection whose keys are not output columns)."""
    ext = tree.copy()
    positions = _key_positions(tree)
    width = None
    if positions is None:
        if not isinstance(tree, exp.Select) or tree.args.get("distinct") or any(
            isinstance(p, exp.Star) or (isinstance(p, exp.Column) and isinstance(p.this, exp.Star))
            for p in tree.expressions
        ):
            return None
        width = len(tree.expressions)
        keys = [o.this.copy() for o in tree.args["order"].expressions]
        ext.set("expressions", list(ext.expressions) + [k.as_(f"__order_key_{i}") for i, k in enumerate(keys)])
        positions = list(range(width, width + len(keys)))
    if limit is not None:
        ext.set("limit", exp.Limit(expression=exp.Literal.number(limit + 1)))
    return ext.sql(dialect="sqlite"), positions, width


def nondeterminism_flags(sql: str, rows: Sequence[Sequence], run) -> tuple[GoldFlag, ...]:
    """Flags for results the SQL does not determine. ``run(sql) -> list of rows`` executes a probe read-only."""
    flags = []
    if _RANDOM.search(sql):
        flags.append(GoldFlag("random", "the query calls random(), so its result changes between runs"))
    if _CLOCK.search(sql):
        flags.append(GoldFlag("clock", "the query reads the current date or time"))
    tree = _parse(sql)
    if tree is None:
        return tuple(flags)
    limit = _limit_value(tree)
    has_order = bool(tree.args.get("order"))
    if limit is not None and not has_order and len(rows) == limit:
        ext = tree.copy()
        ext.set("limit", exp.Limit(expression=exp.Literal.number(limit + 1)))
        try:
            if len(run(ext.sql(dialect="sqlite"))) > limit:
                flags.append(GoldFlag("limit_without_order",
                                      f"LIMIT {limit} without ORDER BY picks an unspecified subset of the rows"))
        except Exception:
            pass
        return tuple(flags)
    if not has_order or (len(rows) < 2 and limit is None):
        return tuple(flags)
    probe = _probe_sql(tree, limit)
    if probe is None:
        return tuple(flags)
    probe_sql, positions, width = probe
    try:
        probe_rows = rows if (limit is None and width is None) else run(probe_sql)
    except Exception:
        return tuple(flags)

    def key(r):
        return tuple(r[i] for i in positions)

    cut = len(probe_rows) if limit is None else min(limit, len(probe_rows))
    if limit and len(probe_rows) > limit and key(probe_rows[limit - 1]) == key(probe_rows[limit]):
        flags.append(GoldFlag("ties_at_limit", f"rows {limit} and {limit + 1} tie on the ORDER BY keys, so LIMIT "
                                               f"{limit} cuts through a tie and the answer is not determined"))
    visible = [tuple(r[:width]) if width is not None else tuple(r) for r in probe_rows[:cut]]
    for i in range(cut - 1):
        if key(probe_rows[i]) == key(probe_rows[i + 1]) and visible[i] != visible[i + 1]:
            flags.append(GoldFlag("order_ties", "rows tie on every ORDER BY key, so their order in the answer is not "
                                                "determined"))
            break
    return tuple(flags)


# ----------------------------------------------------------------------------------------------------------------------
# execution


def derive_gold(sandbox, sql: str, *, token_counter: TokenCounter, vm_step_cap: int = GOLD_VM_STEP_CAP,
                cache=None) -> GoldResult:
    """Execute ``sql`` read-only on ``sandbox`` (a `bapsql.db.sandbox.Sandbox`) and type the result.

    ``cache`` is an optional `bapsql.data.cache.GoldCache`; hits skip execution entirely. Never raises for bad SQL.
    """
    key = None
    if cache is not None:
        key = cache.key(sql, token_counter=token_counter.name, vm_step_cap=vm_step_cap)
        hit = cache.get(sandbox.path, key)
        if hit is not None:
            return _from_json(hit)
    result = _execute(sandbox, sql, token_counter, vm_step_cap)
    if cache is not None:
        cache.put(sandbox.path, key, _to_json(result))
    return result


def _execute(sandbox, sql: str, token_counter: TokenCounter, vm_step_cap: int) -> GoldResult:
    from bapsql.db.rows import result_tokens
    from bapsql.errors import BapsqlError

    try:
        res = sandbox.query(sql, vm_step_cap=vm_step_cap, max_rows=GOLD_ROW_CAP)
    except BapsqlError as exc:
        return GoldResult(None, (), (), 0, 0, 0, error=f"{type(exc).__name__}: {exc}")
    if res.interrupted:
        return GoldResult(None, tuple(res.columns), (), res.rows_total, res.vm_steps, 0,
                          error=f"gold query exceeded the VM-step cap of {vm_step_cap:,}", interrupted=True)
    rows = tuple(tuple(clean_cell(v) for v in r) for r in res.rows)
    tokens = result_tokens(res.columns, rows, token_counter)
    flags = []
    if res.rows_total == 0:
        flags.append(GoldFlag("empty", "the gold query returns no rows"))
    if res.rows_total > MAX_ANSWER_ROWS:
        flags.append(GoldFlag("too_large", f"{res.rows_total:,} rows is more than the {MAX_ANSWER_ROWS} an answer "
                                           "may hold"))
    elif tokens > MAX_ANSWER_TOKENS:
        flags.append(GoldFlag("too_large", f"{tokens:,} result tokens is more than the {MAX_ANSWER_TOKENS:,} an "
                                           "answer may cost"))

    def run(probe: str) -> list:
        out = sandbox.query(probe, vm_step_cap=vm_step_cap, max_rows=GOLD_ROW_CAP)
        if out.interrupted:
            raise RuntimeError("probe interrupted")
        return list(out.rows)

    flags.extend(nondeterminism_flags(sql, rows, run))
    answer = answer_from_rows(sql, res.columns, rows)
    return GoldResult(answer, tuple(res.columns), rows, res.rows_total, res.vm_steps, tokens, tuple(flags))


def _to_json(r: GoldResult) -> dict:
    return {
        "answer": r.answer.to_json() if r.answer is not None else None,
        "columns": list(r.columns),
        "rows": [list(row) for row in r.rows],
        "rows_total": r.rows_total,
        "vm_steps": r.vm_steps,
        "result_tokens": r.result_tokens,
        "flags": [[f.code, f.reason] for f in r.flags],
        "error": r.error,
        "interrupted": r.interrupted,
    }


def _from_json(obj: dict) -> GoldResult:
    return GoldResult(
        answer=Answer.from_json(obj["answer"]) if obj["answer"] is not None else None,
        columns=tuple(obj["columns"]),
        rows=tuple(tuple(r) for r in obj["rows"]),
        rows_total=obj["rows_total"],
        vm_steps=obj["vm_steps"],
        result_tokens=obj["result_tokens"],
        flags=tuple(GoldFlag(c, why) for c, why in obj["flags"]),
        error=obj["error"],
        interrupted=obj["interrupted"],
    )
