"""Estimator and behaviour diagnostics: p95/p50 coverage, warning → rewrite → success, rejection recovery, failures.

- Coverage (turns table): for rows, result tokens and VM steps, the share of turns with ``actual <= estimate``
  among turns where both are present, for the p95 and the p50 estimate, per method (pooled over budgets) and per
  method × budget. A run the VM-step cap stopped (``status`` truncated, no row count) cost more than its cap: for
  VM steps it is a miss when the estimate was below the cap (the cap: the level's VM-step budget, when known, less
  what was spent before the run; else the steps it spent, a lower bound) and unknown — left out, counted in
  ``censored_*`` — when the estimate was above it; its rows and result tokens are unknown. Preflight-rejected
  queries (executions refused before running, with a logged estimate) never ran: counted apart
  (``preflight_rejected``), never in coverage.
- Warning flow (episodes table), per method × budget: share of episodes with at least one policy-visible warning;
  of those, the share with at least one rewrite; of warned-and-rewritten episodes, the success share; and the
  success share of episodes with at least one shield preflight rejection ("recovery"). Descriptive frequencies.
- Warned executions (turns table), per method × budget: what happened when a policy executed the very query an
  estimate had warned on: admitted whole (status ok: the warning was a false alarm for this budget), truncated,
  rejected, or failed. Says whether rewriting every warned query would have paid.
- Warning rules (turns table), per method: over the executions that ran with a logged estimate, how a rule "warn
  when the estimate's result-token quantile exceeds the result tokens left" would have fared against what the
  shield then did (truncated = the result tokens bound): warned, bound, warned and bound. Compares the p95 rule
  the environment uses with a p50 rule on logs already written.
- Failure taxonomy (episodes ``failure`` column): counts per kind per method × budget (successes excluded).
- Empty gold (`empty_gold_summary`): the tasks whose logged gold answer is empty, and success on them.
Columns another system's logs lack (null) leave the rows out of the diagnostic that needs them.
Percentages are NaN when their denominator is zero.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
import pandas as pd

from bapsql.analysis.metrics import level_key

QUANTITIES: tuple[str, ...] = ("rows", "result_tokens", "vm_steps")  # turns columns actual_<q>, est_<q>_p50/p95


def coverage(actual: np.ndarray, estimate: np.ndarray) -> tuple[int, float]:
    """``(n, percent)``: how many ``(N,)`` pairs have both values present, and the percent with actual ≤ estimate.
    An actual of +inf (a run known to exceed any estimate) counts as a miss; NaN leaves the pair out."""
    a = np.asarray(actual, dtype=np.float64)
    e = np.asarray(estimate, dtype=np.float64)
    mask = ~np.isnan(a) & np.isfinite(e)
    n = int(mask.sum())
    return n, (100.0 * float((a[mask] <= e[mask]).mean()) if n else math.nan)


@dataclass(frozen=True)
class Coverage:
    """Estimator coverage of one quantity for a method (``budget`` None = pooled over budgets), in percent.
    ``stopped``: executions the VM-step cap stopped; ``censored_p95`` / ``censored_p50``: those whose VM-step estimate
    was above the cap (unknown, left out); ``preflight_rejected``: executions refused before running."""

    method: str
    budget: str | None
    quantity: str
    n_p95: int
    p95: float
    n_p50: int
    p50: float
    stopped: int = 0
    censored_p95: int = 0
    censored_p50: int = 0
    preflight_rejected: int = 0


def ladder_budgets(channel: str) -> dict[str, int]:
    """Level → the packaged ladder's (XS–L) budget of ``channel`` (e.g. ``vm_steps``, ``result_tokens``)."""
    from bapsql.budgets import LEVELS, load_ladder

    ladder = load_ladder()
    return {lv: getattr(ladder[lv], channel) for lv in LEVELS}


