"""``scripted.drafter``: the budget-blind stand-in for a model that drafts a broad query first (DESIGN §4).

It knows the right SQL as well as the workflows do (the oracle's gold query) and the obvious broad draft (the
benchmark's naive query: the generator's on the embedded benchmark, `bapsql.data.naive` derived from the gold SQL on
BIRD/Spider). It plans nothing on its own; what differs between conditions is only what the environment offers and
shows it, so the same script is run under every condition:

1. with probability ``p_direct`` (the episode's seeded coin) it drafts the aggregate, otherwise the broad draft;
2. if the condition offers ``estimate_query`` it estimates the broad draft, and on a WARNING rewrites it to the
   aggregate when ``rewrite_query`` is offered (under ``rewrite: rule`` the environment substitutes its own rewrite);
3. it executes the draft and reads what it was shown: a complete result, or a post-hoc profile of the whole
   result, from which `answer_from_profile` reads the aggregate the question asks for (row count, min, max, mean,
   most frequent value) — a cut listing answers nothing;
4. when that answered nothing and the dashboard does not show the queries exhausted (or is hidden), it executes the
   aggregate and answers from it;
5. otherwise it abstains (or, where abstention is not offered, answers from the best rows it saw).
"""

from __future__ import annotations

import dataclasses

from typing import Any

import sqlglot
from sqlglot import exp

from bapsql.env.actions import AnswerAction
from bapsql.env.posthoc import ResultProfiler
from bapsql.policies.base import Context, ResultSeen, Script, ScriptedPolicy, answer_from_result, shown_value
from bapsql.policies.workflows import estimate, execute, give_up, rem, rewrite, warning_reason


def _aggregate(gold_sql: str) -> tuple[str, str | None, int | None] | None:
    """The question's aggregate as (kind, column, decimals): kind in count / max / min / avg / mode; None when the
    gold query is not one aggregate a profile can show."""
    try:
        tree = sqlglot.parse_one(gold_sql, read="sqlite")
    except sqlglot.errors.ParseError:
        return None
    if not isinstance(tree, exp.Select) or len(tree.expressions) != 1:
        return None
    node = tree.expressions[0].unalias()
    decimals = None
    if isinstance(node, exp.Round):
        d = node.args.get("decimals")
        decimals = int(d.name) if isinstance(d, exp.Literal) and d.is_int else 0
        node = node.this
    group = tree.args.get("group")
    if group is not None:  # argmax of a count: SELECT x ... GROUP BY x ORDER BY COUNT(*) DESC LIMIT 1
        order = tree.args.get("order")
        if (isinstance(node, exp.Column) and order is not None and len(order.expressions) == 1
                and isinstance(order.expressions[0].this, exp.Count) and order.expressions[0].args.get("desc")):
            return "mode", node.name, None
        return None
    kinds = {exp.Count: "count", exp.Max: "max", exp.Min: "min", exp.Avg: "avg"}
    for cls, kind in kinds.items():
        if isinstance(node, cls):
            arg = node.this
            if isinstance(arg, exp.Distinct):
                return None
            column = arg.name if isinstance(arg, exp.Column) else None
            if kind != "count" and column is None:
                return None
            return kind, column, decimals
    return None


def answer_from_profile(profile: dict, gold_sql: str) -> Any | None:
    """The value the question's aggregate takes on a whole-result profile (`bapsql.env.posthoc`), read at the
    precision the profile shows; None when the profile does not determine it."""
    agg = _aggregate(gold_sql)
    if agg is None or profile.get("rows_total") is None:
        return None
    kind, column, decimals = agg
    cols = {c["name"]: c for c in profile["columns"]}
    if kind == "count":
        if column is None:
            return profile["rows_total"]
        c = cols.get(column)
        return None if c is None else profile["rows_total"] - c["nulls"]
    c = cols.get(column)
    if c is None:
        return None
    if kind in ("max", "min"):
        return shown_value(c[kind])
    if kind == "avg":
        if c["mean"] is None:
            return None
        return round(c["mean"], decimals) if decimals is not None else shown_value(round(c["mean"], 4))
    top = c["top"]
    if not top or (len(top) > 1 and top[1][1] == top[0][1]):  # no mode, or a tie the profile cannot break
        return None
    return shown_value(top[0][0])


def _profile_of_rows(result: ResultSeen) -> dict:
    prof = ResultProfiler()
    for row in result.rows:
        prof(result.columns, row)
    return dataclasses.asdict(prof.profile(result.columns, complete=True))


class Drafter(ScriptedPolicy):
    name = "scripted.drafter"

    def __init__(self, p_direct: float = 0.5) -> None:
        self.p_direct = p_direct

    def read(self, ctx: Context, result: ResultSeen | None) -> AnswerAction | None:
        """The answer what was shown determines, or None (see the module docstring, step 3)."""
        if result is None or result.ref is None:
            return None
        gold, cites = ctx.hint.gold_sql, (result.ref,)
        if result.profile is not None:
            value = answer_from_profile(result.profile, gold) if ctx.hint.answer_kind == "scalar" else None
            return None if value is None else AnswerAction("scalar", (value,), cites)
        if result.sql.strip() == ctx.hint.naive_sql.strip() and ctx.hint.has_naive:
            if not result.complete or ctx.hint.answer_kind != "scalar":
                return None  # a cut listing (or a listing of a list question's superset) answers nothing
            value = answer_from_profile(_profile_of_rows(result), gold)
            return None if value is None else AnswerAction("scalar", (value,), cites)
        if result.rows or result.status == "ok":
            return answer_from_result(result, ctx.hint.answer_kind)
        return None

    def script(self, ctx: Context) -> Script:
        hint = ctx.hint
        direct = (not hint.has_naive) or bool(ctx.rng.random() < self.p_direct)
        draft = hint.gold_sql if direct else hint.naive_sql
        if not direct and ctx.can("estimate_query"):
            est, warned = yield from estimate(ctx, draft)
            if warned and ctx.can("rewrite_query"):
                yield from rewrite(ctx, hint.gold_sql, warning_reason(est))
                draft = hint.gold_sql
        result = yield from execute(ctx, draft)
        answer = self.read(ctx, result)
        if answer is None and draft != hint.gold_sql and rem(ctx, "queries") > 0:
            result = yield from execute(ctx, hint.gold_sql)
            answer = self.read(ctx, result)
        if answer is not None:
            yield answer
            return
        yield from give_up(ctx, "the evidence shown does not answer the question within the budget")

