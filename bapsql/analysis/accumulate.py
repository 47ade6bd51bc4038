"""Running aggregates of trajectory logs: each record batch is grouped and folded in, then dropped (issue 33).

Nothing the analysis reports needs an episode itself. `EpisodeAccumulator.add(batch)` folds a normalised episodes
batch (columns `EPISODE_INPUT`; ``method`` already carries its condition, ``empty_gold`` is the parsed flag) into

- **cluster sums**: per (method, budget, seed, database) cluster, int64 sums of every metric and its non-null
  count (`CHANNELS`) — Budgeted Success, Official EX, abstention, breaches, the cost means, the warning flow and the
  empty-gold successes are ratios of these, and the database-cluster bootstrap resamples them;
- **task outcomes**: per (method, budget, seed) *combo* and task — a task is a (database, task id) pair — the
  episodes, successes and summed total tokens of the key, in dense per-combo vectors over task codes that widen
  their integer type only when a value needs it (uint8 → uint16 → uint32 → int64). Paired comparisons pair these
  keys across methods; transitions read a task's majority success; distinct-task counts read their presence;
- **failure counts** per (combo, failure kind) and per-task empty-gold flags.

`TurnAccumulator.add(batch)` folds turns (columns `TURN_INPUT`) into estimator-coverage counts per (method, budget)
(`turn_counts` gives a batch's per-turn indicators, with the semantics of `bapsql.analysis.diagnostics`).
Memory is O(clusters + combos × tasks) whatever the number of episodes; `finish()` returns the frozen
`Aggregates` the statistics read (`bapsql.analysis.from_aggregates`). Strings and key tuples become int codes
through `bapsql.analysis.codes`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Mapping

import numpy as np
import pyarrow as pa

from bapsql.analysis.codes import (
    GrowingRows,
    IntCodes,
    Vocabulary,
    WideningCounts,
    column,
    equals,
    factorize,
    group_sums,
    numbers,
)
from bapsql.analysis.diagnostics import QUANTITIES
from bapsql.analysis.metrics import COST_COLUMNS

EPISODE_INPUT: tuple[str, ...] = (
    "method", "budget", "seed", "db_id", "task_id", "success", "official_ex", "abstained", "breach", *COST_COLUMNS,
    "warnings", "rewrites", "rejections", "failure", "empty_gold",
)
TURN_INPUT: tuple[str, ...] = (
    "method", "budget", "action", "status", *(f"est_{q}_p{p}" for q in QUANTITIES for p in (50, 95)),
    *(f"actual_{q}" for q in QUANTITIES), "vm_steps_after",
)
# Per-cluster int64 sums: `<metric>` sums the metric over rows where it is logged, `<metric>_n` counts those rows.
CHANNELS: tuple[str, ...] = (
    "episodes", "success", "official_ex", "official_ex_n", "abstained", "abstained_n", "breach",
    *(name for c in COST_COLUMNS for name in (c, f"{c}_n")),
    "flow_n", "flow_warned", "flow_rewritten", "flow_rewritten_success", "flow_rejected", "flow_rejected_success",
    "empty_gold", "empty_gold_success",
)
# Per-(method, budget) turn counts: per quantity the p95 / p50 denominators and hits, then the VM-step cap counts.
TURN_CHANNELS: tuple[str, ...] = (
    *(f"{q}_{k}" for q in QUANTITIES for k in ("n95", "hit95", "n50", "hit50")),
    "stopped", "censored95", "censored50", "preflight_rejected",
)


def channel_values(batch: pa.RecordBatch, success: np.ndarray) -> Iterator[np.ndarray | None]:
    """Each row's value of every one of `CHANNELS`, in that order, as ``(N,)`` arrays (None: 1 for every row),
    yielded one at a time so that a batch's channels are never all in memory at once."""
    yield None
    yield success
    for name in ("official_ex", "abstained"):
        v = numbers(column(batch, name))
        yield np.nan_to_num(v)
        yield ~np.isnan(v)
    yield np.nan_to_num(numbers(column(batch, "breach")))
    for name in COST_COLUMNS:
        v = numbers(column(batch, name))
        yield np.nan_to_num(v)
        yield ~np.isnan(v)
    w, rw, rj = (numbers(column(batch, c)) for c in ("warnings", "rewrites", "rejections"))
    flow = ~(np.isnan(w) | np.isnan(rw) | np.isnan(rj))
    warned, rejected = flow & (w > 0), flow & (rj > 0)
    rewritten = warned & (rw > 0)
    yield from (flow, warned, rewritten, rewritten & success, rejected, rejected & success)
    empty = numbers(column(batch, "empty_gold")) > 0
    yield from (empty, empty & success)


