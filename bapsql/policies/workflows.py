"""The nine programmatic workflows (paper "Training": SFT turn pairs; DESIGN §4). Each is also a runnable policy.

Every workflow imitates an agent that writes the right SQL (the oracle's gold query) but has to fit it into the
budget; the answer values always come from rows the env executed and showed.

**Estimate first when the prompt says the budget is tight.** Before any workflow runs a query, it estimates it when
`estimate_first` holds: the estimate tool is offered and the dashboard shows at most `TIGHT_QUERIES` queries or
`TIGHT_RESULT_TOKENS` result tokens left (the ladder's XS and S from the start), whatever the query. When that
estimate shows the query cannot run (`over_budget`) the workflow abstains; otherwise it runs the query. The rule
reads only what the policy's prompt shows *when it names the tool*, so the SFT data teaches a condition a model can
learn. A budget-blind rotation (every workflow in its slot whatever the budget) taught only the marginal: the
trained model executed first at every level (README "sft.branch_tries 8, trained"). A rule that also skipped
queries whose text bounds them to a few rows (d498ab5) could not be seen either: a tool call names the tool before
it writes the SQL, and the trained model estimated the compact queries and executed the broad ones (README
"Estimate-first workflows and a dashboard fix, trained"). Each adapts to the remaining budget
(`Feedback.remaining`) and to the estimates it observes, and to the interface it is given (a tool that is not
offered is never called; e.g. without ``rewrite_query`` a warned draft is either abandoned by abstaining or executed
as is, and without ``abstain`` the workflow always tries to answer).

=========================== ==========================================================================================
name                        plan
=========================== ==========================================================================================
direct_aggregation          execute the gold aggregate at once; answer (abstain if the shield rejects it)
estimate_rewrite            estimate the naive draft; on a WARNING rewrite it to the gold aggregate; abstain when even
                            the rewrite's p50 exceeds what remains; execute; answer. Without the rewrite action a
                            warned draft runs as drafted (the aggregate follows only if a query is left)
drill_down                  with ≥ 2 queries and room: peek at a few rows of the draft (LIMIT), then the aggregate;
                            with one query: inspect the gold's tables first, then the aggregate
evidence_compression        with ≥ 2 queries: a larger peek, compress (or archive) it to win back context, then the
                            aggregate; otherwise execute and answer
justified_abstention        estimate the gold query; abstain, quoting the numbers, when its p50 VM steps or result
                            tokens exceed what remains; else execute and answer
schema_first                inspect the tables the gold query reads, then execute and answer
verify_answer               execute the aggregate, then (if a query and the result tokens allow) a corroborating
                            reformulation; answer citing both blocks
restore_after_archive       execute, archive the block, (with turns to spare) inspect the schema, restore the block
                            (re-charging its result tokens when they remain), answer citing it
recover_after_rejection     with ≥ 2 queries, execute the naive draft without estimating (a staged turn, kept out
                            of the SFT loss: the mistake is the situation, not the lesson); after a rejection /
                            truncation / error rewrite to the aggregate (when offered); execute it; answer
=========================== ==========================================================================================

Three of them branch on what the budget shows (estimate_rewrite rewrites, justified_abstention abstains,
recover_after_rejection rewrites after a rejection); on a task and budget where the branch is not needed they play
the plain path. `ScriptedPolicy.took_branch` says which an episode took (``sft.branch_tries`` retries for the branch).

`RecoverFromError` (``workflow.recover_from_error``) is not one of the nine: extra SFT data for small models
(a staged query with a misnamed column, kept out of the loss; the schema; the gold query; the answer).
"""

from __future__ import annotations

from typing import Generator, Mapping, Sequence

from bapsql.env.actions import (
    Abstain, AnswerAction, EstimateQuery, ExecuteQuery, InspectSchema, ManageEvidence, RewriteQuery,
)
from bapsql.policies.oracle import misnamed_column_sql
from bapsql.policies.base import (
    Context, EstimateSeen, Feedback, ResultSeen, Script, ScriptedPolicy, answer_from_result,
)

# ------------------------------------------------------------------------------------------------------ sub-steps


def execute(ctx: Context, sql: str) -> Generator:
    """Execute ``sql``; returns the `ResultSeen`."""
    fb: Feedback = yield ExecuteQuery(sql)
    return fb.result


def estimate(ctx: Context, sql: str) -> Generator:
    """Estimate ``sql``; returns (estimate, warned)."""
    ctx.estimated.add(sql)
    fb: Feedback = yield EstimateQuery(sql)
    return fb.estimate, fb.warning


