"""Test helpers: hand-made trajectory-log rows in the real schema, and the paper's Table 2."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
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


def _nullable(schema: pa.Schema) -> pa.Schema:
    return pa.schema([f.with_nullable(True) for f in schema])


def episodes_table(rows: list[dict[str, Any]], *, nullable: bool = False) -> pa.Table:
    """Rows with at least method, budget, task_id → an EPISODES_SCHEMA table (defaults fill the rest;
    ``correct`` follows ``success`` unless given, ``episode_id`` is derived). ``nullable``: every column may hold
    nulls (what other systems may write)."""
    full = []
    for i, r in enumerate(rows):
        row = {**_EPISODE_DEFAULTS, **r}
        if "correct" not in r:
            row["correct"] = row["success"]
        row.setdefault("episode_id", f"{row['method']}/{row['budget']}/{row['seed']}/{row['task_id']}/{i}")
        full.append(row)
    return pa.Table.from_pylist(full, schema=_nullable(EPISODES_SCHEMA) if nullable else EPISODES_SCHEMA)


def turns_table(rows: list[dict[str, Any]], *, nullable: bool = False) -> pa.Table:
    """Rows with at least method, budget → a TURNS_SCHEMA table."""
    full = []
    for i, r in enumerate(rows):
        row = {**_TURN_DEFAULTS, **r}
        row.setdefault("episode_id", f"e{i}")
        full.append(row)
    return pa.Table.from_pylist(full, schema=_nullable(TURNS_SCHEMA) if nullable else TURNS_SCHEMA)


# -- random logs for the aggregates-vs-episodes property tests ----------------------------------------------------

GOLDS = (None, '{"kind": "list", "values": []}', '{"kind": "scalar", "values": []}',
         '{"kind": "list", "values": [[1]]}', "not json")
OPTIONAL_EPISODE_COLUMNS = ("official_ex", "abstained", "peak_context", "warnings", "rewrites", "rejections",
                            "failure", "gold", "condition", "schema_version", "breach", "sample", "run")


def random_rows(rng: np.random.Generator) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Random episode and turn rows: 1–3 methods (one labelled ``@x``, one whose rows may log a condition), some
    budgets of the ladder and a probe level, 1–3 seeds, 1–4 databases, task ids that may repeat across databases,
    0/1/2/4 episodes per (method, budget, seed, task) — so per-key means are dyadic and sums exact — and nulls in
    every nullable column."""
    methods = list(rng.choice(["a", "b@x", "c"], size=int(rng.integers(1, 4)), replace=False))
    levels = list(LADDER) if rng.random() < 0.5 else list(rng.choice([*LADDER, "probe"], int(rng.integers(1, 5)),
                                                                      replace=False))
    seeds = list(rng.choice([0, 1, 7], size=int(rng.integers(1, 4)), replace=False))
    n_db = int(rng.integers(1, 5))
    tasks = [(f"t{i}", f"d{int(rng.integers(n_db))}") for i in range(int(rng.integers(1, 9)))]
    if rng.random() < 0.3:  # a task id in a second database
        tasks.append((tasks[0][0], f"d{(int(tasks[0][1][1:]) + 1) % n_db}"))
    rows, turns = [], []
    for m in methods:
        for b in levels:
            for s in seeds:
                for t, d in tasks:
                    for k in range(int(rng.choice([0, 1, 1, 2, 4]))):
                        ok = bool(rng.random() < 0.5)
                        cond = rng.choice([None, "", "x", "y"]) if m == "c" or rng.random() < 0.1 else None
                        row = dict(method=m, condition=cond, budget=b, seed=int(s), task_id=t, db_id=d, sample=k,
                                   success=ok, correct=ok, total_tokens=int(rng.integers(1, 5000)),
                                   queries=int(rng.integers(0, 4)), result_tokens=int(rng.integers(0, 300)),
                                   vm_steps=int(rng.integers(0, 10**6)), turns=int(rng.integers(1, 6)),
                                   breach=bool(rng.random() < 0.05), gold=GOLDS[int(rng.integers(len(GOLDS)))])
                        for name, value in (("official_ex", bool(rng.random() < 0.5)),
                                            ("abstained", bool(rng.random() < 0.2)),
                                            ("peak_context", int(rng.integers(0, 9000))),
                                            ("warnings", int(rng.integers(0, 3))),
                                            ("rewrites", int(rng.integers(0, 3))),
                                            ("rejections", int(rng.integers(0, 3))),
                                            ("failure", "" if ok else str(rng.choice(["out_of_turns", "new_kind"])))):
                            row[name] = None if rng.random() < 0.2 else value
                        rows.append(row)
                        for i in range(int(rng.integers(0, 3))):
                            turns.append(_random_turn(rng, row, i))
    if not rows:
        rows.append(dict(method=methods[0], budget=levels[0], seed=int(seeds[0]), task_id="t0", db_id="d0",
                         success=True))
    return rows, turns


