"""Every statistic of the report from running aggregates (`bapsql.analysis.accumulate.Aggregates`), not episodes.

`AggregateSource` is what `bapsql.analysis.analyze.summarize_source` reads (the `LogSource` protocol of
`bapsql.analysis.source`); each method equals its per-episode counterpart to floating-point tolerance:

- `cells(by)` ↔ `metrics.cell_metrics`: ratios of summed cluster channels; distinct tasks from task-key presence;
- `success_intervals` ↔ `metrics.success_intervals`: per-database success sums in sorted db-id order, resampled with
  the same `statistics.bootstrap_counts`, so the replicates are identical;
- `paired_comparisons` ↔ `comparisons.paired_comparisons`: pairs are the (database, task, seed) keys both methods
  hold at a budget, each side its key's mean success and tokens; per-(database, seed) sums go to the same
  `comparisons.compare_sums`;
- `transitions` ↔ `transitions.transition_analysis`: a task's success at a level is the majority over its episodes
  (pooled over databases when a task id repeats across them, as the per-episode pivot does);
- `coverage`, `warning_flow`, `failures`, `empty_gold` ↔ `diagnostics.*` and `diagnostics.empty_gold_summary`.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from bapsql.analysis import statistics as st
from bapsql.analysis.accumulate import CHANNELS, TURN_CHANNELS, Aggregates
from bapsql.analysis.comparisons import PairedComparison, compare_sums
from bapsql.analysis.diagnostics import QUANTITIES, Coverage, FailureCounts, WarningFlow, percent
from bapsql.analysis.metrics import COST_COLUMNS, LADDER, CellMetrics, level_key, order_levels
from bapsql.analysis.transitions import TransitionAnalysis, TransitionRow, partition_tasks, transition_counts


def _group(keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct int64 ``keys (G,)`` and the int64 sums of ``values (G, C)`` per key → ``(U,)``, ``(U, C)``."""
    uniq, inverse = np.unique(keys, return_inverse=True)
    out = np.zeros((uniq.size, values.shape[1]), np.int64)
    np.add.at(out, inverse.reshape(-1), values)
    return uniq, out


def _distinct_per(keys: np.ndarray, values: np.ndarray) -> dict[int, int]:
    """How many distinct ``values`` each key has: ``(G,)``, ``(G,)`` → key → count."""
    pairs = np.unique(np.stack([keys, values], axis=1), axis=0)
    found, counts = np.unique(pairs[:, 0], return_counts=True)
    return dict(zip(found.tolist(), counts.tolist()))


