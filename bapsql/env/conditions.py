"""Experimental conditions: what the environment offers and shows the policy (DESIGN §4; paper Tables 2 and 4).

A **method** is a policy under a condition, written ``POLICY@CONDITION`` (``model.sft@raw``,
``scripted.drafter@adaptive_posthoc``). The condition belongs to the environment, so every condition applies to every
policy — scripted or model-backed — in evaluation, SFT export and GRPO training alike. A `Condition` is a set of
orthogonal switches:

================== ==================================================================================================
switch             values
================== ==================================================================================================
show_dashboard     the remaining-budget line after every observation (and the ledger in the policy's info);
                   hidden, no refusal or message quotes a ledger figure ("no result / context room left")
actions            the tools offered; the system prompt lists only these, and any other tool call is an invalid
                   action whose observation says the tool is not offered under this condition
estimates          ``true``: estimate/rewrite observations show the estimator's p50/p95; ``permuted``: the
                   cost-matched placebo (`bapsql.env.placebo`): the shown payloads are a seeded permutation of the
                   payloads requested under the same condition and budget while the shield keeps the true ones;
                   ``none``: no estimate is ever shown (estimate_query / rewrite_query cannot be offered)
preflight          ``numbers``: a preflight rejection quotes the estimate; ``words``: it says the query was refused
                   and why in words only (the no-planning conditions must not leak estimates)
rewrite            ``policy``: the policy's rewrite is estimated and executed as written; ``rule``: the env replaces
                   it by the rule-based rewrite (`bapsql.env.rewriter`) of the candidate last estimated, and
                   a later execution of the policy's rewrite runs the rule-based SQL
posthoc            the post-execution controller (`bapsql.env.posthoc`): ``none`` / ``truncate`` / ``profile`` /
                   ``limit`` / ``adaptive``; it decides how a result is rendered once its full size is known
================== ==================================================================================================

Abstention is a tool like the others (``no_abstention`` drops it). `CONDITIONS` holds the named presets; `condition`
looks one up with a clear error; `split_method` / `method_name` convert between ``P@C`` labels and their parts.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Iterable, Literal

from bapsql.env.actions import TOOL_NAMES
from bapsql.errors import ConfigError

PLANNING_TOOLS: tuple[str, ...] = ("estimate_query", "rewrite_query")
ESTIMATE_MODES: tuple[str, ...] = ("true", "permuted", "none")
PREFLIGHT_MODES: tuple[str, ...] = ("numbers", "words")
REWRITE_MODES: tuple[str, ...] = ("policy", "rule")
POSTHOC_MODES: tuple[str, ...] = ("none", "truncate", "profile", "limit", "adaptive")
DEFAULT_CONDITION = "full"
SEPARATOR = "@"


@dataclass(frozen=True)
class Condition:
    """One experimental condition (see the module docstring). ``actions`` are kept in the canonical tool order."""

    name: str = DEFAULT_CONDITION
    description: str = "BAP-SQL: every tool, true estimates, the dashboard"
    show_dashboard: bool = True
    actions: tuple[str, ...] = TOOL_NAMES
    estimates: Literal["true", "permuted", "none"] = "true"
    preflight: Literal["numbers", "words"] = "numbers"
    rewrite: Literal["policy", "rule"] = "policy"
    posthoc: Literal["none", "truncate", "profile", "limit", "adaptive"] = "none"

    def __post_init__(self) -> None:
        if not self.name or SEPARATOR in self.name or "/" in self.name or "+" in self.name:
            raise ConfigError(f"condition.name: a non-empty name without '@', '/' or '+', got {self.name!r}")
        unknown = sorted(set(self.actions) - set(TOOL_NAMES))
        if unknown:
            raise ConfigError(f"condition.actions: unknown tool(s) {unknown}; tools are {list(TOOL_NAMES)}")
        if not {"answer", "abstain"} & set(self.actions):
            raise ConfigError("condition.actions: must include answer or abstain, or no episode can terminate")
        for key, allowed in (("estimates", ESTIMATE_MODES), ("preflight", PREFLIGHT_MODES),
                             ("rewrite", REWRITE_MODES), ("posthoc", POSTHOC_MODES)):
            if getattr(self, key) not in allowed:
                raise ConfigError(f"condition.{key}: must be one of {list(allowed)}, got {getattr(self, key)!r}")
        if self.estimates == "none" and set(PLANNING_TOOLS) & set(self.actions):
            raise ConfigError("condition.estimates: 'none' cannot offer estimate_query / rewrite_query (they show "
                              "estimates); drop them from actions or show estimates")
        object.__setattr__(self, "actions", tuple(t for t in TOOL_NAMES if t in self.actions))

    def offers(self, tool: str) -> bool:
        return tool in self.actions

    def without(self, *tools: str) -> tuple[str, ...]:
        return tuple(t for t in self.actions if t not in tools)


def _preset(name: str, description: str, **switches) -> Condition:
    return Condition(name=name, description=description, **switches)


_NO_PLAN = dict(actions=tuple(t for t in TOOL_NAMES if t not in PLANNING_TOOLS), estimates="none", preflight="words")

CONDITIONS: dict[str, Condition] = {c.name: c for c in (
    _preset("raw", "Raw agent: no dashboard, no estimate / rewrite", show_dashboard=False, **_NO_PLAN),
    _preset("dashboard", "Dashboard: budget visible, no estimate / rewrite", **_NO_PLAN),
    _preset("adaptive_posthoc", "Adaptive post-hoc: dashboard + the adaptive post-execution controller, no "
            "estimate / rewrite", posthoc="adaptive", **_NO_PLAN),
    _preset("full", "BAP-SQL: every tool, true estimates, the dashboard"),
    _preset("no_planning", "locked suite's no-planning: inspect, execute, evidence, answer, abstain; words-only "
            "preflight (trained and evaluated so)", **_NO_PLAN),
    _preset("no_interface", "Table 4: no estimate / rewrite actions (fixed policy trained under full)", **_NO_PLAN),
    _preset("shuffled_estimate", "Table 4: cost-matched placebo (shown p50/p95 permuted; the shield keeps the "
            "truth)", estimates="permuted"),
    _preset("no_rewrite", "Table 4: no rewrite action (estimates still shown)",
            actions=tuple(t for t in TOOL_NAMES if t != "rewrite_query")),
    _preset("deterministic_rewrite", "Table 4: the policy's rewrites replaced by the rule-based rewriter",
            rewrite="rule"),
    _preset("no_abstention", "Table 4: no abstain action (the policy must answer)",
            actions=tuple(t for t in TOOL_NAMES if t != "abstain")),
)}


def condition(name: str | Condition) -> Condition:
    """The preset called ``name`` (a `Condition` passes through); `ConfigError` listing the presets otherwise."""
    if isinstance(name, Condition):
        return name
    if name not in CONDITIONS:
        raise ConfigError(f"unknown condition {name!r}; conditions: {', '.join(CONDITIONS)} "
                          "(run `bapsql conditions`)")
    return CONDITIONS[name]


def check_conditions(names: str | Iterable[str], key: str) -> None:
    """Raise `ConfigError` prefixed with the config key (``key[i]``, or ``key`` for a plain string) of the first name in
    ``names`` that is not a condition preset; config classes call it from ``__post_init__``."""
    for where, name in ([(key, names)] if isinstance(names, str) else
                        [(f"{key}[{i}]", n) for i, n in enumerate(names)]):
        try:
            condition(name)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from exc


def split_method(method: str) -> tuple[str, str]:
    """``"P@C"`` → ``("P", "C")``; a name without ``@`` runs under the default condition (``full``)."""
    policy, sep, cond = method.strip().partition(SEPARATOR)
    if sep and (not cond or SEPARATOR in cond):
        raise ConfigError(f"method {method!r}: write POLICY@CONDITION with one '@' and a condition name")
    return policy, cond if sep else DEFAULT_CONDITION


def method_name(policy: str, cond: str | Condition) -> str:
    """The method label ``P@C`` of the logs."""
    return f"{policy}{SEPARATOR}{condition(cond).name}"


def with_switches(base: Condition, **switches) -> Condition:
    """``base`` with some switches changed (the name stays; used for one-off conditions in tests and configs)."""
    return dataclasses.replace(base, **switches)


def placebo_source(cond: str | Condition) -> Condition:
    """The condition whose runs record a placebo condition's payloads: the same switches with true estimates (for
    ``shuffled_estimate``: ``full``). `ConfigError` when no preset has those switches."""
    c = condition(cond)
    want = dataclasses.replace(c, estimates="true")
    for preset in CONDITIONS.values():
        if dataclasses.replace(preset, name=want.name, description=want.description) == want:
            return preset
    raise ConfigError(f"condition {c.name!r}: no preset shows its estimates truthfully with the same switches, so "
                      "its placebo has no recording run")
