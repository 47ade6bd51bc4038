"""Task mixes of the embedded benchmark: which question templates its generator tries, and in what shares its
three candidate pools fill each split (`bapsql.data.demo`); GRPO's augmented prompts follow the same template
weights (`bapsql.data.augment`), so a mix shapes training and evaluation alike.

- ``default``: the mix every result before issue 34's binding run used. Nearly every gold query fits XS's result
  tokens and VM steps (1.3 % do not at small scale), so a policy that writes the right query never meets a budget.
- ``binding``: adds long ranked lists and long filtered lists (12-20 values; `t_topk_long`, `t_list_long`) whose gold
  result outgrows XS's 80 result tokens and whose broad draft (every matching row, all columns) outgrows S's 250,
  and fills 30 % of each split from the pool whose gold exceeds XS. At XS such a task can only be abstained on; at
  S it fits only when nothing else spent the result tokens first (a peek, a broad draft); so a policy's success
  moves with the level, and with how it spends the budget, without touching the frozen ladder.

A benchmark folder records its mix in ``benchmark.json`` (absent: ``default``); the spec ``demo:<mix>`` names the
cached embedded benchmark of that mix (`bapsql.data.tasks.resolve_benchmark`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from bapsql.data.benchmark import BENCHMARK_FILE
from bapsql.errors import ConfigError

DEFAULT_MIX = "default"

# tries per (template, table) before ATTEMPT_SCALE (`bapsql.data.demo`)
_BASE_WEIGHTS = {"count_filter": 3, "count_range": 2, "agg_filter": 3, "agg_all": 1, "argmax_count": 1,
                 "argmax_avg": 1, "topk": 2, "list_filter": 2, "ordered_distinct": 1, "join_count": 5, "join_agg": 8,
                 "join_argmax": 1, "join_having": 1, "ratio": 1, "null_count": 1, "date_count": 2, "lookup": 9,
                 "count_distinct": 1, "entity_list": 4, "entity_latest": 8, "entity_parent": 9,
                 "entity_count_filter": 8, "lookup_pair": 9}


@dataclass(frozen=True)
class Mix:
    """One task mix: template weights, the pools' target shares per split, and the per-database bound on full
    (L-cap) executions of candidates whose gold exceeds XS, by scale."""

    name: str
    weights: dict[str, int]
    shares: dict[str, float]  # calm / budget_sensitive / unanswerable_xs, summing to 1
    heavy_per_db: dict[str, int]


MIXES: dict[str, Mix] = {
    "default": Mix("default", dict(_BASE_WEIGHTS),
                   {"calm": 0.57, "budget_sensitive": 0.35, "unanswerable_xs": 0.08},
                   {"small": 10, "full": 40}),
    "binding": Mix("binding", {**_BASE_WEIGHTS, "topk_long": 20, "list_long": 20},
                   {"calm": 0.4, "budget_sensitive": 0.3, "unanswerable_xs": 0.3},
                   {"small": 40, "full": 160}),
}


def mix_named(name: str) -> Mix:
    """The mix called ``name``; `ConfigError` naming the known mixes otherwise."""
    try:
        return MIXES[name]
    except KeyError:
        raise ConfigError(f"unknown task mix {name!r}; known: {sorted(MIXES)}") from None


def recorded_mix(benchmark_dir: str | Path) -> str:
    """The task mix a benchmark folder's ``benchmark.json`` records (``default`` when it records none, or for a
    BIRD / Spider folder, which has no such file)."""
    try:
        info = json.loads((Path(benchmark_dir) / BENCHMARK_FILE).read_text())
    except (OSError, ValueError):
        return DEFAULT_MIX
    return str(info.get("mix", DEFAULT_MIX)) if isinstance(info, dict) else DEFAULT_MIX