def rewrite(ctx: Context, sql: str, reason: str) -> Generator:
    """Rewrite the candidate to ``sql``; returns (estimate of the rewrite, warned)."""
    ctx.estimated.add(sql)
    fb: Feedback = yield RewriteQuery(sql, reason)
    return fb.estimate, fb.warning


TIGHT_QUERIES = 2  # at most this many queries left ...
TIGHT_RESULT_TOKENS = 250  # ... or this few result tokens left: the budget is tight (XS and S from the start)


def estimate_first(ctx: Context, sql: str) -> bool:
    """Whether to estimate ``sql`` before running it, from what the prompt shows before the call is written: the
    estimate tool is offered, ``sql`` has not been estimated yet, and the dashboard shows a tight budget
    (`TIGHT_QUERIES` / `TIGHT_RESULT_TOKENS`; hidden, it shows nothing). The query's text plays no part: the policy
    chooses the tool before it writes the SQL."""
    if not ctx.can("estimate_query") or ctx.remaining is None or sql in ctx.estimated:
        return False
    return rem(ctx, "queries") <= TIGHT_QUERIES or rem(ctx, "result_tokens") <= TIGHT_RESULT_TOKENS


def execute_checked(ctx: Context, sql: str) -> Generator:
    """Execute ``sql``, estimating it first where `estimate_first` says so; returns the `ResultSeen`, or None when
    that estimate showed the query cannot run (`over_budget`) and the workflow abstained instead (the episode is
    over: the caller must not act again)."""
    if estimate_first(ctx, sql):
        est, _ = yield from estimate(ctx, sql)
        why = over_budget(ctx, est)
        if why is not None:
            yield from give_up(ctx, f"the query cannot run within the budget: {why}")
            return None
    result = yield from execute(ctx, sql)
    return result


def finish(ctx: Context, result: ResultSeen | None, *, also_cite: tuple[str, ...] = ()) -> Generator:
    """Answer from ``result``'s shown rows (a complete empty result is an empty answer); when no row of it was
    shown (rejected, error, or cut to nothing), abstain — or, where abstaining is off, answer from the best rows."""
    if result is not None and result.ref is not None and (result.rows or result.status == "ok"):
        ans = answer_from_result(result, ctx.hint.answer_kind)
        cites = tuple(dict.fromkeys(ans.citations + tuple(c for c in also_cite if c)))
        yield AnswerAction(ans.kind, ans.values, cites)
        return
    why = result.message if result is not None and result.message else "no rows were shown"
    yield from give_up(ctx, f"the query could not be answered within the budget: {why}")


def give_up(ctx: Context, reason: str) -> Generator:
    """Abstain with ``reason``; where abstention is not offered, answer from the best shown rows instead."""
    if ctx.can("abstain"):
        yield Abstain(reason)
        return
    best = ctx.best_result()
    yield answer_from_result(best or ResultSeen(None, "", "rejected", (), (), ""), ctx.hint.answer_kind)


def rem(ctx: Context, channel: str, default: int = 10**12) -> int:
    """Remaining budget of ``channel`` (a large default when the dashboard is hidden: the policy cannot tell)."""
    r = ctx.remaining
    return default if r is None else int(r[channel])


def over_budget(ctx: Context, est: EstimateSeen | None) -> str | None:
    """Why an estimated query is hopeless within what remains, or None when it is worth trying: hopeless means its
    p50 VM steps exceed the VM steps left — the shield's preflight would reject it (the same rule), so abstaining
    saves the turn. An excess of result tokens is tried: the shield admits what fits, and the estimator's token
    figures for selective filters run high (abstaining on them lost answerable tasks)."""
    if est is None or est.error:
        return None
    steps = rem(ctx, "vm_steps")
    if est.steps_p50 > steps:
        return f"its p50 VM steps {est.steps_p50:.0f} exceed the {steps} left"
    return None


def warning_reason(est: EstimateSeen | None) -> str:
    """The rewrite's reason, quoting the draft's estimate."""
    if est is None or est.error:
        return "the draft could not be estimated; use the exact aggregate"
    return (f"draft p95 {est.tokens_p95:.0f} result tokens / {est.steps_p95:.0f} VM steps exceeds the budget; "
            "compute the answer with a selective aggregate instead")


def peek_sql(sql: str, k: int) -> str:
    """A bounded look at a query's first ``k`` rows."""
    return f"SELECT * FROM ({sql.strip().rstrip(';').strip()}) LIMIT {int(k)}"


def corroborate_sql(sql: str) -> str:
    """An independent re-execution of the same question, as a derived table."""
    return f"SELECT * FROM ({sql.strip().rstrip(';').strip()}) AS corroboration"


