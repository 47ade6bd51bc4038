"""Aggregates of finished episodes: per (method, budget) cells, the monitor's live metrics, sample rows.

Pure functions over episodes-table rows (dicts), shared by the driver (live W&B metrics, its result) and the sweep
summary. Metric names: ``success/<method>/<budget>`` (Budgeted Success rate), ``tokens/…`` (mean total tokens),
``queries/…``, ``result_tokens/…``, ``vm_steps/…`` (mean spend of each budget channel), ``throughput/…`` and
``progress/…``.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Sequence


@dataclass(frozen=True)
class CellStats:
    """Aggregates of one (method, budget) cell over the episodes this run played."""

    method: str
    budget: str
    episodes: int
    successes: int
    mean_total_tokens: float
    mean_queries: float
    mean_result_tokens: float
    mean_vm_steps: float
    invalid_actions: int
    breaches: int

    @property
    def success_rate(self) -> float:
        return self.successes / self.episodes if self.episodes else 0.0


def cell_stats(rows: Sequence[dict]) -> tuple[CellStats, ...]:
    """Per (method, budget) aggregates of episode rows, in first-seen order of methods and ladder order of levels."""
    from bapsql.budgets import LEVELS

    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for r in rows:
        groups[(r["method"], r["budget"])].append(r)
    methods = list(dict.fromkeys(r["method"] for r in rows))
    order = {lv: i for i, lv in enumerate(LEVELS)}
    out = []
    for (m, b), rs in sorted(groups.items(), key=lambda kv: (methods.index(kv[0][0]), order.get(kv[0][1], 99),
                                                               kv[0][1])):
        n = len(rs)
        mean = (lambda k: sum(r[k] for r in rs) / n)  # noqa: E731
        out.append(CellStats(m, b, n, sum(bool(r["success"]) for r in rs), mean("total_tokens"), mean("queries"),
                             mean("result_tokens"), mean("vm_steps"), sum(r["invalid_actions"] for r in rs),
                             sum(bool(r["breach"]) for r in rs)))
    return tuple(out)


def monitor_metrics(rows: Sequence[dict], *, done: int, total: int, elapsed_s: float, generated: int,
                    reruns: int) -> dict[str, float]:
    """The live metrics of a sweep after ``done`` of ``total`` episodes (see the module docstring)."""
    elapsed = max(elapsed_s, 1e-9)
    metrics: dict[str, float] = {"progress/episodes": done, "progress/total": total,
                                 "throughput/episodes_per_s": done / elapsed,
                                 "throughput/generated_tokens_per_s": generated / elapsed, "faults/reruns": reruns}
    for c in cell_stats(rows):
        p = f"{c.method}/{c.budget}"
        metrics.update({f"success/{p}": c.success_rate, f"tokens/{p}": c.mean_total_tokens,
                        f"queries/{p}": c.mean_queries, f"result_tokens/{p}": c.mean_result_tokens,
                        f"vm_steps/{p}": c.mean_vm_steps})
    return metrics


def sample_row(t: Any) -> dict:
    """One row of the monitor's sample-trajectory table: who played what, how it went, the actions taken."""
    e = t.episode
    return {"method": e["method"], "budget": e["budget"], "task_id": e["task_id"], "db_id": e["db_id"],
            "success": bool(e["success"]), "turns": int(e["turns"]), "total_tokens": int(e["total_tokens"]),
            "actions": " > ".join(r["action"] for r in t.turns), "answer": e["answer"] or ""}
