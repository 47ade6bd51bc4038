"""Scripted baselines of paper Table 2: Raw agent, Dashboard, Adaptive post-hoc control.

All three know the right SQL as well as the workflows do (the oracle's gold query) but plan no observation: none
has the estimator or the rewrite action. They share one *draft rule*, so paired comparisons differ only in what each
baseline adds: with probability ``p_direct`` (default 0.5, drawn from the episode's seeded rng, the same draw for
every baseline) the agent writes the gold-shaped aggregate first; otherwise it first executes the naive broad query
(listing the raw rows the answer is computed from), as an agent that looks at the data before aggregating does.

- ``baseline.raw`` — no budget dashboard (budget-blind), no estimate / rewrite. After a naive draft it executes the
  aggregate whatever is left, and answers from the last rows it was shown.
- ``baseline.dashboard`` — the dashboard is visible; still no estimator or rewrite. Before a query is run it cannot
  know its size, so it drafts like Raw; after the draft it reads the dashboard: when the draft exhausted the queries,
  result tokens or VM steps it abstains (justified by the dashboard) instead of answering from the wrong rows.
- ``baseline.adaptive_posthoc`` — dashboard visible, no estimator or rewrite; it controls observations only *after*
  execution. Mode ``auto`` (default) picks the post-hoc control per oversized result by a fixed rule:
  truncated by result tokens or by the context → ``profile`` (compress the block to its deterministic profile:
  the env's summarization); truncated by the row or byte cap → ``limit`` (a fixed ``LIMIT 20`` on every later query
  that has none); stopped by the VM-step cap → ``truncate`` (archive the useless partial block). A fixed mode
  (``truncate`` | ``profile`` | ``limit``) applies that control to every truncated result. Post-hoc control restores
  context headroom but cannot refund cumulative result tokens or VM steps (the paper's point).
"""

from __future__ import annotations

from bapsql.env.actions import ManageEvidence
from bapsql.errors import ConfigError
from bapsql.policies.base import Context, Interface, ResultSeen, Script, ScriptedPolicy
from bapsql.policies.workflows import answer_with_gold, execute, finish, give_up, rem

NO_PLANNING = ("estimate_query", "rewrite_query")
POSTHOC_MODES: tuple[str, ...] = ("auto", "truncate", "profile", "limit")
FIXED_LIMIT = 20


def draft_is_direct(ctx: Context, p_direct: float) -> bool:
    """The shared draft rule: True → the aggregate first; False → the naive broad query first."""
    return (not ctx.hint.has_naive) or bool(ctx.rng.random() < p_direct)


class RawAgent(ScriptedPolicy):
    name = "baseline.raw"
    interface = Interface(show_dashboard=False).without(*NO_PLANNING)

    def __init__(self, p_direct: float = 0.5) -> None:
        self.p_direct = p_direct

    def script(self, ctx: Context) -> Script:
        if draft_is_direct(ctx, self.p_direct):
            yield from answer_with_gold(ctx)
            return
        first = yield from execute(ctx, ctx.hint.naive_sql)
        second = yield from execute(ctx, ctx.hint.gold_sql)
        yield from finish(ctx, second if second is not None and second.ref else first)


class DashboardAgent(ScriptedPolicy):
    name = "baseline.dashboard"
    interface = Interface(show_dashboard=True).without(*NO_PLANNING)

    def __init__(self, p_direct: float = 0.5) -> None:
        self.p_direct = p_direct

    def script(self, ctx: Context) -> Script:
        if draft_is_direct(ctx, self.p_direct):
            yield from answer_with_gold(ctx)
            return
        yield from execute(ctx, ctx.hint.naive_sql)
        spent = [ch for ch in ("queries", "result_tokens", "vm_steps") if rem(ctx, ch) == 0]
        if spent:
            yield from give_up(ctx, f"the budget is exhausted ({', '.join(spent)} left: 0) and the rows shown do "
                                    "not answer the question")
            return
        second = yield from execute(ctx, ctx.hint.gold_sql)
        yield from finish(ctx, second)


class AdaptivePostHoc(ScriptedPolicy):
    name = "baseline.adaptive_posthoc"
    interface = Interface(show_dashboard=True).without(*NO_PLANNING)

    def __init__(self, p_direct: float = 0.5, mode: str = "auto") -> None:
        if mode not in POSTHOC_MODES:
            raise ConfigError(f"post-hoc mode must be one of {POSTHOC_MODES}, got {mode!r}")
        self.p_direct, self.mode = p_direct, mode
        if mode != "auto":
            self.name = f"baseline.adaptive_posthoc_{mode}"

    def control_for(self, result: ResultSeen) -> str | None:
        """The post-hoc control this baseline applies to one result (None: the result is left as is)."""
        if result.ref is None or result.status != "truncated":
            return None
        if self.mode != "auto":
            return self.mode
        if result.truncated_by in ("rows", "bytes"):
            return "limit"
        if result.truncated_by == "vm_steps":
            return "truncate"
        return "profile"

    def posthoc(self, ctx: Context, result: ResultSeen | None) -> Script:
        control = self.control_for(result) if result is not None else None
        if control == "limit":
            self._limit = True
        elif control in ("truncate", "profile") and ctx.can("manage_evidence") and rem(ctx, "turns") >= 3:
            yield ManageEvidence("archive" if control == "truncate" else "compress", result.ref)

    def guarded(self, sql: str) -> str:
        if self._limit and " limit " not in f" {sql.lower()} ":
            return f"{sql.strip().rstrip(';')} LIMIT {FIXED_LIMIT}"
        return sql

    def script(self, ctx: Context) -> Script:
        self._limit = False
        if draft_is_direct(ctx, self.p_direct):
            yield from answer_with_gold(ctx)
            return
        first = yield from execute(ctx, ctx.hint.naive_sql)
        yield from self.posthoc(ctx, first)
        if rem(ctx, "queries") == 0:
            yield from give_up(ctx, "no query left after the draft")
            return
        second = yield from execute(ctx, self.guarded(ctx.hint.gold_sql))
        yield from finish(ctx, second)


BASELINES: tuple[type[ScriptedPolicy], ...] = (RawAgent, DashboardAgent, AdaptivePostHoc)
