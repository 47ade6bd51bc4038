"""Engine phases of a sweep (``workers.engine_phases``): which methods run together when a machine cannot hold every
engine at once. Pure functions over an `ExperimentConfig`; `bapsql.rollout.sweep` runs the phases."""

from __future__ import annotations

import dataclasses

from bapsql.experiment import MODEL_PREFIX, ExperimentConfig


def engine_phases(cfg: ExperimentConfig) -> list[tuple[str, ...]]:
    """The groups of methods a sweep runs one after another: with ``workers.engine_phases`` one group per engine (its
    model methods, placebo ones included, in ``methods`` order; engines in the order first named), the methods
    without an engine joining the first group; otherwise a single group of every method."""
    if not cfg.workers.engine_phases or len({cfg.engine_of(m) for m in cfg.model_methods}) < 2:
        return [tuple(cfg.methods)]
    groups: dict[str, list[str]] = {}
    for m in cfg.model_methods:
        groups.setdefault(cfg.engine_of(m), []).append(m)
    phases = [list(g) for g in groups.values()]
    phases[0] = [m for m in cfg.methods if m not in cfg.model_methods] + phases[0]
    return [tuple(p) for p in phases]


def phase_experiment(cfg: ExperimentConfig, methods: tuple[str, ...]) -> ExperimentConfig:
    """``cfg`` narrowed to ``methods`` (one of `engine_phases`): only their engines and scopes, the reference kept
    when it is among them, run as a single phase."""
    names = {cfg.engine_of(m) for m in methods if m.startswith(MODEL_PREFIX)}
    return dataclasses.replace(
        cfg, methods=tuple(methods), engines={n: e for n, e in cfg.engines.items() if n in names},
        scopes={m: s for m, s in cfg.scopes.items() if m in methods},
        reference=cfg.reference if cfg.reference in methods else None,
        workers=dataclasses.replace(cfg.workers, engine_phases=False))