class AggregateSource:
    """The analysis' view of aggregated logs (module docstring)."""

    def __init__(self, aggregates: Aggregates, *, run_dirs: tuple[str, ...], notes: tuple[str, ...],
                 episode_files: int, turn_files: int) -> None:
        a = self.aggregates = aggregates
        self.run_dirs, self.notes = run_dirs, notes
        self.episode_files, self.turn_files = episode_files, turn_files
        self.episodes = a.episodes
        self._cm = a.combo_method[a.cluster_combo]
        self._cb = a.combo_budget[a.cluster_combo]
        self._cs = a.combo_seed[a.cluster_combo]
        self.methods = tuple(sorted({a.methods[m] for m in np.unique(self._cm).tolist()}))
        self.levels = order_levels(a.budgets[b] for b in np.unique(self._cb).tolist())
        self.databases = int(np.unique(a.cluster_db).size)
        self._combo = {(a.methods[m], a.budgets[b], a.seeds[s]): i for i, (m, b, s) in enumerate(
            zip(a.combo_method.tolist(), a.combo_budget.tolist(), a.combo_seed.tolist()))}

    # -- descriptive cells -------------------------------------------------------------------------------------
    def _present(self, combo: int) -> np.ndarray:
        """bool ``(T,)``: the tasks combo ``combo`` has episodes of."""
        n = self.aggregates.task_n[combo]
        out = np.zeros(self.aggregates.task_db.size, bool)
        out[: n.size] = n > 0
        return out

    def cells(self, by: str | None = None) -> tuple[CellMetrics, ...]:
        """`metrics.cell_metrics` from the cluster sums: per (method, budget), or per (method, budget, ``by``) with
        ``by`` in ``"db_id"``, ``"seed"``."""
        a = self.aggregates
        n_b, n_d, n_s = len(a.budgets), len(a.databases), len(a.seeds)
        key = self._cm * n_b + self._cb
        if by == "db_id":
            key = key * n_d + a.cluster_db
        elif by == "seed":
            key = key * n_s + self._cs
        elif by is not None:
            raise ValueError(f"by must be None, 'db_id' or 'seed', got {by!r}")
        groups, sums = _group(key, a.sums)
        dbs, seeds = _distinct_per(key, a.cluster_db), _distinct_per(key, self._cs)
        tasks = self._task_counts(by)
        col = {c: i for i, c in enumerate(CHANNELS)}
        cells = []
        for g, row in zip(groups.tolist(), sums):
            mb, part = (g // (n_d if by == "db_id" else n_s), g % (n_d if by == "db_id" else n_s)) if by else (g, -1)
            m, b = divmod(mb, n_b)
            n, ex_n = int(row[col["episodes"]]), int(row[col["official_ex_n"]])
            group = None if by is None else (a.databases[part] if by == "db_id" else str(a.seeds[part]))
            cells.append(CellMetrics(
                method=a.methods[m], budget=a.budgets[b], group=group, episodes=n, tasks=tasks[(m, b, part)],
                databases=dbs[g], seeds=seeds[g],
                success=100.0 * float(row[col["success"]] / n),
                official_ex=100.0 * float(row[col["official_ex"]] / ex_n) if ex_n > 0 else None,
                abstained=100.0 * float(st.ratio(row[col["abstained"]], row[col["abstained_n"]])),
                breaches=int(row[col["breach"]]), official_ex_n=ex_n,
                **{c: float(st.ratio(row[col[c]], row[col[f"{c}_n"]])) for c in COST_COLUMNS},
            ))
        return tuple(sorted(cells, key=lambda c: (c.method, level_key(c.budget), c.group or "")))

    def _task_counts(self, by: str | None) -> dict[tuple[int, int, int], int]:
        """Distinct task ids per (method code, budget code, part): part is -1 (pooled), a db code or a seed code."""
        a = self.aggregates
        by_mb: dict[tuple[int, int], list[int]] = {}
        for i, (m, b) in enumerate(zip(a.combo_method.tolist(), a.combo_budget.tolist())):
            by_mb.setdefault((m, b), []).append(i)
        n_ids = len(a.task_ids)

        def distinct_ids(present: np.ndarray) -> int:
            return int(np.count_nonzero(np.bincount(a.task_tid[present], minlength=n_ids)))

        out: dict[tuple[int, int, int], int] = {}
        for (m, b), combos in by_mb.items():
            if by == "seed":
                for i in combos:
                    out[(m, b, int(a.combo_seed[i]))] = distinct_ids(self._present(i))
                continue
            present = np.logical_or.reduce([self._present(i) for i in combos])
            if by == "db_id":  # a task is one (database, task id) pair, so distinct ids in a database = its tasks
                for d, count in enumerate(np.bincount(a.task_db[present], minlength=len(a.databases)).tolist()):
                    out[(m, b, d)] = count
            else:
                out[(m, b, -1)] = distinct_ids(present)
        return out

    def success_intervals(self, *, replicates: int, seed: int, level: float = 0.95
                          ) -> dict[tuple[str, str], tuple[float, float]]:
        """`metrics.success_intervals` from per-database success sums."""
        a = self.aggregates
        n_d = len(a.databases)
        groups, sums = _group((self._cm * len(a.budgets) + self._cb) * n_d + a.cluster_db,
                              a.sums[:, [CHANNELS.index("success"), CHANNELS.index("episodes")]])
        cells: dict[tuple[str, str], list[tuple[str, np.ndarray]]] = {}
        for g, row in zip(groups.tolist(), sums):
            m, b = divmod(g // n_d, len(a.budgets))
            cells.setdefault((a.methods[m], a.budgets[b]), []).append((a.databases[g % n_d], row))
        out: dict[tuple[str, str], tuple[float, float]] = {}
        counts_by_k: dict[int, np.ndarray] = {}
        for cell in sorted(cells):
            per_db = np.stack([row for _, row in sorted(cells[cell], key=lambda x: x[0])]).astype(np.float64)
            k = per_db.shape[0]
            if k not in counts_by_k:
                counts_by_k[k] = st.bootstrap_counts(k, replicates, seed)
            reps = st.resampled_sums(counts_by_k[k], per_db)
            out[cell] = st.percentile_interval(100.0 * st.ratio(reps[:, 0], reps[:, 1]), level)
        return out

    # -- paired comparisons and transitions --------------------------------------------------------------------
    def _key_means(self, combo: int, keys: np.ndarray | slice) -> tuple[np.ndarray, np.ndarray]:
        """Mean success and mean total tokens ``(K,)`` of a combo at task ``keys`` (``(K,)`` codes, or a slice) it
        has episodes of."""
        a = self.aggregates
        n = a.task_n[combo][keys].astype(np.float64)
        return a.task_success[combo][keys] / n, a.task_tokens[combo][keys] / n

    def _pair_sums(self, method: str, reference: str, budget: str, seeds: Sequence[int]) -> np.ndarray:
        """Per-(database, seed) sums ``(4, D, S)`` = (pairs, Σ(success_m − success_r), Σ tokens_m, Σ tokens_r) over
        the task keys both hold; D = every database code, S = ``seeds``."""
        a = self.aggregates
        n_d = len(a.databases)
        out = np.zeros((4, n_d, len(seeds)))
        for j, s in enumerate(seeds):
            cm, cr = self._combo.get((method, budget, s)), self._combo.get((reference, budget, s))
            if cm is None or cr is None:
                continue
            k = min(a.task_n[cm].size, a.task_n[cr].size)
            held = (a.task_n[cm][:k] > 0) & (a.task_n[cr][:k] > 0)
            both = slice(0, k) if held.all() else np.flatnonzero(held)  # a complete design pairs every task
            (s_m, t_m), (s_r, t_r) = self._key_means(cm, both), self._key_means(cr, both)
            db = a.task_db[both]
            for c, w in enumerate((None, s_m - s_r, t_m, t_r)):
                out[c, :, j] = np.bincount(db, weights=w, minlength=n_d)
        return out

    def paired_comparisons(self, pairs: Sequence[tuple[str, str]], *, budgets: Sequence[str],
                           replicates: int = 10_000, seed: int = 0) -> tuple[PairedComparison, ...]:
        """`comparisons.paired_comparisons` from task outcomes."""
        a = self.aggregates
        counts_by_k: dict[int, np.ndarray] = {}
        out: list[PairedComparison] = []
        db_order = np.argsort(np.asarray(a.databases, dtype=object), kind="stable")
        for budget in budgets:
            here = [(m, s) for (m, b, s) in self._combo if b == budget]
            if not here:
                continue
            methods = {m for m, _ in here}
            seed_vals = sorted({s for _, s in here})
            for method, reference in pairs:
                if method not in methods or reference not in methods:
                    continue
                sums = self._pair_sums(method, reference, budget, seed_vals)[:, db_order]
                keep_db, keep_seed = sums[0].sum(axis=1) > 0, sums[0].sum(axis=0) > 0
                if not keep_db.any():
                    continue
                sums = sums[:, keep_db][:, :, keep_seed]
                k = int(keep_db.sum())
                if k not in counts_by_k:
                    counts_by_k[k] = st.bootstrap_counts(k, replicates, seed)
                db_ids = [a.databases[d] for d in db_order[keep_db]]
                seeds_kept = [int(s) for s, keep in zip(seed_vals, keep_seed) if keep]
                quality, tokens = compare_sums(sums, db_ids, seeds_kept, counts_by_k[k])
                n_pairs = float(sums[0].sum())
                out.append(PairedComparison(
                    method=method, reference=reference, budget=budget, pairs=int(n_pairs), databases=k,
                    seeds=tuple(seeds_kept), quality=quality, tokens=tokens,
                    mean_tokens_method=float(sums[2].sum() / n_pairs),
                    mean_tokens_reference=float(sums[3].sum() / n_pairs),
                ))
        return tuple(out)

    def _ladder(self, method: str, seed: int) -> tuple[np.ndarray, np.ndarray]:
        """``(present, ok)``: bool ``(I, 4)`` over task ids × ladder levels, ``ok`` = majority success."""
        a = self.aggregates
        n_ids = len(a.task_ids)
        present = np.zeros((n_ids, len(LADDER)), bool)
        ok = present.copy()
        for j, level in enumerate(LADDER):
            combo = self._combo.get((method, level, seed))
            if combo is None:
                continue
            n, s = a.task_n[combo], a.task_success[combo]
            tid = a.task_tid[: n.size]
            n_id = np.bincount(tid, weights=n, minlength=n_ids)
            s_id = np.bincount(tid, weights=s, minlength=n_ids)
            present[:, j] = n_id > 0
            ok[:, j] = st.ratio(s_id, n_id) > 0.5
        return present, ok

    def transitions(self, method: str, reference: str) -> tuple[TransitionAnalysis, ...]:
        """`transitions.transition_analysis` from task outcomes."""
        ref_seeds = sorted({s for (m, _, s) in self._combo if m == reference})
        out = []
        for seed in sorted({s for (m, _, s) in self._combo if m == method}):
            ref_seed = seed if seed in ref_seeds else (ref_seeds[0] if len(ref_seeds) == 1 else None)
            if ref_seed is None:
                continue
            ref_present, ref_ok = self._ladder(reference, ref_seed)
            oth_present, oth_ok = self._ladder(method, seed)
            both = ref_present.all(axis=1) & oth_present.all(axis=1)
            if not both.any():
                continue
            groups = np.bincount(partition_tasks(ref_ok[both]), minlength=3)
            counts = transition_counts(ref_ok[both], oth_ok[both])
            rows = tuple(
                TransitionRow(lv, *(int(counts[k][i]) for k in ("rescued", "regressed", "additional", "net")))
                for i, lv in enumerate(LADDER)
            )
            out.append(TransitionAnalysis(method, reference, seed, ref_seed, int(both.sum()), *map(int, groups), rows))
        return tuple(out)

    # -- diagnostics -------------------------------------------------------------------------------------------
    def coverage(self) -> tuple[Coverage, ...]:
        """`diagnostics.estimator_coverage` from the turn counts."""
        col = {c: i for i, c in enumerate(TURN_CHANNELS)}
        by_method: dict[str, list[tuple[str, np.ndarray]]] = {}
        for (m, b), counts in self.aggregates.turn_counts.items():
            by_method.setdefault(m, []).append((b, counts))
        out = []
        for method in sorted(by_method):
            parts = sorted(by_method[method], key=lambda bc: level_key(bc[0]))
            slices = [(None, np.sum([c for _, c in parts], axis=0))] + parts
            for budget, c in slices:
                for q in QUANTITIES:
                    n95, h95, n50, h50 = (int(c[col[f"{q}_{k}"]]) for k in ("n95", "hit95", "n50", "hit50"))
                    censored = ((int(c[col["censored95"]]), int(c[col["censored50"]])) if q == "vm_steps"
                                else (0, 0))
                    if n95 or n50:
                        out.append(Coverage(method, budget, q, n95, 100.0 * (h95 / n95) if n95 else math.nan, n50,
                                            100.0 * (h50 / n50) if n50 else math.nan, int(c[col["stopped"]]),
                                            *censored, int(c[col["preflight_rejected"]])))
        return tuple(out)

    def _by_method_budget(self, channels: Sequence[str]) -> list[tuple[str, str, list[int]]]:
        a = self.aggregates
        groups, sums = _group(self._cm * len(a.budgets) + self._cb, a.sums[:, [CHANNELS.index(c) for c in channels]])
        rows = [(a.methods[g // len(a.budgets)], a.budgets[g % len(a.budgets)], row.tolist())
                for g, row in zip(groups.tolist(), sums)]
        return sorted(rows, key=lambda r: (r[0], level_key(r[1])))

    def warning_flow(self) -> tuple[WarningFlow, ...]:
        """`diagnostics.warning_flow` from the cluster sums."""
        out = []
        names = ("flow_n", "flow_warned", "flow_rewritten", "flow_rewritten_success", "flow_rejected",
                 "flow_rejected_success")
        for method, budget, (n, w, wr, wrs, rej, rejs) in self._by_method_budget(names):
            if n:
                out.append(WarningFlow(method, budget, n, w, wr, wrs, rej, rejs, percent(w, n), percent(wr, w),
                                       percent(wrs, wr), percent(rejs, rej)))
        return tuple(out)

    def failures(self) -> tuple[FailureCounts, ...]:
        """`diagnostics.failure_taxonomy` from the failure counts."""
        a = self.aggregates
        cells: dict[tuple[str, str], dict[str, int]] = {}
        for (combo, kind), count in a.failures.items():
            slot = cells.setdefault((a.methods[a.combo_method[combo]], a.budgets[a.combo_budget[combo]]), {})
            slot[kind] = slot.get(kind, 0) + count
        out = [FailureCounts(m, b, sum(kinds.values()), {k: v for k, v in sorted(kinds.items()) if k != ""})
               for (m, b), kinds in cells.items()]
        return tuple(sorted(out, key=lambda f: (f.method, level_key(f.budget))))

    def empty_gold(self) -> dict:
        """`diagnostics.empty_gold_summary` from the per-task gold flags and the clusters' empty-gold channels."""
        a = self.aggregates
        if not a.gold_known.any():
            return {}
        groups, sums = _group(self._cm, a.sums[:, [CHANNELS.index("empty_gold"), CHANNELS.index("empty_gold_success")]])
        success = {a.methods[m]: 100.0 * float(s / n) for m, (n, s) in zip(groups.tolist(), sums.tolist()) if n}
        return {"tasks": int(a.gold_empty.sum()), "of_tasks": int(a.gold_known.sum()),
                "episodes": int(a.channel("empty_gold").sum()), "success": dict(sorted(success.items()))}
