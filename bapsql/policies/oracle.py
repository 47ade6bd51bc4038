"""The workflow oracle: the ONLY door through which scripted policies see a task's reference SQL.

Programmatic workflows imitate an agent that writes the right SQL; they are not allowed to know the right *answer*.
This module draws that line in one place:

- `oracle_hint(task)` gives an `OracleHint`: the gold query text, the naive broad query (the obvious but possibly
  over-budget first draft; the gold query when the benchmark has none), the gold answer's *type* (scalar / list /
  ordered_list) and the tables the gold query reads. It never gives the gold answer's values.
- `policy_view(task)` is the task a policy's ``reset`` receives: question, evidence hint and identifiers only. The
  gold answer, gold SQL, naive SQL and generator tags are blanked, so nothing but the hint can leak them.

The answer values a workflow submits therefore always come from rows the environment executed and showed it.
When a task carries no typed gold answer (e.g. a real benchmark whose gold query failed), the answer type is
inferred from the gold query's shape: an outermost ORDER BY → ordered_list; a single aggregate projection without
GROUP BY → scalar; otherwise list.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import sqlglot
from sqlglot import exp

from bapsql.types import AnswerKind, Task


@dataclass(frozen=True)
class OracleHint:
    """What a scripted workflow may know about a task beyond its question (never the answer values)."""

    gold_sql: str
    naive_sql: str  # the obvious broad draft; equals gold_sql when the benchmark has no naive query
    answer_kind: AnswerKind
    tables: tuple[str, ...]  # tables the gold query reads, in first-mention order (for inspect_schema)
    has_naive: bool  # False when naive_sql is only the gold query repeated


def _parse(sql: str) -> exp.Expression | None:
    try:
        return sqlglot.parse_one(sql, read="sqlite")
    except (sqlglot.errors.ParseError, sqlglot.errors.TokenError, ValueError):
        return None


def infer_answer_kind(sql: str) -> AnswerKind:
    """The answer type a query's result implies, from its shape (used only when the task has no typed gold)."""
    tree = _parse(sql)
    if tree is None:
        return "list"
    if tree.args.get("order") is not None:
        return "ordered_list"
    if isinstance(tree, exp.Select) and not tree.args.get("group") and len(tree.expressions) == 1:
        if tree.expressions[0].find(exp.AggFunc) is not None:
            return "scalar"
    return "list"


def query_tables(sql: str) -> tuple[str, ...]:
    """Base tables a query reads (CTE names excluded), in first-mention order; empty when it does not parse."""
    tree = _parse(sql)
    if tree is None:
        return ()
    ctes = {c.alias_or_name for c in tree.find_all(exp.CTE)}
    out: list[str] = []
    nodes = sorted(tree.find_all(exp.Table), key=lambda t: t.this.meta.get("start", 0) if t.this else 0)
    for t in nodes:
        if t.name and t.name not in ctes and t.name not in out:
            out.append(t.name)
    return tuple(out)


def oracle_hint(task: Task) -> OracleHint:
    """The hint for `task`: gold SQL, naive SQL, answer type and tables — never the gold values."""
    kind: AnswerKind = task.gold.kind if task.gold is not None else infer_answer_kind(task.gold_sql)
    naive = task.naive_sql.strip()
    return OracleHint(
        gold_sql=task.gold_sql.strip(),
        naive_sql=naive or task.gold_sql.strip(),
        answer_kind=kind,
        tables=query_tables(task.gold_sql),
        has_naive=bool(naive) and naive != task.gold_sql.strip(),
    )


def policy_view(task: Task) -> Task:
    """The task as a policy sees it: gold answer, gold SQL, naive SQL and tags removed."""
    return dataclasses.replace(task, gold=None, gold_sql="", naive_sql="", tags=())


_SQL_WORDS = frozenset("""select from where group order having limit join inner outer left right on and or not null
as by distinct count sum avg min max between like in is case when then else end union all exists the what which who
how many much many does each every with for that this than have has are was were there their its into over per""".split())


def misnamed_column_sql(sql: str, question: str, rng) -> str | None:
    """``sql`` with one column reference renamed to a word of ``question`` that the query does not name (the
    slip a model makes when it writes the question's words instead of the schema's: ``doctor`` for ``doctor_id``),
    so that SQLite refuses it with "no such column"; None when the query does not parse, names no column, or the
    question offers no such word. ``rng``: a numpy Generator (the episode's: the same slip for the same seed)."""
    tree = _parse(sql)
    if tree is None:
        return None
    cols = [c for c in tree.find_all(exp.Column) if c.name]
    named = {i.name.lower() for i in tree.find_all(exp.Identifier) if i.name}
    words = sorted({w for w in (t.strip(".,?!;:'\"()").lower() for t in question.split())
                    if len(w) >= 4 and w.isalpha() and w not in _SQL_WORDS and w not in named})
    if not cols or not words:
        return None
    where = [c for c in cols if c.find_ancestor(exp.Where) is not None]
    target = (where or cols)[int(rng.integers(len(where or cols)))]
    target.set("this", exp.to_identifier(words[int(rng.integers(len(words)))]))
    return tree.sql(dialect="sqlite")