@dataclass(frozen=True)
class Aggregates:
    """Everything the analysis reads, with shapes: ``C`` combos (method, budget, seed), ``T`` tasks (database, task
    id), ``G`` clusters (combo, database). Codes index the vocabularies ``methods``, ``budgets``, ``seeds``,
    ``databases`` and ``task_ids``."""

    methods: tuple[str, ...]
    budgets: tuple[str, ...]
    seeds: tuple[int, ...]
    databases: tuple[str, ...]
    task_ids: tuple[str, ...]
    combo_method: np.ndarray  # (C,) method code of each combo
    combo_budget: np.ndarray  # (C,)
    combo_seed: np.ndarray  # (C,) seed code
    task_db: np.ndarray  # (T,) database code of each task
    task_tid: np.ndarray  # (T,) task-id code of each task
    cluster_combo: np.ndarray  # (G,)
    cluster_db: np.ndarray  # (G,)
    sums: np.ndarray  # (G, len(CHANNELS)) int64
    task_n: tuple[np.ndarray, ...]  # C vectors (≤ T each; absent tail = 0): episodes per task key
    task_success: tuple[np.ndarray, ...]  # C vectors: successes per task key
    task_tokens: tuple[np.ndarray, ...]  # C vectors: summed total tokens per task key
    failures: Mapping[tuple[int, str], int]  # (combo, failure kind) → episodes; "" = success
    gold_known: np.ndarray  # (T,) bool: some episode of the task logs its gold
    gold_empty: np.ndarray  # (T,) bool: some episode of the task logs an empty gold
    turn_counts: Mapping[tuple[str, str], np.ndarray]  # (method, budget) → (len(TURN_CHANNELS),) int64
    episodes: int

    def channel(self, name: str) -> np.ndarray:
        """One channel of the cluster sums: int64 ``(G,)``."""
        return self.sums[:, CHANNELS.index(name)]