def _stopped_actual(frame: pd.DataFrame, estimate: np.ndarray, caps: np.ndarray, stopped: np.ndarray) -> np.ndarray:
    """VM-step actuals with the cap-stopped runs replaced: +inf (a miss) where the estimate is below the cap, NaN
    (unknown, left out) where it is not. ``(N,)`` arrays in, ``(N,)`` out."""
    actual = frame["actual_vm_steps"].astype("float64").to_numpy().copy()
    miss = stopped & (estimate < caps)
    actual[miss] = np.inf
    actual[stopped & ~miss] = np.nan
    return actual


def _column(frame: pd.DataFrame, name: str, dtype: str = "float64") -> pd.Series:
    return frame[name].astype(dtype) if name in frame else pd.Series(np.nan, index=frame.index, dtype=dtype)


def estimator_coverage(turns: pd.DataFrame, vm_step_budgets: Mapping[str, int] | None = None) -> tuple[Coverage, ...]:
    """Coverage per method (pooled) and per method × budget for every quantity that has any estimate (module
    docstring). ``vm_step_budgets``: level → VM-step budget (a cap-stopped run's cap comes from it; None: the
    packaged ladder's XS–L); levels not in it use the steps the run spent as the cap."""
    budgets = dict(ladder_budgets("vm_steps") if vm_step_budgets is None else vm_step_budgets)
    status = turns["status"].astype(object) if "status" in turns else pd.Series(None, index=turns.index, dtype=object)
    execute = turns["action"].astype(object) == "execute_query"
    has_est = turns[[f"est_{q}_p95" for q in QUANTITIES]].notna().any(axis=1)
    stopped_all = (execute & (status == "truncated") & turns["actual_rows"].isna()
                   & turns["actual_vm_steps"].notna()).to_numpy()
    rejected_all = (execute & (status == "rejected") & has_est).to_numpy()
    spent = _column(turns, "actual_vm_steps").fillna(0.0)
    total = pd.Series([budgets.get(str(b), np.nan) for b in turns["budget"]], index=turns.index, dtype="float64")
    before_run = _column(turns, "vm_steps_after") - spent  # spent before the run (its probe included)
    cap_all = (total - before_run).where(total.notna() & before_run.notna(), spent).to_numpy()
    out = []
    for method, by_method in turns.groupby("method", sort=True):
        by_budget = sorted(by_method.groupby("budget"), key=lambda bg: level_key(str(bg[0])))
        slices = [(None, by_method)] + [(str(b), g) for b, g in by_budget]
        for budget, frame in slices:
            pos = turns.index.get_indexer(frame.index)
            stopped, rejected, caps = stopped_all[pos], rejected_all[pos], cap_all[pos]
            for quantity in QUANTITIES:
                est95 = frame[f"est_{quantity}_p95"].astype("float64").to_numpy()
                est50 = frame[f"est_{quantity}_p50"].astype("float64").to_numpy()
                censored = (0, 0)
                if quantity == "vm_steps":
                    a95, a50 = (_stopped_actual(frame, e, caps, stopped) for e in (est95, est50))
                    censored = (int((stopped & (est95 >= caps)).sum()), int((stopped & (est50 >= caps)).sum()))
                else:
                    a95 = a50 = frame[f"actual_{quantity}"].astype("float64").to_numpy()
                n95, c95 = coverage(a95, est95)
                n50, c50 = coverage(a50, est50)
                if n95 or n50:
                    out.append(Coverage(str(method), budget, quantity, n95, c95, n50, c50, int(stopped.sum()),
                                        *censored, int(rejected.sum())))
    return tuple(out)


def percent(num: int, den: int) -> float:
    """``100 · num / den``; NaN when ``den`` is 0."""
    return 100.0 * num / den if den else math.nan


@dataclass(frozen=True)
class WarningFlow:
    """Warning → rewrite → success and rejection-recovery counts and percentages for one method × budget."""

    method: str
    budget: str
    episodes: int
    warned: int
    warned_rewritten: int
    warned_rewritten_success: int
    rejected: int
    rejected_success: int
    warned_pct: float  # of episodes
    rewrite_given_warning_pct: float  # of warned
    success_given_rewrite_pct: float  # of warned and rewritten
    recovery_pct: float  # of rejected


