"""Policy names → policies. One naming scheme, used by the CLI, the runner and the ``method`` column of the logs.

A policy name is ``<family>.<policy>`` (``workflow.estimate_rewrite``, ``scripted.drafter``); the colon form
``workflow:estimate_rewrite`` is accepted and normalized (`canonical_name`). A *method* is a policy under a
condition, ``POLICY@CONDITION`` (`bapsql.env.conditions`): the condition is an environment setting, so `make_policy`
builds only the policy part and `split_method` / `canonical_method` handle the label. Names are path-safe (they are
Parquet partition values). `policy_names()` lists every scripted policy.
"""

from __future__ import annotations

from typing import Callable

from bapsql.env.conditions import condition, method_name, split_method
from bapsql.errors import ConfigError
from bapsql.policies.base import Policy
from bapsql.policies.drafter import Drafter
from bapsql.policies.workflows import SFT_ONLY, WORKFLOWS

_FACTORIES: dict[str, Callable[[], Policy]] = {cls.name: cls for cls in WORKFLOWS + SFT_ONLY}
_FACTORIES[Drafter.name] = Drafter

WORKFLOW_NAMES: tuple[str, ...] = tuple(cls.name for cls in WORKFLOWS)


def policy_names() -> tuple[str, ...]:
    """Every scripted policy name (workflows first, then the drafter)."""
    return tuple(_FACTORIES)


def canonical_name(name: str) -> str:
    """Normalize the colon form to the dotted one (``workflow:x`` → ``workflow.x``, ``model:tiny`` →
    ``model.tiny``); no validation."""
    name = name.strip()
    if ":" in name and "." not in name.split("@")[0]:
        name = name.replace(":", ".", 1)
    return name


def canonical_method(method: str) -> str:
    """``P`` or ``P@C`` → the canonical ``P@C`` label (the condition validated; ``full`` when none is given)."""
    policy, cond = split_method(canonical_name(method))
    return method_name(policy, condition(cond))


def make_policy(name: str) -> Policy:
    """Build the scripted policy called ``name`` (a method label's condition part is ignored here: the runner gives
    it to the environment). Raises `ConfigError` naming the unknown policy and listing the known names."""
    base = split_method(canonical_name(name))[0]
    if base not in _FACTORIES:
        raise ConfigError(f"unknown policy {base!r}; known policies: {', '.join(policy_names())} "
                          "(run `bapsql policies`)")
    return _FACTORIES[base]()
