"""Split a method − reference Budgeted Success gain by the aggregate each question asks for (issue 30).

    python benchmarks/aggregate_gain.py runs/conditions --benchmark demo_small --split dev \
        --method scripted.drafter@adaptive_posthoc --reference scripted.drafter@dashboard --budgets XS,S

Reads the runs' episodes (`bapsql.analysis.load.load_runs`), classes every task from its gold SQL and typed answer
(`bapsql.data.aggregates.aggregate_kind`: count, min/max, avg, mode, list, other) and prints, per budget and pooled
over the given budgets, each class's success for both methods and its contribution (pp) to the overall gain
(`bapsql.analysis.aggregates.gain_by_aggregate`; the contributions sum to the gain).
"""

from __future__ import annotations

import argparse


def main(argv: list[str] | None = None) -> None:
    from bapsql.analysis.aggregates import gain_by_aggregate, gain_table, task_kinds
    from bapsql.analysis.load import load_runs
    from bapsql.data.tasks import load_tasks, resolve_benchmark

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", help="run folders holding episodes/**/*.parquet")
    ap.add_argument("--benchmark", required=True, help="the benchmark the runs played (demo, a folder, BIRD/Spider)")
    ap.add_argument("--split", default="dev")
    ap.add_argument("--method", required=True)
    ap.add_argument("--reference", required=True)
    ap.add_argument("--budgets", default="XS,S,M,L", help="comma-separated levels (each, then pooled)")
    args = ap.parse_args(argv)
    kinds = task_kinds(load_tasks(resolve_benchmark(args.benchmark), args.split))
    episodes = load_runs(args.runs).episodes
    budgets = [b.strip() for b in args.budgets.split(",") if b.strip()]
    for title, levels in [*((b, [b]) for b in budgets), *([("pooled " + "/".join(budgets), budgets)]
                                                         if len(budgets) > 1 else [])]:
        rows = gain_by_aggregate(episodes, kinds, args.method, args.reference, budgets=levels)
        print(f"\n### {title}\n\n{gain_table(rows, args.method, args.reference)}")


if __name__ == "__main__":
    main()