def warning_flow(episodes: pd.DataFrame) -> tuple[WarningFlow, ...]:
    """`WarningFlow` per (method, budget), over the episodes that log warnings, rewrites and rejections (logs of
    other systems may lack them: those cells are left out)."""
    episodes = episodes.dropna(subset=["warnings", "rewrites", "rejections"])
    df = pd.DataFrame(
        {
            "method": episodes["method"],
            "budget": episodes["budget"],
            "n": 1,
            "w": episodes["warnings"] > 0,
            "wr": (episodes["warnings"] > 0) & (episodes["rewrites"] > 0),
            "rej": episodes["rejections"] > 0,
        }
    )
    success = episodes["success"].astype(bool)
    df["wrs"] = df["wr"] & success
    df["rejs"] = df["rej"] & success
    agg = df.groupby(["method", "budget"], sort=True)[["n", "w", "wr", "wrs", "rej", "rejs"]].sum()
    out = []
    for (method, budget), r in agg.iterrows():
        n, w, wr, wrs, rej, rejs = (int(r[c]) for c in ("n", "w", "wr", "wrs", "rej", "rejs"))
        out.append(
            WarningFlow(
                str(method), str(budget), n, w, wr, wrs, rej, rejs,
                percent(w, n), percent(wr, w), percent(wrs, wr), percent(rejs, rej),
            )
        )
    return tuple(sorted(out, key=lambda w: (w.method, level_key(w.budget))))


@dataclass(frozen=True)
class WarnedExecutions:
    """What became of the flagged estimates' queries, for one method × budget: ``flagged`` such (episode, SQL) pairs
    (by default the estimates with a policy-visible warning; `warned_executions` can pick others); ``executed`` of
    them run later in the episode as estimated (the first such run counts); ``statuses``: that run's status → count
    (``ok``: admitted whole, so a warning did not bind)."""

    method: str
    budget: str
    flagged: int
    executed: int
    statuses: Mapping[str, int]

    @property
    def admitted_whole(self) -> int:
        """Warned queries executed as estimated and admitted whole (status ``ok``)."""
        return self.statuses.get("ok", 0)

    @property
    def whole_pct(self) -> float:
        """Of the warned queries executed as estimated, the percent admitted whole."""
        return percent(self.admitted_whole, self.executed)


def warned_executions(turns: pd.DataFrame, flagged: pd.Series | None = None) -> tuple[WarnedExecutions, ...]:
    """`WarnedExecutions` per (method, budget) over a turns table (columns run, episode_id, method, budget, turn,
    action, sql, status, warning); cells without a warned estimate are left out. A query is the same when its text
    is (a rewrite is a different query: its turn is ``rewrite_query``, never counted here). ``flagged``: a boolean
    Series over ``turns`` picking other estimates to follow instead of the warned ones, e.g. ``turns["status"] ==
    "error"``: estimates that said the query cannot run."""
    cols = ["run", "episode_id", "sql"]
    picked = (turns["warning"] if flagged is None else flagged).fillna(False).astype(bool)
    est = turns[(turns["action"] == "estimate_query") & picked]
    est = est.sort_values("turn").drop_duplicates(cols)[cols + ["method", "budget", "turn"]]
    runs = turns.loc[turns["action"] == "execute_query", cols + ["turn", "status"]]
    later = est.merge(runs, on=cols, suffixes=("", "_run"))
    later = later[later["turn_run"] > later["turn"]].sort_values("turn_run").drop_duplicates(cols)  # the first run
    pairs = est.merge(later[cols + ["turn_run", "status"]], on=cols, how="left")  # turn_run NaN: never run after
    out = []
    for (method, budget), g in pairs.groupby(["method", "budget"], sort=True):
        ran = g[g["turn_run"].notna()]
        statuses = {str(k): int(v) for k, v in sorted(ran["status"].fillna("none").value_counts().items())}
        out.append(WarnedExecutions(str(method), str(budget), len(g), len(ran), statuses))
    return tuple(sorted(out, key=lambda w: (w.method, level_key(w.budget))))


