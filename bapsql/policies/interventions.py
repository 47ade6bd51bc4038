"""Fixed-policy interventions of paper Table 4, as wrappers around any policy (scripted or model-backed).

An intervention changes exactly one thing and nothing else:

=================== ===================================================================================================
name                what it changes
=================== ===================================================================================================
no_interface        the interface: ``estimate_query`` and ``rewrite_query`` are not offered (fixed policy)
no_planning         the interface: the action-matched no-planning set of the locked retraining suite (Inspect,
                    Execute, evidence management, Answer, Abstain; no estimates, no Rewrite). For a fixed policy this
                    is the same interface as no_interface; it is named separately so SFT data and runs of the
                    retraining suite carry the paper's label. The shield and its preflight estimator are unchanged.
shuffled_estimate   the interface: ``estimate_view = "shuffled"`` — the cost-matched placebo. The env shows another
                    query's p50/p95 (drawn from a seeded pool) in estimate / rewrite observations and warns from those
                    numbers; the shield, its preflight estimator and every charge keep the true estimates.
no_rewrite          the interface: ``rewrite_query`` is not offered (estimates still shown)
no_abstention       the interface: ``abstain`` is not offered (the policy must answer)
deterministic_rewrite the completions: every ``rewrite_query`` the wrapped policy emits is replaced by the rule-based
                    rewrite (`bapsql.env.rewriter`) of the candidate it last estimated, and a later
                    ``execute_query`` of the policy's own rewrite runs the rule-based SQL instead. Interface unchanged.
=================== ===================================================================================================

A wrapped policy is told its (changed) interface at reset, so scripted policies adapt to the tools they are given;
the policy's name becomes ``<inner>+<intervention>`` (e.g. ``workflow.estimate_rewrite+no_interface``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

from bapsql.budgets import Budget
from bapsql.env.actions import EstimateQuery, ExecuteQuery, RewriteQuery, parse_action, render_action
from bapsql.policies.base import Interface, Policy, PolicyOptions
from bapsql.env.rewriter import DEFAULT_K, affordable_rows, deterministic_rewrite
from bapsql.types import Task


@dataclass(frozen=True)
class Intervention:
    """A named change to a policy's interface (``transform``) and/or its completions (the wrapper class)."""

    name: str
    description: str
    transform: Callable[[Interface], Interface]


def _identity(i: Interface) -> Interface:
    return i


INTERVENTIONS: dict[str, Intervention] = {
    iv.name: iv
    for iv in (
        Intervention("no_interface", "no estimate_query / rewrite_query actions",
                     lambda i: i.without("estimate_query", "rewrite_query")),
        Intervention("no_planning", "action-matched no-planning set: no estimates, no rewrite (retraining suite)",
                     lambda i: i.without("estimate_query", "rewrite_query")),
        Intervention("shuffled_estimate", "placebo: visible p50/p95 drawn from a seeded pool; shield keeps the truth",
                     lambda i: dataclasses.replace(i, estimate_view="shuffled")),
        Intervention("no_rewrite", "no rewrite_query action (estimates still shown)",
                     lambda i: i.without("rewrite_query")),
        Intervention("no_abstention", "no abstain action (the policy must answer)", lambda i: i.without("abstain")),
        Intervention("deterministic_rewrite", "the policy's rewrites replaced by the rule-based rewriter",
                     _identity),
    )
}


class Intervened:
    """``inner`` under intervention ``iv``: interface transformed; completions passed through unchanged."""

    def __init__(self, inner: Policy, iv: Intervention) -> None:
        self.inner, self.intervention = inner, iv
        self.name = f"{inner.name}+{iv.name}"
        self.interface = iv.transform(inner.interface)
        self.needs_oracle = inner.needs_oracle

    def reset(self, task: Task, budget: Budget, seed: int, options: PolicyOptions) -> None:
        self.inner.reset(task, budget, seed, options)

    def act(self, observation: str, info: dict) -> str:
        return self.inner.act(observation, info)


class DeterministicRewrite(Intervened):
    """Replaces the wrapped policy's rewrites by the rule-based rewriter's (see the module docstring).

    The rewriter gets the candidate the policy last estimated (or executed) and a row allowance ``k`` from that
    candidate's visible estimate and the remaining result tokens (`affordable_rows`; ``DEFAULT_K`` when unknown)."""

    def reset(self, task: Task, budget: Budget, seed: int, options: PolicyOptions) -> None:
        super().reset(task, budget, seed, options)
        self._candidate: str | None = None
        self._estimate: dict | None = None
        self._substitutes: dict[str, str] = {}

    def act(self, observation: str, info: dict) -> str:
        if info.get("action") in ("estimate_query", "rewrite_query") and info.get("estimate"):
            self._estimate = info["estimate"]
        text = self.inner.act(observation, info)
        action = parse_action(text)
        if isinstance(action, EstimateQuery):
            self._candidate, self._estimate = action.sql, None
        elif isinstance(action, RewriteQuery):
            base = self._candidate or action.sql
            k = DEFAULT_K
            led = info.get("ledger")
            if self._estimate and led:
                k = affordable_rows(self._estimate["rows"]["p95"], self._estimate["result_tokens"]["p95"],
                                    led["remaining"]["result_tokens"])
            rw = deterministic_rewrite(base, k)
            self._substitutes[action.sql] = rw.sql
            self._candidate = rw.sql
            return render_action(RewriteQuery(rw.sql, f"deterministic rewrite ({rw.rule}): {rw.reason}"))
        elif isinstance(action, ExecuteQuery) and action.sql in self._substitutes:
            return render_action(ExecuteQuery(self._substitutes[action.sql]))
        elif isinstance(action, ExecuteQuery):
            self._candidate = action.sql
        return text


def intervene(inner: Policy, name: str) -> Policy:
    """Wrap ``inner`` in the intervention called ``name`` (`KeyError` for an unknown name)."""
    iv = INTERVENTIONS[name]
    return DeterministicRewrite(inner, iv) if name == "deterministic_rewrite" else Intervened(inner, iv)