def _random_turn(rng: np.random.Generator, episode: dict[str, Any], i: int) -> dict[str, Any]:
    def maybe(value: float) -> float | None:
        return None if rng.random() < 0.25 else value

    turn = {k: episode[k] for k in ("method", "condition", "budget", "seed", "task_id", "db_id")}
    turn.update(turn=i, action=str(rng.choice(["execute_query", "execute_query", "inspect_schema"])),
                status=rng.choice(["ok", "truncated", "rejected", None]),
                vm_steps_after=int(rng.integers(0, 300_000)))
    for q, scale in (("rows", 50.0), ("result_tokens", 100.0), ("vm_steps", 200_000.0)):
        p50 = float(rng.integers(0, int(scale)))
        turn[f"est_{q}_p50"], turn[f"est_{q}_p95"] = maybe(p50), maybe(2.0 * p50)
        turn[f"actual_{q}"] = None if rng.random() < 0.25 else int(rng.integers(0, int(2.5 * scale)))
    return turn


def write_random_run(rng: np.random.Generator, run: Path, rows: list[dict[str, Any]],
                     turns: list[dict[str, Any]], layout: str) -> None:
    """Write the rows as ``hive`` (write_run: partition folders, partition columns kept), ``dataset``
    (pq.write_to_dataset: partition columns only in the folder names) or ``flat`` (a few unpartitioned files, each
    lacking some optional columns, one maybe from a newer schema)."""
    import pyarrow.parquet as pq

    from bapsql.analysis.synthetic import write_run

    episodes = episodes_table(rows, nullable=True)
    turn_table = turns_table(turns, nullable=True) if turns else None
    if layout == "hive":
        write_run(run, episodes, turn_table)
        return
    if layout == "dataset":
        pq.write_to_dataset(episodes, run / "episodes", partition_cols=["method", "budget"])
        if turn_table is not None:
            pq.write_to_dataset(turn_table, run / "turns", partition_cols=["method", "budget"])
        return
    (run / "episodes").mkdir(parents=True)
    cuts = sorted(rng.integers(0, episodes.num_rows + 1, size=2).tolist())
    for i, (lo, hi) in enumerate(zip([0, *cuts], [*cuts, episodes.num_rows])):
        part = episodes.slice(lo, hi - lo)
        drop = [c for c in OPTIONAL_EPISODE_COLUMNS if rng.random() < 0.3]
        part = part.drop_columns(drop)
        if "schema_version" in part.column_names and rng.random() < 0.2:
            part = part.set_column(0, "schema_version", pa.array([SCHEMA_VERSION + 1] * part.num_rows, pa.int16()))
        pq.write_table(part, run / "episodes" / f"part-{i}.parquet")
    if turn_table is not None:
        (run / "turns").mkdir(parents=True)
        pq.write_table(turn_table.drop_columns(["vm_steps_after", "status"] if rng.random() < 0.3 else []),
                       run / "turns" / "part-0.parquet")


def assert_same_numbers(new: Any, old: Any, path: str = "") -> None:
    """Two JSON documents are equal, floats to 1e-9 (relative or absolute)."""
    if isinstance(new, dict):
        assert isinstance(old, dict) and list(new) == list(old), (path, list(new), list(old))
        for key in new:
            assert_same_numbers(new[key], old[key], f"{path}/{key}")
    elif isinstance(new, list):
        assert isinstance(old, list) and len(new) == len(old), (path, new, old)
        for i, (a, b) in enumerate(zip(new, old)):
            assert_same_numbers(a, b, f"{path}[{i}]")
    elif isinstance(new, float) or isinstance(old, float):
        assert isinstance(old, (int, float)) and math.isclose(new, old, rel_tol=1e-9, abs_tol=1e-9), (path, new, old)
    else:
        assert new == old, (path, new, old)
