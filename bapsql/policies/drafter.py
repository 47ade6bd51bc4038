"""``scripted.drafter``: the budget-blind stand-in for a model that drafts a broad query first (DESIGN §4).

It knows the right SQL as well as the workflows do (the oracle's gold query) and the obvious broad draft (the
benchmark's naive query: the generator's on the embedded benchmark, `bapsql.data.naive` derived from the gold SQL on
BIRD/Spider). It plans nothing on its own; what differs between conditions is only what the environment offers and
shows it, so the same script is run under every condition:

1. with probability ``p_direct`` (the episode's seeded coin) it drafts the aggregate, otherwise the broad draft;
2. if the condition offers ``estimate_query`` it estimates the broad draft, and on a WARNING rewrites it to the
   aggregate when ``rewrite_query`` is offered (under ``rewrite: rule`` the environment substitutes its own rewrite);
3. it executes the draft and reads what it was shown (`shown_facts`), the same way under every condition: a
   post-hoc profile of the whole result, the profile of a complete listing's rows, or a cut listing's row count
   (its note "k of N rows shown"); `answer_from_profile` reads from these the aggregate the question asks for (row
   count, min, max, mean at the precision a profile shows, most frequent value) — what they do not determine is
   not answered (a cut listing determines a row count and nothing else);
4. when that answered nothing and the dashboard does not show the queries exhausted (or is hidden), it executes the
   aggregate and answers from it;
5. otherwise it abstains (or, where abstention is not offered, answers from the best rows it saw).
"""

from __future__ import annotations

import dataclasses

from typing import Any

from bapsql.data.aggregates import question_aggregate as _aggregate
from bapsql.env.actions import AnswerAction
from bapsql.env.evidence import MEAN_DECIMALS
from bapsql.env.posthoc import ResultProfiler
from bapsql.policies.base import Context, ResultSeen, Script, ScriptedPolicy, answer_from_result, shown_value
from bapsql.policies.workflows import estimate, execute, give_up, rem, rewrite, warning_reason


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
        shown = shown_value(round(c["mean"], MEAN_DECIMALS))  # the mean as the profile renders it
        return round(shown, decimals) if decimals is not None and decimals < MEAN_DECIMALS else shown
    top = c["top"]
    if not top or (len(top) > 1 and top[1][1] == top[0][1]):  # no mode, or a tie the profile cannot break
        return None
    return shown_value(top[0][0])


def _profile_of_rows(result: ResultSeen) -> dict:
    prof = ResultProfiler()
    for row in result.rows:
        prof(result.columns, row)
    return dataclasses.asdict(prof.profile(result.columns, complete=True))


def shown_facts(result: ResultSeen) -> dict | None:
    """What an execution showed about its whole result, as a profile `answer_from_profile` reads: the post-hoc
    profile; the profile of a complete listing's rows; for a cut listing, only the row count its note shows ("k of N
    rows shown"); None when nothing about the whole result was shown. The same figure reads the same way whichever
    condition showed it."""
    if result.profile is not None:
        return result.profile
    if result.complete:
        return _profile_of_rows(result)
    if result.rows_total is not None:
        return {"rows_total": result.rows_total, "columns": []}
    return None


class Drafter(ScriptedPolicy):
    name = "scripted.drafter"

    def __init__(self, p_direct: float = 0.5) -> None:
        self.p_direct = p_direct

    def read(self, ctx: Context, result: ResultSeen | None) -> AnswerAction | None:
        """The answer what was shown determines, or None (see the module docstring, step 3)."""
        if result is None or result.ref is None:
            return None
        broad = result.sql.strip() == ctx.hint.naive_sql.strip() and ctx.hint.has_naive
        if result.profile is not None or broad:  # a list question's broad listing is a superset: it answers nothing
            facts = shown_facts(result) if ctx.hint.answer_kind == "scalar" else None
            value = None if facts is None else answer_from_profile(facts, ctx.hint.gold_sql)
            return None if value is None else AnswerAction("scalar", (value,), (result.ref,))
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