class EpisodeAccumulator:
    """Folds normalised episode batches into running aggregates (module docstring)."""

    def __init__(self) -> None:
        self.methods, self.budgets, self.databases = Vocabulary(), Vocabulary(), Vocabulary()
        self.task_ids, self.failure_kinds = Vocabulary(), Vocabulary()
        self.seeds = IntCodes()  # key: the seed
        self.combos = IntCodes()  # key: (method << 42) | (budget << 21) | seed code
        self.tasks = IntCodes()  # key: (db << 31) | task-id code
        self.clusters = IntCodes()  # key: (combo << 24) | db
        self.sums = GrowingRows(len(CHANNELS))
        self.task_rows: list[tuple[WideningCounts, WideningCounts, WideningCounts]] = []
        self.failures: dict[tuple[int, str], int] = {}
        self.gold_known = np.zeros(0, bool)
        self.gold_empty = np.zeros(0, bool)
        self.episodes = 0

    def add(self, batch: pa.RecordBatch) -> None:
        """Fold one batch with the `EPISODE_INPUT` columns (strings plain or dictionary-encoded)."""
        n = batch.num_rows
        if n == 0:
            return
        method = self.methods.codes(column(batch, "method"))
        budget = self.budgets.codes(column(batch, "budget"))
        seed = self.seeds.codes(column(batch, "seed").cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False))
        combo, combos, combo_row = self.combos.joint([method, budget, seed], (21, 21, 21))
        db = self.databases.codes(column(batch, "db_id"))
        task, _, _ = self.tasks.joint([db, self.task_ids.codes(column(batch, "task_id"))], (32, 31))
        success = numbers(column(batch, "success")) > 0
        tokens = np.nan_to_num(numbers(column(batch, "total_tokens")))
        self._add_clusters(batch, combo, db, success)
        self._add_tasks(combos, combo_row, task, success, tokens)
        self._add_failures(batch, combos, combo_row)
        self._add_gold(batch, task)
        self.episodes += n

    def _add_clusters(self, batch: pa.RecordBatch, combo: np.ndarray, db: np.ndarray, success: np.ndarray) -> None:
        _, clusters, inverse = self.clusters.joint([combo, db], (39, 24))
        sums = group_sums(inverse, clusters.size, channel_values(batch, success))
        self.sums.add(clusters, sums, self.clusters.keys.size)

    def _add_tasks(self, combos: np.ndarray, combo_row: np.ndarray, task: np.ndarray, success: np.ndarray,
                   tokens: np.ndarray) -> None:
        """Task-key sums: ``combos (K,)`` the batch's combo codes, ``combo_row (N,)`` each row's index into them."""
        n_tasks = self.tasks.keys.size
        uniq, inverse = factorize(combo_row * n_tasks + task)
        sums = np.rint(group_sums(inverse, uniq.size, [None, success, tokens]))
        local, key_task = np.divmod(uniq, n_tasks)
        while len(self.task_rows) < self.combos.keys.size:
            self.task_rows.append((WideningCounts(), WideningCounts(), WideningCounts()))
        bounds = np.flatnonzero(np.diff(local)) + 1  # uniq is sorted, so each combo is one run
        for part in np.split(np.arange(uniq.size), bounds):
            row = self.task_rows[int(combos[local[part[0]]])]
            for counts, values in zip(row, sums[part].T):
                counts.add(key_task[part], values, n_tasks)

    def _add_failures(self, batch: pa.RecordBatch, combos: np.ndarray, combo_row: np.ndarray) -> None:
        failure = column(batch, "failure")
        logged = failure.is_valid().to_numpy(zero_copy_only=False)
        if not logged.any():
            return
        kind = self.failure_kinds.codes(failure)
        n_kinds = len(self.failure_kinds.values)
        keys, inverse = factorize(combo_row[logged] * n_kinds + kind[logged])
        for key, count in zip(keys.tolist(), np.bincount(inverse).tolist()):
            slot = (int(combos[key // n_kinds]), self.failure_kinds.values[key % n_kinds])
            self.failures[slot] = self.failures.get(slot, 0) + count

    def _add_gold(self, batch: pa.RecordBatch, task: np.ndarray) -> None:
        n_tasks = self.tasks.keys.size
        if self.gold_known.size < n_tasks:
            self.gold_known = np.concatenate([self.gold_known, np.zeros(n_tasks - self.gold_known.size, bool)])
            self.gold_empty = np.concatenate([self.gold_empty, np.zeros(n_tasks - self.gold_empty.size, bool)])
        flag = numbers(column(batch, "empty_gold"))
        self.gold_known[task[~np.isnan(flag)]] = True
        self.gold_empty[task[flag > 0]] = True

    def finish(self, turns: "TurnAccumulator | None" = None) -> Aggregates:
        """The frozen aggregates (with the turn counts of ``turns``, when given)."""
        combos, tasks, clusters = self.combos.keys, self.tasks.keys, self.clusters.keys
        n_tasks = tasks.size

        def rows(i: int) -> tuple[np.ndarray, ...]:
            return tuple(r[i].values[:n_tasks] for r in self.task_rows)

        return Aggregates(
            methods=tuple(self.methods.values), budgets=tuple(self.budgets.values),
            seeds=tuple(int(s) for s in self.seeds.keys), databases=tuple(self.databases.values),
            task_ids=tuple(self.task_ids.values),
            combo_method=combos >> 42, combo_budget=(combos >> 21) & ((1 << 21) - 1),
            combo_seed=combos & ((1 << 21) - 1),
            task_db=tasks >> 31, task_tid=tasks & ((1 << 31) - 1),
            cluster_combo=clusters >> 24, cluster_db=clusters & ((1 << 24) - 1),
            sums=self.sums.table[: clusters.size].copy(),
            task_n=rows(0), task_success=rows(1), task_tokens=rows(2),
            failures=dict(self.failures),
            gold_known=self.gold_known[:n_tasks].copy(), gold_empty=self.gold_empty[:n_tasks].copy(),
            turn_counts=turns.counts() if turns is not None else {},
            episodes=self.episodes,
        )


def turn_counts(execute: np.ndarray, truncated: np.ndarray, rejected: np.ndarray, estimates: Mapping[str, np.ndarray],
                actuals: Mapping[str, np.ndarray], vm_steps_after: np.ndarray, level_steps: np.ndarray
                ) -> Iterator[np.ndarray]:
    """Per-turn bool indicators ``(N,)`` of every one of `TURN_CHANNELS`, in order, for estimator coverage (the
    semantics of `bapsql.analysis.diagnostics.estimator_coverage`), yielded one at a time.

    ``execute``, ``truncated``, ``rejected``: bool ``(N,)``, whether the action is ``execute_query`` and the shield
    status ``truncated`` / ``rejected``; ``estimates["<q>_p95"|"<q>_p50"]`` and ``actuals[q]``: float64 ``(N,)``
    with NaN where null; ``vm_steps_after``: float64 ``(N,)``; ``level_steps``: float64 ``(N,)``, the VM-step budget
    of the turn's level (NaN when not a known level). A run the VM-step cap stopped is a miss where its estimate
    was below the cap and left out (censored) where it was not.
    """
    has_est = np.zeros(execute.size, bool)
    for q in QUANTITIES:
        has_est |= ~np.isnan(estimates[f"{q}_p95"])
    steps = actuals["vm_steps"]
    stopped = execute & truncated & np.isnan(actuals["rows"]) & ~np.isnan(steps)
    spent = np.nan_to_num(steps)
    before_run = vm_steps_after - spent
    cap = np.where(~np.isnan(level_steps) & ~np.isnan(before_run), level_steps - before_run, spent)
    censored = []
    for q in QUANTITIES:
        for p in (95, 50):
            est = estimates[f"{q}_p{p}"]
            actual = actuals[q]
            if q == "vm_steps":
                miss = stopped & (est < cap)
                actual = np.where(miss, np.inf, np.where(stopped, np.nan, actual))
                censored.append(stopped & (est >= cap))
            valid = ~np.isnan(actual) & np.isfinite(est)
            yield valid
            yield valid & (actual <= est)
    yield stopped
    yield from censored
    yield execute & rejected & has_est


class TurnAccumulator:
    """Folds normalised turn batches (`TURN_INPUT`) into coverage counts per (method, budget)."""

    def __init__(self, vm_step_budgets: Mapping[str, int]) -> None:
        self.level_steps = {str(k): float(v) for k, v in vm_step_budgets.items()}
        self.methods, self.budgets = Vocabulary(), Vocabulary()
        self.groups = IntCodes()  # key: (method << 21) | budget
        self.rows = GrowingRows(len(TURN_CHANNELS))

    def add(self, batch: pa.RecordBatch) -> None:
        """Fold one batch with the `TURN_INPUT` columns (strings plain or dictionary-encoded)."""
        if batch.num_rows == 0:
            return
        method = self.methods.codes(column(batch, "method"))
        budget = self.budgets.codes(column(batch, "budget"))
        steps_of = np.array([self.level_steps.get(b, np.nan) for b in self.budgets.values], dtype=np.float64)
        status = column(batch, "status")
        estimates = {f"{q}_p{p}": numbers(column(batch, f"est_{q}_p{p}")) for q in QUANTITIES for p in (50, 95)}
        actuals = {q: numbers(column(batch, f"actual_{q}")) for q in QUANTITIES}
        _, uniq, inverse = self.groups.joint([method, budget], (21, 21))
        indicators = turn_counts(equals(column(batch, "action"), "execute_query"), equals(status, "truncated"),
                                 equals(status, "rejected"), estimates, actuals,
                                 numbers(column(batch, "vm_steps_after")), steps_of[budget])
        sums = group_sums(inverse, uniq.size, indicators)
        self.rows.add(uniq, sums, self.groups.keys.size)

    def counts(self) -> dict[tuple[str, str], np.ndarray]:
        """(method, budget) → its ``(len(TURN_CHANNELS),)`` int64 counts."""
        keys = self.groups.keys
        return {(self.methods.values[k >> 21], self.budgets.values[k & ((1 << 21) - 1)]): self.rows.table[i].copy()
                for i, k in enumerate(keys.tolist())}
