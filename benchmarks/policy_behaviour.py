"""What each evaluated policy does, from its logged trajectories: one row per method × budget, levels in ladder order.

    python benchmarks/policy_behaviour.py RUN_DIR [RUN_DIR ...]

RUN_DIR: a sweep's log folder (``episodes/`` and ``turns/`` Parquet below it), e.g. a training run's
``<out>/cpu-learn-seed0/eval/logs``. Columns: episodes, Budgeted Success %, queries executed per episode, invalid
actions per episode, mean evidence score, the share of episodes that inspected the schema, the share that hit a
SQL error (an execution SQLite refused, e.g. "no such column") and, of those, the share that still succeeded; the
share whose first query-bearing action (``estimate_query`` or ``execute_query``) is an estimate, the share with a
policy-visible estimator warning and, of those, the share that rewrote, and the share with a shield rejection (a query
refused before it ran), all three from `bapsql.analysis.diagnostics.warning_flow`; of the warned queries that were
then executed as estimated, how many the shield admitted whole (`warned_executions`: "a of b"; a warning that
did not bind); of the queries an estimate said cannot run (an SQL error at the estimate), how many were then
executed anyway ("a of b"); then the failure kinds (counts).
A second table (`after_errors`) follows every estimate or execution SQLite refused (status ``error``: e.g. "no such
column") to the episode's next turn: the schema inspected, the refused query again (the same text, estimated or
executed), another query, an invalid action, an answer or abstention, something else, or none (the episode ended there).
Markdown on stdout.
"""

from __future__ import annotations

import sys
from collections import Counter


def _cells(frame) -> list:
    """``frame``'s ((method, budget), rows) groups, methods in order and levels in ladder order."""
    from bapsql.analysis.metrics import level_key

    return sorted(frame.groupby(["method", "budget"]), key=lambda kv: (kv[0][0], level_key(kv[0][1])))


def behaviour_rows(run_dirs: list[str]) -> list[dict]:
    """One dict per (method, budget) with the figures the module docstring lists."""
    from bapsql.analysis.diagnostics import percent, warned_executions, warning_flow
    from bapsql.logs.reader import read_episodes, read_turns

    eps = read_episodes(run_dirs, columns=["episode_id", "method", "budget", "success", "queries",
                                           "invalid_actions", "evidence_score", "failure", "warnings", "rewrites",
                                           "rejections"])
    turns = read_turns(run_dirs, columns=["run", "episode_id", "method", "budget", "turn", "action", "status", "sql",
                                          "warning"])
    errored = set(turns.loc[(turns["action"] == "execute_query") & (turns["status"] == "error"), "episode_id"])
    inspected = set(turns.loc[turns["action"] == "inspect_schema", "episode_id"])
    sql_turns = turns[turns["action"].isin(("estimate_query", "execute_query"))].sort_values(["episode_id", "turn"])
    first = sql_turns.groupby("episode_id", sort=False)["action"].first()
    estimated_first = set(first.index[first == "estimate_query"])
    flow = {(w.method, w.budget): w for w in warning_flow(eps)}
    warned_runs = {(w.method, w.budget): w for w in warned_executions(turns)}
    refused_runs = {(w.method, w.budget): w for w in warned_executions(turns, turns["status"] == "error")}
    rows = []
    for (method, budget), g in _cells(eps):
        err = g[g["episode_id"].isin(errored)]
        rows.append({
            "method": method, "budget": budget, "episodes": len(g), "success": 100.0 * g["success"].mean(),
            "queries": g["queries"].mean(), "invalid": g["invalid_actions"].mean(),
            "evidence": g["evidence_score"].mean(), "inspect": 100.0 * g["episode_id"].isin(inspected).mean(),
            "sql_error": 100.0 * len(err) / len(g),
            "recovered": (100.0 * err["success"].mean()) if len(err) else float("nan"),
            "estimate_first": 100.0 * g["episode_id"].isin(estimated_first).mean(),
            "warned": flow[(method, budget)].warned_pct,
            "rewrote": flow[(method, budget)].rewrite_given_warning_pct,
            "rejected": percent(flow[(method, budget)].rejected, len(g)),
            "warned_runs": warned_runs.get((method, budget)),
            "refused_runs": refused_runs.get((method, budget)),
            "failures": Counter(f for f in g["failure"] if f),
        })
    return rows