def execute_gold(ctx: Context) -> Generator:
    """Execute the oracle's gold query (`execute_checked`); returns the `ResultSeen`, or None when the workflow
    abstained instead."""
    result = yield from execute_checked(ctx, ctx.hint.gold_sql)
    return result


def answer_with_gold(ctx: Context) -> Generator:
    """Execute the oracle's gold query and answer from what it showed (or abstain when nothing was shown)."""
    result = yield from execute_gold(ctx)
    if result is not None:
        yield from finish(ctx, result)


# ------------------------------------------------------------------------------------------------------ workflows


class DirectAggregation(ScriptedPolicy):
    name = "workflow.direct_aggregation"

    def script(self, ctx: Context) -> Script:
        yield from answer_with_gold(ctx)


class EstimateRewrite(ScriptedPolicy):
    name = "workflow.estimate_rewrite"
    has_branch = True

    def took_branch(self, summary) -> bool:
        return summary.rewrites > 0  # a warned (or unestimable) draft rewritten

    def script(self, ctx: Context) -> Script:
        if not ctx.can("estimate_query"):
            yield from answer_with_gold(ctx)
            return
        draft = ctx.hint.naive_sql
        est, warned = yield from estimate(ctx, draft)
        if warned or est is None or est.error:
            if ctx.can("rewrite_query"):
                est, warned = yield from rewrite(ctx, ctx.hint.gold_sql, warning_reason(est))
                why = over_budget(ctx, est)
                if why is not None:
                    yield from give_up(ctx, f"even the rewritten aggregate does not fit: {why}")
                    return
            elif ctx.hint.has_naive:
                # warned but no rewrite action: the estimate cannot be acted on, so the candidate runs as drafted;
                # the exact aggregate follows only if a query is left
                first = yield from execute(ctx, draft)
                if rem(ctx, "queries") == 0:
                    yield from finish(ctx, first)
                    return
        yield from answer_with_gold(ctx)


class DrillDown(ScriptedPolicy):
    name = "workflow.drill_down"

    def script(self, ctx: Context) -> Script:
        if rem(ctx, "queries") >= 2 and rem(ctx, "result_tokens") >= 150 and ctx.hint.has_naive:
            peek = yield from execute_checked(ctx, peek_sql(ctx.hint.naive_sql, 3))
            if peek is None:  # abstained on the estimate: the episode is over
                return
        elif ctx.hint.tables and ctx.can("inspect_schema"):
            yield InspectSchema(ctx.hint.tables)
        yield from answer_with_gold(ctx)


class EvidenceCompression(ScriptedPolicy):
    name = "workflow.evidence_compression"

    def script(self, ctx: Context) -> Script:
        if rem(ctx, "queries") >= 2 and rem(ctx, "result_tokens") >= 300 and ctx.can("manage_evidence"):
            k = 10 if rem(ctx, "result_tokens") >= 800 else 5
            peek = yield from execute_checked(ctx, peek_sql(ctx.hint.naive_sql, k))
            if peek is None:
                return
            if peek.ref is not None:
                op = "compress" if len(peek.rows) >= 8 else "archive"
                yield ManageEvidence(op, peek.ref)
        yield from answer_with_gold(ctx)


class JustifiedAbstention(ScriptedPolicy):
    name = "workflow.justified_abstention"
    has_branch = True

    def took_branch(self, summary) -> bool:
        return bool(summary.abstained)  # the estimate said the exact query cannot run

    def script(self, ctx: Context) -> Script:
        if ctx.can("estimate_query"):
            est, _ = yield from estimate(ctx, ctx.hint.gold_sql)
            why = over_budget(ctx, est)
            if why is not None:
                yield from give_up(ctx, f"the exact query cannot run within the budget: {why}")
                return
        yield from answer_with_gold(ctx)


class SchemaFirst(ScriptedPolicy):
    name = "workflow.schema_first"

    def script(self, ctx: Context) -> Script:
        if ctx.can("inspect_schema"):
            yield InspectSchema(ctx.hint.tables or None)
        yield from answer_with_gold(ctx)


class VerifyAnswer(ScriptedPolicy):
    name = "workflow.verify_answer"

    def script(self, ctx: Context) -> Script:
        result = yield from execute_gold(ctx)
        if result is None:
            return
        second = None
        again = corroborate_sql(ctx.hint.gold_sql)
        if (result.complete and rem(ctx, "queries") >= 1 and rem(ctx, "turns") >= 2 + estimate_first(ctx, again)
                and rem(ctx, "result_tokens") >= 2 * max(40, 8 * (len(result.rows) + 1))):
            second = yield from execute_checked(ctx, again)
            if second is None:
                return
        cite = (second.ref,) if second is not None and second.complete else ()
        yield from finish(ctx, result, also_cite=cite)


