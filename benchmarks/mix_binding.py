"""Do budgets bind under a task mix? The nine workflows and the scripted drafter on both mixes' ``test`` split at
XS-L (issue 34): Budgeted Success per level, and the share of test tasks whose gold / broad draft outgrows XS and S.

    python benchmarks/mix_binding.py [--mixes default,binding] [--split test] [--out runs/mix_binding]

Each mix's embedded benchmark comes from the cache (`demo:<mix>`, built when missing); every policy is swept with
the in-process runner (`bapsql.rollout.runner.evaluate`, seed 0) into ``OUT/<mix>/<policy>`` (rerunning resumes).
The rates come from the logged episodes, not from the call's summary, which counts only the episodes that call ran:
a resumed rerun printed 0.0 everywhere before.
Scripted policies write the oracle's SQL, so a level where one of them fails is a level where the budget, not SQL
skill, decided the episode.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

POLICIES = ("workflow.direct_aggregation", "workflow.estimate_rewrite", "workflow.drill_down",
            "workflow.evidence_compression", "workflow.justified_abstention", "workflow.schema_first",
            "workflow.verify_answer", "workflow.restore_after_archive", "workflow.recover_after_rejection",
            "scripted.drafter")
LEVELS = ("XS", "S", "M", "L")


def main(argv: list[str] | None = None) -> None:
    from bapsql.budgets import load_ladder
    from bapsql.data.measure import QueryCost
    from bapsql.data.tasks import load_tasks, resolve_benchmark
    from bapsql.logs.reader import read_episodes
    from bapsql.rollout.runner import evaluate

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mixes", default="default,binding")
    ap.add_argument("--split", default="test")
    ap.add_argument("--out", default="runs/mix_binding")
    args = ap.parse_args(argv)
    ladder = load_ladder()
    for mix in [m.strip() for m in args.mixes.split(",") if m.strip()]:
        root = resolve_benchmark(f"demo:{mix}", announce=print)
        tasks = load_tasks(root, args.split)
        costs = json.loads((root / "manifest.json").read_text())["costs"]
        over = {f"{which} > {lvl}": sum(not QueryCost.from_json(costs[t.task_id][which]).fits(ladder[lvl])
                                        for t in tasks) / len(tasks)
                for which in ("gold", "naive") for lvl in ("XS", "S")}
        print(f"\n### mix {mix}: {len(tasks)} `{args.split}` tasks; "
              + ", ".join(f"{k} {v:.1%}" for k, v in over.items()) + "\n")
        print("| policy | " + " | ".join(LEVELS) + " |\n|---|" + "---|" * len(LEVELS))
        for policy in POLICIES:
            out = Path(args.out) / mix / policy
            evaluate(root, args.split, policy, list(LEVELS), [0], out)
            eps = read_episodes(out, columns=["budget", "task_id", "success"])
            if len(eps) != len(tasks) * len(LEVELS) or eps.duplicated(["budget", "task_id"]).any():
                raise SystemExit(f"{out}: {len(eps)} logged episodes, expected {len(tasks) * len(LEVELS)} "
                                 f"(one per task and level); remove the folder and rerun")
            rate = eps.groupby("budget")["success"].mean().to_dict()
            print(f"| {policy} | " + " | ".join(f"{100 * rate[lvl]:.1f}" for lvl in LEVELS) + " |")


if __name__ == "__main__":
    main()
