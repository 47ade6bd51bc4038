"""Synthetic trajectory logs with planted effects, for testing and benchmarking the analysis.

`synthetic_run(spec)` draws an episodes table and a turns table that follow `bapsql.logs.schema` exactly, with
known ground truth: method ``m`` at level ``b`` succeeds with probability ``success[m][b]`` plus a zero-mean
per-(method, database) deviation (sd ``db_sd``), so the expected pooled difference between two methods is the
difference of their planted probabilities; total tokens have mean ``tokens[m][b]`` times a per-database factor;
estimator p95 covers the actual rows / result tokens / VM steps with probability 0.95 and p50 with 0.5.
Successes of different methods on the same task are coupled (with probability ``coupling`` they share one uniform
draw), as real paired evaluations are. `write_run` writes the tables hive-partitioned by method/budget, as a run does;
`write_synthetic_run` draws and writes one method × level at a time (`synthetic_parts`), for runs larger than memory.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Mapping
from urllib.parse import quote

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bapsql.logs.schema import EPISODES_SCHEMA, FAILURE_KINDS, SCHEMA_VERSION, TURNS_SCHEMA

_Z95 = 1.6448536269514722  # standard normal 0.95 quantile


@dataclass(frozen=True)
class SyntheticSpec:
    """What to plant. ``success`` maps method → level → probability; ``tokens`` method → level → mean total
    tokens (levels absent from a method's mapping are not generated for it)."""

    success: Mapping[str, Mapping[str, float]]
    tokens: Mapping[str, Mapping[str, float]]
    n_tasks: int = 200
    n_databases: int = 11
    seeds: tuple[int, ...] = (0, 1, 2)
    db_sd: float = 0.04
    token_db_sd: float = 0.03
    coupling: float = 0.7
    turns_per_episode: float = 2.0  # mean; 0 writes no turns table
    run: str = "synthetic"
    rng_seed: int = 0
    db_weights: tuple[float, ...] = field(default_factory=tuple)  # task share per database; default uneven


def _assign_databases(spec: SyntheticSpec, rng: np.random.Generator) -> np.ndarray:
    k = spec.n_databases
    w = np.asarray(spec.db_weights, dtype=float) if spec.db_weights else rng.dirichlet(np.full(k, 4.0))
    db = rng.choice(k, size=spec.n_tasks, p=w / w.sum())
    db[:k] = np.arange(min(k, spec.n_tasks))  # every database holds at least one task
    return db


def synthetic_run(spec: SyntheticSpec) -> tuple[pa.Table, pa.Table]:
    """Draw ``(episodes, turns)`` tables in the log schema. Deterministic in ``spec`` (including ``rng_seed``)."""
    parts = list(synthetic_parts(spec))
    episodes = pa.concat_tables([e for e, _ in parts])
    turn_parts = [t for _, t in parts if t is not None]
    return episodes, pa.concat_tables(turn_parts) if turn_parts else TURNS_SCHEMA.empty_table()


def write_synthetic_run(run_dir: str | Path, spec: SyntheticSpec) -> tuple[int, int]:
    """Draw and write the run of `synthetic_run` part by part (one method × level at a time), so runs far larger
    than memory can be written; the files equal ``write_run(run_dir, *synthetic_run(spec))``. Returns the numbers of
    episodes and turns written."""
    episodes = turns = 0
    for ep, tu in synthetic_parts(spec):
        write_run(run_dir, ep, tu)
        episodes += ep.num_rows
        turns += tu.num_rows if tu is not None else 0
    return episodes, turns


def synthetic_parts(spec: SyntheticSpec) -> Iterator[tuple[pa.Table, pa.Table | None]]:
    """The ``(episodes, turns)`` of `synthetic_run`, one method × level at a time (turns None when
    ``turns_per_episode`` is 0)."""
    rng = np.random.default_rng(spec.rng_seed)
    n_t, n_s = spec.n_tasks, len(spec.seeds)
    task_db = _assign_databases(spec, rng)
    levels = sorted({lv for m in spec.success.values() for lv in m})
    # Coupled difficulty per (task, seed, level): mostly one draw per (task, seed) shared across levels.
    base_u = rng.random((n_t, n_s))
    shared_u = {lv: np.where(rng.random((n_t, n_s)) < 0.8, base_u, rng.random((n_t, n_s))) for lv in levels}
    db_token_factor = np.exp(rng.normal(0.0, 0.25, spec.n_databases))
    seeds = np.asarray(spec.seeds, dtype=np.int64)
    for method in sorted(spec.success):
        dev = rng.normal(0.0, spec.db_sd, spec.n_databases)
        tok_dev = np.exp(rng.normal(0.0, spec.token_db_sd, spec.n_databases))
        for level, p in sorted(spec.success[method].items()):
            prob = np.clip(p + dev[task_db], 0.0, 1.0)[:, None]
            u = np.where(rng.random((n_t, n_s)) < spec.coupling, shared_u[level], rng.random((n_t, n_s)))
            success = (u < prob).ravel()
            n = success.size
            tasks = np.repeat(np.arange(n_t), n_s)
            seed_col = np.tile(seeds, n_t)
            dbs = task_db[tasks]
            mean_tokens = spec.tokens[method][level] * db_token_factor[dbs] * tok_dev[dbs]
            total = np.maximum(1, np.round(mean_tokens * rng.lognormal(-0.045, 0.3, n))).astype(np.int64)
            completion = (total * 0.1).astype(np.int64)
            result_tokens = rng.poisson(40, n).astype(np.int64)
            prompt = np.maximum(total - completion - result_tokens, 0)
            warnings = (rng.random(n) < 0.5).astype(np.int64)
            rewrites = warnings * (rng.random(n) < 0.7)
            rejections = (rng.random(n) < 0.1).astype(np.int64)
            failure = np.where(success, "", rng.choice(np.asarray(FAILURE_KINDS[1:], dtype=object), n))
            abstained = np.isin(failure, ["unjustified_abstention", "justified_abstention_wrong"])
            n_turns = 1 + rng.poisson(max(spec.turns_per_episode - 1.0, 0.0), n)
            task_ids = np.asarray([f"t{t:05d}" for t in range(n_t)], dtype=object)[tasks]
            db_ids = np.asarray([f"db{d:02d}" for d in range(spec.n_databases)], dtype=object)[dbs]
            episode_ids = np.asarray([f"{method}/{level}/{s}/{t}" for s, t in zip(seed_col, task_ids)], dtype=object)
            cols = {
                "schema_version": np.full(n, SCHEMA_VERSION, np.int16), "run": np.full(n, spec.run, object),
                "episode_id": episode_ids, "group_id": episode_ids, "sample": np.zeros(n, np.int32),
                "method": np.full(n, method, object), "condition": np.full(n, method.partition("@")[2] or None, object),
                "budget": np.full(n, level, object), "seed": seed_col,
                "task_id": task_ids, "db_id": db_ids, "answer": np.full(n, None, object),
                "gold": np.full(n, None, object), "correct": success, "feasible": np.ones(n, bool),
                "success": success, "official_ex": success | (rng.random(n) < 0.15),
                "reward": success.astype(float), "evidence_score": rng.random(n),
                "queries": rng.integers(0, 3, n), "result_tokens": result_tokens,
                "vm_steps": rng.integers(1_000, 200_000, n), "turns": n_turns, "prompt_tokens": prompt,
                "completion_tokens": completion, "total_tokens": total,
                "peak_context": (prompt * 0.6).astype(np.int64), "warnings": warnings, "rewrites": rewrites,
                "rejections": rejections, "invalid_actions": np.zeros(n, np.int64), "abstained": abstained,
                "terminated": np.ones(n, bool), "truncated": np.zeros(n, bool), "breach": np.zeros(n, bool),
                "failure": failure, "policy_version": np.zeros(n, np.int64), "wall_s": rng.random(n),
            }
            episodes = pa.Table.from_pydict(cols, schema=EPISODES_SCHEMA)
            yield episodes, _turns(rng, cols, n_turns) if spec.turns_per_episode > 0 else None


def _turns(rng: np.random.Generator, ep: dict, n_turns: np.ndarray) -> pa.Table:
    """One execute_query turn per episode turn, with calibrated estimates (p95 covers 95%, p50 covers 50%)."""
    idx = np.repeat(np.arange(n_turns.size), n_turns)
    m = idx.size
    turn_no = np.arange(m) - np.repeat(np.cumsum(n_turns) - n_turns, n_turns)
    cols = {k: ep[k][idx] for k in ("method", "condition", "budget", "seed", "task_id", "db_id", "episode_id")}
    sigma = 0.8
    estimates = {}
    for name, scale in (("rows", 50.0), ("result_tokens", 120.0), ("vm_steps", 5e4)):
        p50 = np.round(scale * rng.lognormal(0.0, 1.0, m))
        actual = np.round(p50 * np.exp(sigma * rng.standard_normal(m))).astype(np.int64)
        estimates[f"est_{name}_p50"] = p50
        estimates[f"est_{name}_p95"] = p50 * np.exp(_Z95 * sigma)
        estimates[f"actual_{name}"] = actual
    zeros = np.zeros(m, np.int64)
    cols.update(
        schema_version=np.full(m, SCHEMA_VERSION, np.int16), run=ep["run"][idx], turn=turn_no.astype(np.int32),
        action=np.full(m, "execute_query", object), valid=np.ones(m, bool), sql=np.full(m, "SELECT 1", object),
        status=np.full(m, "ok", object), warning=rng.random(m) < 0.3, **estimates,
        ctx_before=zeros, ctx_after=zeros, queries_before=zeros, queries_after=zeros, result_tokens_before=zeros,
        result_tokens_after=zeros, vm_steps_before=zeros, vm_steps_after=zeros, prompt_tokens=zeros,
        completion_tokens=zeros, db_wait_s=np.zeros(m, np.float64),
    )
    # columns a synthetic run does not model (the served latency split, v3) are null, as in real unmeasured runs
    return pa.Table.from_pydict({f.name: cols[f.name] if f.name in cols else pa.nulls(m, f.type)
                                 for f in TURNS_SCHEMA}, schema=TURNS_SCHEMA)


def write_run(run_dir: str | Path, episodes: pa.Table, turns: pa.Table | None = None) -> Path:
    """Write ``episodes`` (and ``turns``) under ``run_dir`` as ``<table>/method=M/budget=B/part-0.parquet``.

    Files keep their partition columns (a reader must cope with both conventions). Returns ``run_dir``.
    """
    root = Path(run_dir)
    for name, table in (("episodes", episodes), ("turns", turns)):
        if table is None or table.num_rows == 0:
            continue
        keys = sorted(set(zip(table.column("method").to_pylist(), table.column("budget").to_pylist())))
        methods = np.asarray(table.column("method").to_pylist(), dtype=object)
        budgets = np.asarray(table.column("budget").to_pylist(), dtype=object)
        for method, budget in keys:
            part = table.filter(pa.array((methods == method) & (budgets == budget)))
            folder = root / name / f"method={quote(method, safe='')}" / f"budget={quote(budget, safe='')}"
            folder.mkdir(parents=True, exist_ok=True)
            pq.write_table(part, folder / "part-0.parquet")
    return root
