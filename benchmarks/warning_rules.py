"""How a result-token warning rule would have fared on logged evaluations: the environment's p95 rule against a
p50 rule, per method.

    python benchmarks/warning_rules.py RUN_DIR [RUN_DIR ...]

RUN_DIR: a sweep's log folder (``episodes/`` and ``turns/`` Parquet below it), e.g. a Table 2 run's
``<out>/table2-smollm2-seed0/table2/eval``. Over every execution admitted whole or truncated with a logged estimate,
a rule warns when the estimate's result-token quantile exceeds the result tokens left (the packaged ladder's
level budget less what the episode had admitted before); "bound" is a truncation by the shield.
`bapsql.analysis.diagnostics.warning_rules` does the counting. Markdown on stdout.
"""

from __future__ import annotations

import sys


def rule_rows(run_dirs: list[str]):
    """`WarningRule` per (method, quantile) over the runs' turns, against the packaged ladder."""
    from bapsql.analysis.diagnostics import warning_rules
    from bapsql.logs.reader import read_turns

    turns = read_turns(run_dirs, columns=["method", "budget", "action", "status", "result_tokens_before",
                                          "est_result_tokens_p50", "est_result_tokens_p95"])
    return warning_rules(turns)


def render(rules) -> str:
    lines = ["| method | rule | executions | warned | truncated | warned and truncated | precision % | recall % |",
             "|" + "---|" * 8]
    for r in rules:
        lines.append(f"| {r.method} | {r.quantile} > left | {r.runs} | {r.warned} | {r.bound} | {r.hits} "
                     f"| {r.precision_pct:.0f} | {r.recall_pct:.0f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    print(render(rule_rows(sys.argv[1:])))
