"""Policy names → policies. One naming scheme, used by the CLI, the runner and the ``method`` column of the logs.

A name is ``<family>.<policy>`` optionally followed by interventions, each as ``+<intervention>`` (applied left to
right, innermost first)::

    workflow.estimate_rewrite                       baseline.raw
    workflow.estimate_rewrite+no_interface          baseline.adaptive_posthoc_limit
    workflow.estimate_rewrite+shuffled_estimate+no_abstention

Names are path-safe (they are Parquet partition values). For convenience `make_policy` also accepts the colon forms
``workflow:estimate_rewrite`` and ``intervention:no_interface(workflow:estimate_rewrite)`` and normalizes them to the
canonical name (`canonical_name`). `policy_names()` lists every base policy; `INTERVENTIONS` every intervention.
"""

from __future__ import annotations

import re
from typing import Callable

from bapsql.errors import ConfigError
from bapsql.policies.base import Policy
from bapsql.policies.baselines import AdaptivePostHoc, DashboardAgent, RawAgent
from bapsql.policies.interventions import INTERVENTIONS, intervene
from bapsql.policies.workflows import WORKFLOWS

_FACTORIES: dict[str, Callable[[], Policy]] = {cls.name: cls for cls in WORKFLOWS}
_FACTORIES.update({
    RawAgent.name: RawAgent,
    DashboardAgent.name: DashboardAgent,
    AdaptivePostHoc.name: AdaptivePostHoc,
    **{f"baseline.adaptive_posthoc_{m}": (lambda m=m: AdaptivePostHoc(mode=m)) for m in ("truncate", "profile",
                                                                                         "limit")},
})

WORKFLOW_NAMES: tuple[str, ...] = tuple(cls.name for cls in WORKFLOWS)
_WRAPPED = re.compile(r"^intervention:([A-Za-z_]+)\((.*)\)$")


def policy_names() -> tuple[str, ...]:
    """Every base policy name (workflows first, then baselines)."""
    return tuple(_FACTORIES)


def canonical_name(name: str) -> str:
    """Normalize colon / ``intervention:X(P)`` forms to ``P+X`` with dotted families; no validation."""
    name = name.strip()
    m = _WRAPPED.match(name)
    if m:
        return f"{canonical_name(m.group(2))}+{m.group(1)}"
    head, *ivs = name.split("+")
    if ":" in head and "." not in head:
        head = head.replace(":", ".", 1)
    return "+".join([head, *ivs])


def make_policy(name: str, interventions: tuple[str, ...] = ()) -> Policy:
    """Build the policy called ``name`` (see the module docstring), then apply ``interventions`` in order.

    Raises `ConfigError` naming the unknown part and listing the known names."""
    base, *ivs = canonical_name(name).split("+")
    if base not in _FACTORIES:
        raise ConfigError(f"unknown policy {base!r}; known policies: {', '.join(policy_names())} "
                          "(run `bapsql policies`)")
    policy = _FACTORIES[base]()
    for iv in [*ivs, *interventions]:
        if iv not in INTERVENTIONS:
            raise ConfigError(f"unknown intervention {iv!r}; known interventions: {', '.join(INTERVENTIONS)}")
        policy = intervene(policy, iv)
    return policy