AFTER_ERROR = ("inspect_schema", "same query again", "another query", "invalid", "answer or abstain", "other", "ended")


def _next_step(sql, next_action, next_sql) -> str:
    """The `AFTER_ERROR` kind of the turn that followed a refused query (``next_action`` None: there was none)."""
    if next_action is None or next_action != next_action:  # None or NaN: the episode ended
        return "ended"
    if next_action in ("estimate_query", "execute_query"):
        return "same query again" if next_sql == sql else "another query"  # estimated or executed
    if next_action in ("inspect_schema", "invalid"):
        return next_action
    return "answer or abstain" if next_action in ("answer", "abstain") else "other"


def after_errors(turns) -> list[dict]:
    """One dict per (method, budget) with ``errors`` (estimates and executions SQLite refused) and, per
    `AFTER_ERROR` kind, how many were followed by it; only cells with an error. ``turns``: a turns table (columns
    run, episode_id, method, budget, turn, action, status, sql)."""
    turns = turns.sort_values(["run", "episode_id", "turn"]).reset_index(drop=True)
    nxt = turns.groupby(["run", "episode_id"], sort=False)[["action", "sql"]].shift(-1)
    refused = turns["action"].isin(("estimate_query", "execute_query")) & (turns["status"] == "error")
    kinds = [_next_step(q, na, nq) for q, na, nq in zip(turns.loc[refused, "sql"], nxt.loc[refused, "action"],
                                                        nxt.loc[refused, "sql"])]
    errs = turns.loc[refused, ["method", "budget"]].assign(kind=kinds)
    rows = []
    for (method, budget), g in _cells(errs):
        counts = Counter(g["kind"])
        rows.append({"method": method, "budget": budget, "errors": len(g), **{k: counts.get(k, 0) for k in AFTER_ERROR}})
    return rows


def render_after_errors(rows: list[dict]) -> str:
    lines = ["| method | budget | refused queries | " + " | ".join(f"then {k}" for k in AFTER_ERROR) + " |",
             "|" + "---|" * (3 + len(AFTER_ERROR))]
    lines += [f"| {r['method']} | {r['budget']} | {r['errors']} | " + " | ".join(str(r[k]) for k in AFTER_ERROR) + " |"
              for r in rows]
    return "\n".join(lines)


def render(rows: list[dict]) -> str:
    head = ("| method | budget | episodes | success % | queries / ep | invalid / ep | evidence | inspect % "
            "| SQL error % | of those succeeded % | estimate first % | warned % | of those rewrote % | rejected % "
            "| warned queries run: admitted whole | refused estimates: then run | failures |")
    lines = [head, "|" + "---|" * 17]
    for r in rows:
        fails = ", ".join(f"{k} {v}" for k, v in r["failures"].most_common())
        wr = r["warned_runs"]
        whole = "—" if wr is None or not wr.executed else f"{wr.admitted_whole} of {wr.executed}"
        rr = r["refused_runs"]
        refused = "—" if rr is None else f"{rr.executed} of {rr.flagged}"
        lines.append(f"| {r['method']} | {r['budget']} | {r['episodes']} | {r['success']:.1f} | {r['queries']:.2f} "
                     f"| {r['invalid']:.2f} | {r['evidence']:.2f} | {r['inspect']:.0f} | {r['sql_error']:.0f} "
                     f"| {r['recovered']:.0f} | {r['estimate_first']:.0f} | {r['warned']:.0f} | {r['rewrote']:.0f} "
                     f"| {r['rejected']:.0f} | {whole} | {refused} | {fails} |")
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    print(render(behaviour_rows(sys.argv[1:])))
    print()
    from bapsql.logs.reader import read_turns

    print(render_after_errors(after_errors(read_turns(sys.argv[1:], columns=[
        "run", "episode_id", "method", "budget", "turn", "action", "status", "sql"]))))
