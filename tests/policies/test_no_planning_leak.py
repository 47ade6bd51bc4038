"""Issue 30, item 2: under a words-only preflight (no_planning) no text a policy sees or is trained to write holds an
estimate figure."""

from __future__ import annotations

import pyarrow.parquet as pq

from bapsql.policies.sft_export import export_sft
from bapsql.tokens import DEFAULT_TOKENIZER_DIR


def test_no_planning_abstention_targets_hold_no_estimate_figure(minibench, mini_tasks, tmp_path):
    """Issue 30, item 2: under no_planning (words-only preflight) a preflight-rejected query followed by a justified
    abstention leaks no digit of the shield's estimate into any observation or SFT target."""
    import dataclasses
    import re

    from bapsql.budgets import load_ladder
    from bapsql.env.episode import BudgetedSQLEnv
    from bapsql.env.handles import DatabaseHandles
    from bapsql.env.records import EnvOptions
    from bapsql.policies.registry import make_policy
    from bapsql.rollout.runner import play_episode
    from bapsql.tokens import HFTokenCounter
    from bapsql.types import Answer

    heavy = "SELECT COUNT(*) FROM orders a, customers b WHERE a.amount > b.id"  # ~600k row pairs: > XS's VM steps
    task = dataclasses.replace(mini_tasks["shop-00"], task_id="shop-heavy", gold_sql=heavy, naive_sql=heavy,
                               gold=Answer("scalar", (0,)), tags=("unanswerable_xs",))
    counter = HFTokenCounter(DEFAULT_TOKENIZER_DIR)
    with DatabaseHandles(counter) as handles:  # the episode itself: the shield's estimate is in its records
        env = BudgetedSQLEnv(token_counter=counter, handles=handles, options=EnvOptions().under("no_planning"))
        texts = []
        summary = play_episode(env, make_policy("workflow.justified_abstention"), task, load_ladder()["XS"], 0,
                               on_turn=lambda msgs, text, info: texts.extend(
                                   [text, info.get("message") or "", *(m["content"] for m in msgs)]))
        records = env.turn_records
    assert summary.abstained and summary.failure == "justified_abstention_wrong"
    rejected = [r for r in records if r.action == "execute_query" and r.status == "rejected"]
    assert rejected and rejected[0].est_vm_steps_p50 > load_ladder()["XS"].vm_steps
    figures = {f"{v:,.0f}" for r in rejected for v in (r.est_vm_steps_p50, r.est_vm_steps_p95)}
    figures |= {f.replace(",", "") for f in figures}
    res = export_sft(minibench, "train", 50, tmp_path / "np.parquet", workflows=("workflow.justified_abstention",),
                     budgets=("XS",), condition="no_planning", tasks=[task])
    rows = pq.read_table(res.path).to_pylist()
    assert res.pairs >= 2 and any("abstain" in r["completion"] for r in rows)
    for text in texts + [r["prompt"] + r["completion"] for r in rows]:
        found = {f for f in figures if re.search(rf"(?<![\d,]){re.escape(f)}(?![\d,])", text)}
        assert not found, f"estimate figure(s) {found} in {text[-300:]!r}"
