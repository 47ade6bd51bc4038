"""benchmarks/warning_rules.py: the p50 and p95 result-token warning rules scored on a real sweep's Parquet."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import warning_rules  # noqa: E402


def test_the_rules_are_scored_on_every_logged_execution(runs):
    from bapsql.budgets import load_ladder
    from bapsql.logs.reader import read_turns

    rules = {(r.method, r.quantile): r for r in warning_rules.rule_rows(runs)}
    assert {q for _, q in rules} == {"p50", "p95"}
    ladder = load_ladder()
    turns = read_turns(runs)
    for (method, q), r in rules.items():  # the reference: one execution at a time
        warned = bound = hits = n = 0
        for _, t in turns[turns["method"] == method].iterrows():
            est = t[f"est_result_tokens_{q}"]
            if t["action"] != "execute_query" or t["status"] not in ("ok", "truncated") or est != est:
                continue
            n += 1
            w = est > ladder[t["budget"]].result_tokens - t["result_tokens_before"]
            b = t["status"] == "truncated"
            warned, bound, hits = warned + w, bound + b, hits + (w and b)
        assert (r.runs, r.warned, r.bound, r.hits) == (n, warned, bound, hits) and n > 0
    table = warning_rules.render(list(rules.values()))
    assert table.count("\n") == len(rules) + 1 and "precision %" in table
