"""Valid episode and turn rows for the log tests, varied deterministically by a seed."""

from __future__ import annotations

import json
import random

from bapsql.logs.schema import ACTIONS, EPISODES_SCHEMA, FAILURE_KINDS, TURNS_SCHEMA
from bapsql.logs.writer import episode_id


def episode_row(run: str, method: str, budget: str, seed: int, task: int, *, sample: int = 0,
                nulls: bool = False) -> dict:
    """One complete episodes row (every column present); ``nulls`` sets every nullable column to None."""
    rng = random.Random(f"{run}/{method}/{budget}/{seed}/{task}/{sample}")
    correct, feasible = rng.random() < 0.5, rng.random() < 0.9
    row = {
        "run": run, "episode_id": episode_id(run, method, budget, seed, f"t{task}", sample),
        "group_id": f"t{task}/{budget}", "sample": sample, "method": method,
        "condition": method.partition("@")[2] or None, "budget": budget, "seed": seed,
        "task_id": f"t{task}", "db_id": f"db{task % 3}",
        "answer": json.dumps({"kind": "scalar", "values": [rng.randrange(10)]}),
        "gold": json.dumps({"kind": "scalar", "values": [3]}),
        "correct": correct, "feasible": feasible, "success": correct and feasible, "official_ex": rng.random() < 0.5,
        "reward": rng.random(), "evidence_score": rng.random(), "queries": rng.randrange(5),
        "result_tokens": rng.randrange(800), "vm_steps": rng.randrange(10**6), "turns": rng.randrange(1, 8),
        "prompt_tokens": rng.randrange(5000), "completion_tokens": rng.randrange(500),
        "total_tokens": rng.randrange(6000), "peak_context": rng.randrange(3000), "warnings": rng.randrange(3),
        "rewrites": rng.randrange(3), "rejections": rng.randrange(2), "invalid_actions": rng.randrange(2),
        "abstained": rng.random() < 0.1, "terminated": True, "truncated": False, "breach": False,
        "failure": "" if correct and feasible else rng.choice(FAILURE_KINDS[1:]), "policy_version": 0,
        "wall_s": rng.random() * 3,
    }
    assert set(row) | {"schema_version"} == set(EPISODES_SCHEMA.names)
    if nulls:
        row.update({f.name: None for f in EPISODES_SCHEMA if f.nullable})
    return row


def turn_rows(episode: dict, n: int | None = None, *, nulls: bool = False) -> list[dict]:
    """``n`` (default: the episode's ``turns``) complete turns rows of ``episode``."""
    rng = random.Random(episode["episode_id"])
    rows = []
    for t in range(episode["turns"] if n is None else n):
        rows.append({
            "run": episode["run"], "episode_id": episode["episode_id"], "method": episode["method"],
            "condition": episode["condition"],
            "budget": episode["budget"], "seed": episode["seed"], "task_id": episode["task_id"],
            "db_id": episode["db_id"], "turn": t, "action": rng.choice(ACTIONS), "valid": True,
            "sql": "SELECT COUNT(*) FROM singer", "status": "ok", "warning": rng.random() < 0.3,
            "est_rows_p50": 1.0, "est_rows_p95": 2.5, "est_result_tokens_p50": 4.0, "est_result_tokens_p95": 9.0,
            "est_vm_steps_p50": 100.0, "est_vm_steps_p95": 400.0, "actual_rows": 1, "actual_result_tokens": 4,
            "actual_vm_steps": 120, "ctx_before": 900 + t, "ctx_after": 950 + t, "queries_before": t,
            "queries_after": t + 1, "result_tokens_before": 4 * t, "result_tokens_after": 4 * t + 4,
            "vm_steps_before": 120 * t, "vm_steps_after": 120 * t + 120, "prompt_tokens": 900 + t,
            "completion_tokens": 40,
            "completion": ('<tool_call>\n{"name": "execute_query", "arguments": {"sql": "SELECT %d"}}\n</tool_call>'
                           % t),
            "observation": f"E{t + 1} (ok): 1 rows x 1 columns\n{t}",
        })
        if nulls:
            rows[-1].update({f.name: None for f in TURNS_SCHEMA if f.nullable})
    return rows