@dataclass(frozen=True)
class WarningRule:
    """How "warn when est_result_tokens_<quantile> > result tokens left" fares on one method's executions:
    ``runs`` executions admitted whole or truncated with a logged estimate; ``warned`` that the rule flags;
    ``bound`` the shield truncated; ``hits`` both. Precision = hits / warned, recall = hits / bound (percent)."""

    method: str
    quantile: str
    runs: int
    warned: int
    bound: int
    hits: int

    @property
    def precision_pct(self) -> float:
        return percent(self.hits, self.warned)

    @property
    def recall_pct(self) -> float:
        return percent(self.hits, self.bound)


def warning_rules(turns: pd.DataFrame, result_tokens: Mapping[str, int] | None = None,
                  quantiles: tuple[str, ...] = ("p50", "p95")) -> tuple[WarningRule, ...]:
    """`WarningRule` per (method, quantile). ``result_tokens``: level → the level's result-token budget (None: the
    packaged ladder's XS–L); what is left at a turn is that less ``result_tokens_before`` (the shield's admissible
    figure can be lower still, when the context is the tighter limit, so "bound" counts every truncation). Levels
    not in ``result_tokens`` and executions refused before running (rejected, error) are left out."""
    result_tokens = dict(ladder_budgets("result_tokens") if result_tokens is None else result_tokens)
    runs = turns[(turns["action"] == "execute_query") & turns["status"].isin(("ok", "truncated"))
                 & turns["budget"].isin(list(result_tokens))]
    left = runs["budget"].map(result_tokens).astype("float64") - runs["result_tokens_before"].astype("float64")
    bound = runs["status"] == "truncated"
    out = []
    for q in quantiles:
        est = runs[f"est_result_tokens_{q}"].astype("float64")
        known = est.notna()
        warned = est > left
        for method, idx in runs[known].groupby("method", sort=True).groups.items():
            w, b = warned.loc[idx], bound.loc[idx]
            out.append(WarningRule(str(method), q, len(idx), int(w.sum()), int(b.sum()), int((w & b).sum())))
    return tuple(sorted(out, key=lambda r: (r.method, r.quantile)))


@dataclass(frozen=True)
class FailureCounts:
    """Failure kinds of one method × budget: ``counts`` maps kind → episodes (successes, kind "", excluded)."""

    method: str
    budget: str
    episodes: int
    counts: Mapping[str, int]


def failure_taxonomy(episodes: pd.DataFrame) -> tuple[FailureCounts, ...]:
    """`FailureCounts` per (method, budget); kinds appear as logged (unknown kinds are kept, not dropped). Episodes
    without a logged failure kind (null) are left out, and so are cells with none."""
    out = []
    for (method, budget), g in episodes.dropna(subset=["failure"]).groupby(["method", "budget"], sort=True):
        kinds = g.loc[g["failure"] != "", "failure"].value_counts()
        out.append(FailureCounts(str(method), str(budget), len(g), {str(k): int(v) for k, v in sorted(kinds.items())}))
    return tuple(sorted(out, key=lambda f: (f.method, level_key(f.budget))))


def empty_gold_summary(episodes: Any) -> dict[str, Any]:
    """Tasks whose logged gold answer is empty (``[]`` is correct there without evidence): ``tasks`` of
    ``of_tasks`` (distinct (database, task) pairs with a logged gold), and Budgeted Success (%) per method on their
    episodes; {} when no episode logs its gold."""
    if "empty_gold" not in episodes or episodes["empty_gold"].isna().all():
        return {}
    known = episodes[episodes["empty_gold"].notna()]
    flagged = known[known["empty_gold"].astype(bool)]
    pairs = lambda f: {(str(d), str(t)) for d, t in zip(f["db_id"], f["task_id"])}  # noqa: E731
    success = {str(m): 100.0 * float(g["success"].astype(float).mean())
               for m, g in flagged.groupby("method", sort=True)}
    return {"tasks": len(pairs(flagged)), "of_tasks": len(pairs(known)), "episodes": len(flagged),
            "success": success}