class RestoreAfterArchive(ScriptedPolicy):
    name = "workflow.restore_after_archive"

    def script(self, ctx: Context) -> Script:
        result = yield from execute_gold(ctx)
        if result is None:
            return
        if (result.complete and ctx.can("manage_evidence") and rem(ctx, "turns") >= 3
                and rem(ctx, "result_tokens") >= 8 * (len(result.rows) + 2)):
            yield ManageEvidence("archive", result.ref)
            if rem(ctx, "turns") >= 4 and ctx.can("inspect_schema") and ctx.hint.tables:
                yield InspectSchema(ctx.hint.tables[:1])
            fb = yield ManageEvidence("restore", result.ref)
            if fb.status != "ok":  # the restore was refused: the rows are not visible, so they cannot be cited
                yield from give_up(ctx, f"the archived evidence could not be restored: {fb.observation.strip()}")
                return
        yield from finish(ctx, result)


class RecoverAfterRejection(ScriptedPolicy):
    name = "workflow.recover_after_rejection"
    has_branch = True

    def took_branch(self, summary) -> bool:
        return summary.rewrites > 0  # the broad draft was rejected / truncated / failed, then rewritten

    def script(self, ctx: Context) -> Script:
        if not ctx.hint.has_naive or rem(ctx, "queries") < 2:  # one query: no room to waste it on the draft
            yield from answer_with_gold(ctx)
            return
        ctx.staged.add(ctx.turn)  # the unestimated draft is the situation this workflow recovers from
        first = yield from execute(ctx, ctx.hint.naive_sql)
        if rem(ctx, "queries") == 0:
            yield from give_up(ctx, "the broad draft used the last query and its rows do not answer the question")
            return
        if first is not None and first.status in ("rejected", "truncated", "error") and ctx.can("rewrite_query"):
            reason = f"the broad draft was {first.status}: aggregate instead"
            est, _ = yield from rewrite(ctx, ctx.hint.gold_sql, reason)
            why = over_budget(ctx, est)
            if why is not None:
                yield from give_up(ctx, f"even the aggregate does not fit: {why}")
                return
        yield from answer_with_gold(ctx)


class RecoverFromError(ScriptedPolicy):
    """Not one of the paper's nine: SFT data for a small model that writes the question's words as column names.
    The first query is that slip (`misnamed_column_sql`), played as a staged turn (kept out of the SFT loss: the
    model learns what follows a "no such column" error, not the slip); then the schema of the tables the gold query
    reads, then the gold query and the answer. Where `estimate_first` holds the slip is estimated, as every
    workflow's first query is, and the error comes from the estimate: the model learns not to execute a query the
    estimator said cannot run (a SmolLM2 SFT model trained without it executed it anyway in 44 of 220 evaluation
    episodes, docs/table2_smollm2_runs.md "t2f"). A query SQLite refuses at prepare costs no query, so this fits XS."""

    name = "workflow.recover_from_error"

    def __init__(self, slips: Mapping[str, Sequence[str]] | None = None) -> None:
        """``slips``: task_id -> a policy's own failed first queries on that task (`bapsql.policies.slips`); a task
        that has some stages one of them (the episode's rng picks) instead of the synthetic slip."""
        super().__init__()
        self.slips = dict(slips or {})

    def script(self, ctx: Context) -> Script:
        own = self.slips.get(ctx.task.task_id)
        wrong = (own[int(ctx.rng.integers(len(own)))] if own
                 else misnamed_column_sql(ctx.hint.gold_sql, ctx.task.question, ctx.rng))
        if wrong is None or rem(ctx, "turns") < 3:
            yield from answer_with_gold(ctx)
            return
        ctx.staged.add(ctx.turn)
        if estimate_first(ctx, wrong):  # a tight budget: the slip is estimated first, as every query is
            est, _ = yield from estimate(ctx, wrong)
            failed = est is not None and bool(est.error)
        else:
            first = yield from execute(ctx, wrong)
            failed = first is not None and first.status == "error"
        if failed and ctx.can("inspect_schema") and ctx.hint.tables and rem(ctx, "turns") >= 3:
            yield InspectSchema(ctx.hint.tables)
        yield from answer_with_gold(ctx)


# the paper's nine, in the order of the table above; SFT_ONLY: extra SFT data, never a workflow of the paper's suite
WORKFLOWS: tuple[type[ScriptedPolicy], ...] = (
    DirectAggregation, EstimateRewrite, DrillDown, EvidenceCompression, JustifiedAbstention, SchemaFirst,
    VerifyAnswer, RestoreAfterArchive, RecoverAfterRejection,
)
SFT_ONLY: tuple[type[ScriptedPolicy], ...] = (RecoverFromError,)
