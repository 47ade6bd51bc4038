"""Test helpers: hand-made trajectory-log rows in the real schema, and the paper's Table 2."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from bapsql.logs.schema import EPISODES_SCHEMA, SCHEMA_VERSION, TURNS_SCHEMA

LADDER = ("XS", "S", "M", "L")

# Paper Table 2: method → (XS, S, M, L) Budgeted Success (%) and the printed Frontier Score (pp).
PAPER_TABLE2: dict[str, tuple[tuple[float, float, float, float], float]] = {
    "Raw agent": ((17.9, 19.1, 19.7, 19.9), 19.2),
    "Dashboard": ((17.7, 17.6, 17.4, 19.0), 17.8),
    "Adaptive post-hoc": ((26.0, 29.2, 31.5, 33.5), 30.2),
    "BAP-SQL SFT": ((31.4, 34.0, 36.2, 37.5), 34.9),
    "SQL-RL (matched)": ((32.2, 35.2, 38.7, 40.4), 36.7),
    "Context-only RL": ((32.3, 35.0, 37.0, 38.0), 35.7),
    "BACM-RL (adapted)": ((33.4, 36.0, 38.2, 39.4), 36.9),
    "BAP-SQL RL": ((34.8, 37.6, 39.2, 39.0), 37.9),
}

_EPISODE_DEFAULTS: dict[str, Any] = {
    "schema_version": SCHEMA_VERSION, "run": "test", "group_id": "g", "sample": 0, "seed": 0, "db_id": "db0",
    "answer": None, "gold": None, "correct": False, "feasible": True, "success": False, "official_ex": None,
    "reward": 0.0, "evidence_score": 0.0, "queries": 1, "result_tokens": 10, "vm_steps": 100, "turns": 2,
    "prompt_tokens": 80, "completion_tokens": 20, "total_tokens": 110, "peak_context": 60, "warnings": 0,
    "rewrites": 0, "rejections": 0, "invalid_actions": 0, "abstained": False, "terminated": True,
    "truncated": False, "breach": False, "failure": "", "policy_version": 0, "wall_s": 0.1,
}

_TURN_DEFAULTS: dict[str, Any] = {
    "schema_version": SCHEMA_VERSION, "run": "test", "seed": 0, "task_id": "t0", "db_id": "db0", "turn": 0,
    "action": "execute_query", "valid": True, "sql": "SELECT 1", "status": "ok", "warning": False,
    "est_rows_p50": None, "est_rows_p95": None, "est_result_tokens_p50": None, "est_result_tokens_p95": None,
    "est_vm_steps_p50": None, "est_vm_steps_p95": None, "actual_rows": None, "actual_result_tokens": None,
    "actual_vm_steps": None, "ctx_before": 0, "ctx_after": 0, "queries_before": 0, "queries_after": 0,
    "result_tokens_before": 0, "result_tokens_after": 0, "vm_steps_before": 0, "vm_steps_after": 0,
    "prompt_tokens": 0, "completion_tokens": 0,
}


def episodes_table(rows: list[dict[str, Any]]) -> pa.Table:
    """Rows with at least method, budget, task_id → an EPISODES_SCHEMA table (defaults fill the rest;
    ``correct`` follows ``success`` unless given, ``episode_id`` is derived)."""
    full = []
    for i, r in enumerate(rows):
        row = {**_EPISODE_DEFAULTS, **r}
        if "correct" not in r:
            row["correct"] = row["success"]
        row.setdefault("episode_id", f"{row['method']}/{row['budget']}/{row['seed']}/{row['task_id']}/{i}")
        full.append(row)
    return pa.Table.from_pylist(full, schema=EPISODES_SCHEMA)


def turns_table(rows: list[dict[str, Any]]) -> pa.Table:
    """Rows with at least method, budget → a TURNS_SCHEMA table."""
    full = []
    for i, r in enumerate(rows):
        row = {**_TURN_DEFAULTS, **r}
        row.setdefault("episode_id", f"e{i}")
        full.append(row)
    return pa.Table.from_pylist(full, schema=TURNS_SCHEMA)
