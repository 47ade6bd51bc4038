"""The embedded benchmark: `build_demo` generates its databases and tasks into a benchmark folder.

Contract:
- Same ``(scale, seed)`` → the same bytes in every file (databases, tasks, splits, manifest), with any number of
  worker processes; timings only go into the returned `DemoBuild`, never into files. ``benchmark.json`` is written
  last, so a folder that has it is complete.
- Each database is built from its `bapsql.data.synth_domains` spec; drafts come from `bapsql.data.synth_tasks`
  templates. Every gold query is executed read-only through `bapsql.db.sandbox.Sandbox` and typed by
  `bapsql.data.gold`; drafts whose result is empty, flagged (ties, too large), NULL, a zero count, a list of more
  than `MAX_LIST` values or a duplicate question are dropped (generation-time filtering, counted in the manifest).
- Gold and naive queries are measured (`bapsql.data.measure`) and tagged: ``budget_sensitive`` (the naive query
  exceeds the XS budget's result tokens or VM steps, the gold query fits both), ``unanswerable_xs`` (the gold query
  alone exceeds XS), ``min_level:<L>`` (tightest level whose result-token and VM-step budgets the gold query fits),
  ``template:<name>``, ``answer:<kind>``, and ``evidence`` / ``dirty`` / ``join``. The final tasks are a seeded draw
  from the three pools (calm / budget-sensitive / XS-unanswerable) in the task mix's shares, split by split.
- The task mix (`bapsql.data.mixes`; ``default`` unless asked) sets the template weights and the pools' shares;
  a non-default mix is recorded in ``benchmark.json`` as ``mix``.
- Databases are split train / validation / dev by `bapsql.data.splits.split_databases` (seeded) with
  `DEMO_FRACTIONS`: of the 14 databases, 7 train, 1 validation, 6 dev at every scale and seed (so database-cluster
  statistics over the dev split have six clusters). Each split draws its own number of tasks (`TASKS`), so the
  dev split stays small enough for the main job (72 tasks at ``small`` scale) while train keeps most of them; the
  in-domain ``test`` split (held-out tasks of the train databases) is `bapsql.data.splits.is_test_task`.
"""

from __future__ import annotations

import hashlib
import os
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable

import numpy as np

from bapsql.budgets import load_ladder
from bapsql.data.benchmark import (BENCHMARK_FILE, FORMAT_VERSION, MANIFEST_FILE, SPLITS_FILE, TASKS_FILE,
                                   json_text, sha256_file, write_json, write_json_text, write_tasks)
from bapsql.data.measure import QueryCost, measure, measurement_token_counter
from bapsql.data.mixes import DEFAULT_MIX, Mix, mix_named
from bapsql.data.splits import split_databases, split_of
from bapsql.data.synth_domains import DOMAINS
from bapsql.data.synth_schema import SCALES, Domain, build_database, domain_seed
from bapsql.data.synth_tasks import Draft, propose
from bapsql.data.synth_values import DbView
from bapsql.errors import ConfigError
from bapsql.types import Answer, Task

GENERATOR_VERSION = "2.0"  # 2.0: fourteen databases, 6 dev, per-split task counts
DEMO_NAME = "bapsql-demo"

# Tries per (template, table) = the mix's weight × ATTEMPT_SCALE (`bapsql.data.mixes`). The candidates that survive
# execution fall in three pools ("calm": gold and naive fit XS; "budget_sensitive"; "unanswerable_xs") and
# TASKS[scale][split] tasks are drawn from each split's pools in the mix's shares (as far as each pool allows); the
# mix's heavy_per_db bounds the full (L-cap) executions of heavy candidates per database.
ATTEMPT_SCALE = {"small": 1, "full": 4}
TASKS = {"small": {"train": 300, "validation": 40, "dev": 72},
         "full": {"train": 1_500, "validation": 200, "dev": 500}}
DEMO_FRACTIONS: tuple[float, float, float] = (0.45, 0.1, 0.45)  # train / validation / dev databases
DIFFICULTY = {
    "simple": ("count_filter", "count_range", "agg_all", "null_count", "date_count", "lookup", "lookup_pair",
               "entity_parent"),
    "moderate": ("agg_filter", "argmax_count", "topk", "list_filter", "ordered_distinct", "ratio", "count_distinct",
                 "entity_list", "entity_latest", "entity_count_filter", "topk_long", "list_long"),
    "challenging": ("argmax_avg", "join_count", "join_agg", "join_argmax", "join_having"),
}
MAX_LIST = 20


@dataclass(frozen=True)
class DemoBuild:
    """What `build_demo` wrote: the folder, counts, the measured shares and the wall time."""

    root: Path
    databases: int
    tasks: int
    dropped_drafts: int
    shares: dict[str, float]
    seconds: float


def _difficulty(template: str, tags: tuple[str, ...]) -> str:
    level = next(k for k, v in DIFFICULTY.items() if template in v)
    if level == "simple" and ("evidence" in tags or "dirty" in tags):
        return "moderate"
    return level


def _valid(d: Draft, answer: Answer) -> bool:
    if answer.kind == "scalar":
        v = answer.values[0]
        return v is not None and not (d.gold_sql.startswith("SELECT COUNT(") and v == 0)
    return 1 <= len(answer.values) <= MAX_LIST and (answer.kind != "ordered_list" or len(answer.values) >= 2)


@lru_cache(maxsize=1)
def _ladder():
    return load_ladder()


def _candidate(domain: Domain, d: Draft, g, naive: QueryCost, pool: str) -> dict:
    ladder = _ladder()
    gold = QueryCost(g.rows_total, g.result_tokens, g.vm_steps, False, False)
    fits = [b.level for b in ladder.budgets if gold.fits(b)]
    tags = [f"template:{d.template}", f"answer:{g.answer.kind}", *d.tags, f"min_level:{fits[0] if fits else 'none'}"]
    if pool != "calm":
        tags.append(pool)
    return {"pool": pool, "db_id": domain.db_id, "question": d.question, "gold_sql": d.gold_sql,
            "gold": g.answer.to_json(), "evidence": d.evidence, "difficulty": _difficulty(d.template, d.tags),
            "tags": sorted(tags), "naive_sql": d.naive_sql, "costs": {"gold": gold.to_json(), "naive": naive.to_json()}}


def _build_one(domain: Domain, root: str, scale: str, seed: int, counter_spec: str, mix: Mix) -> dict:
    """Build one database and execute its drafts (runs in a worker process). Returns JSON-able candidates.

    Gold queries run first under the XS VM cap (cheap). Those that fit XS are 'calm' or 'budget_sensitive' by
    whether the naive query fits XS too; heavier ones are executed in full (L cap), at most the mix's heavy_per_db
    of them.
    """
    from bapsql.data.gold import derive_gold
    from bapsql.db.sandbox import Sandbox
    from bapsql.tokens import load_token_counter

    counter = load_token_counter(counter_spec)
    ladder = _ladder()
    xs, s, top = ladder["XS"], ladder["S"], ladder.budgets[-1]
    path = Path(root) / _rel(domain.db_id)
    sizes = build_database(domain, path, scale, seed)
    rng = np.random.default_rng(domain_seed(seed, domain.db_id) + 1)
    view = DbView(path, domain)
    try:
        drafts = propose(view, rng, {k: v * ATTEMPT_SCALE[scale] for k, v in mix.weights.items()})
    finally:
        view.close()
    seen: set[str] = set()
    out: list[tuple[int, dict]] = []
    heavy: list[tuple[int, Draft]] = []
    naive_memo: dict[str, QueryCost] = {}

    def naive_cost(sb, sql: str) -> QueryCost:
        if sql not in naive_memo:
            naive_memo[sql] = measure(sb, sql, counter, vm_step_cap=s.vm_steps + 1, token_limit=s.result_tokens)
        return naive_memo[sql]

    with Sandbox(path) as sb:
        for i, d in enumerate(drafts):
            key = _norm(d.question)
            if key in seen:
                continue
            seen.add(key)
            g = derive_gold(sb, d.gold_sql, token_counter=counter, vm_step_cap=xs.vm_steps + 1)
            if g.interrupted or (g.ok and g.result_tokens > xs.result_tokens):
                heavy.append((i, d))
            elif g.ok and not g.flags and _valid(d, g.answer):
                naive = naive_cost(sb, d.naive_sql)
                out.append((i, _candidate(domain, d, g, naive, "calm" if naive.fits(xs) else "budget_sensitive")))
        kept = 0
        for j in rng.permutation(len(heavy)).tolist():
            if kept >= mix.heavy_per_db[scale]:
                break
            i, d = heavy[j]
            g = derive_gold(sb, d.gold_sql, token_counter=counter, vm_step_cap=top.vm_steps + 1)
            if g.ok and not g.flags and _valid(d, g.answer):
                out.append((i, _candidate(domain, d, g, naive_cost(sb, d.naive_sql), "unanswerable_xs")))
                kept += 1
    out.sort(key=lambda x: x[0])
    return {"db_id": domain.db_id, "tables": sizes, "drafts": len(drafts), "candidates": [c for _, c in out]}


def _rel(db_id: str) -> str:
    return f"databases/{db_id}/{db_id}.sqlite"


def _norm(question: str) -> str:
    return " ".join(question.lower().split())


def _select(parts: list[dict], splits: dict[str, tuple[str, ...]], scale: str, seed: int,
            shares: dict[str, float]) -> tuple[list[dict], dict[str, int]]:
    """Draw each split's TASKS[scale][split] tasks from its databases' candidates in ``shares`` (one
    seeded draw per split); keeps candidate order. Returns the tasks and the pool sizes over all databases."""
    seen: set[str] = set()
    where = split_of(splits)
    pools: dict[tuple[str, str], list[int]] = {}
    flat: list[dict] = []
    for p in parts:
        for c in p["candidates"]:
            if _norm(c["question"]) in seen:
                continue
            seen.add(_norm(c["question"]))
            pools.setdefault((where[c["db_id"]], c["pool"]), []).append(len(flat))
            flat.append(c)
    keep: list[int] = []
    for split, quota in TASKS[scale].items():
        rng = np.random.default_rng(domain_seed(seed, f"__select__:{split}"))
        for name, share in shares.items():
            pool = pools.get((split, name), [])
            order = rng.permutation(len(pool)).tolist()
            keep += [pool[j] for j in order[:round(quota * share)]]
    sizes = {k: sum(len(v) for (_, kind), v in pools.items() if kind == k) for k in shares}
    return [flat[i] for i in sorted(keep)], sizes


def demo_is_current(root: str | Path, mix: str = DEFAULT_MIX) -> bool:
    """Whether ``root`` holds a complete embedded benchmark of task mix ``mix`` written by this generator version
    (a cached folder from an older version or of another mix should be rebuilt: its databases and tasks differ)."""
    import json

    try:
        info = json.loads((Path(root) / BENCHMARK_FILE).read_text())
    except (OSError, ValueError):
        return False
    return (isinstance(info, dict) and info.get("generator_version") == GENERATOR_VERSION
            and info.get("mix", DEFAULT_MIX) == mix)


def build_demo(out_dir: str | Path, scale: str = "small", seed: int = 0, *, mix: str = DEFAULT_MIX,
               workers: int | None = None, progress: Callable[[str], None] | None = None) -> DemoBuild:
    """Generate the embedded benchmark into ``out_dir`` (created; existing benchmark files are overwritten).

    ``workers`` processes build databases in parallel (default: up to 2); ``progress(db_id)`` is called as each
    database finishes; ``mix`` names the task mix (`bapsql.data.mixes`). Raises `ConfigError` for an unknown scale
    or mix.
    """
    if scale not in SCALES:
        raise ConfigError(f"scale must be one of {list(SCALES)}, got {scale!r}")
    mix = mix_named(mix)
    t0 = time.perf_counter()
    root = Path(out_dir)
    root.mkdir(parents=True, exist_ok=True)
    counter_spec, _ = measurement_token_counter()
    workers = workers if workers is not None else min(2, os.cpu_count() or 1)
    args = [(d, str(root), scale, seed, counter_spec, mix) for d in DOMAINS]
    results: dict[str, dict] = {}
    if workers <= 1:
        for a in args:
            results[a[0].db_id] = _build_one(*a)
            if progress:
                progress(a[0].db_id)
    else:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            futures = {pool.submit(_build_one, *a): a[0].db_id for a in args}
            for fut in futures:  # submission order keeps the merge deterministic
                results[futures[fut]] = fut.result()
                if progress:
                    progress(futures[fut])
    parts = [results[d.db_id] for d in DOMAINS]
    splits = split_databases([p["db_id"] for p in parts], seed=seed, fractions=DEMO_FRACTIONS)
    chosen, pools = _select(parts, splits, scale, seed, mix.shares)
    return _write_folder(root, scale, seed, counter_spec, parts, splits, chosen, pools, t0, mix.name)


def _write_folder(root: Path, scale: str, seed: int, counter_spec: str, parts: list[dict],
                  splits: dict[str, tuple[str, ...]], chosen: list[dict], pools: dict[str, int],
                  t0: float, mix: str) -> DemoBuild:
    tasks, costs, counts = [], {}, {}
    for c in chosen:
        c = dict(c)
        counts[c["db_id"]] = counts.get(c["db_id"], 0) + 1
        task_id = f"{c['db_id']}-{counts[c['db_id']]:04d}"
        costs[task_id] = c.pop("costs")
        c.pop("pool")
        tasks.append(Task(task_id=task_id, db_path=_rel(c["db_id"]), source=DEMO_NAME,
                          gold=Answer.from_json(c.pop("gold")), tags=tuple(c.pop("tags")), **c))
    write_tasks(root / TASKS_FILE, tasks)
    write_json(root / SPLITS_FILE, {"seed": seed, "splits": {k: list(v) for k, v in splits.items()}})
    info = {"name": DEMO_NAME, "kind": "demo", "version": FORMAT_VERSION, "seed": seed, "scale": scale,
            "generator_version": GENERATOR_VERSION, "token_counter": counter_spec, "tag_budget": "XS"}
    info = json_text(info if mix == DEFAULT_MIX else {**info, "mix": mix})  # the default mix's bytes as before
    shares = _shares(tasks, costs)
    drafts = sum(p["drafts"] for p in parts)
    manifest = {
        "databases": {p["db_id"]: {"path": _rel(p["db_id"]), "tables": p["tables"],
                                   "bytes": (root / _rel(p["db_id"])).stat().st_size,
                                   "sha256": sha256_file(root / _rel(p["db_id"]))} for p in parts},
        "tasks": len(tasks),
        "drafts": drafts,
        "candidates": pools,
        "shares": shares,
        "costs": costs,
        "files": {BENCHMARK_FILE: hashlib.sha256(info.encode()).hexdigest(),
                  **{name: sha256_file(root / name) for name in (TASKS_FILE, SPLITS_FILE)}},
    }
    write_json(root / MANIFEST_FILE, manifest)
    write_json_text(root / BENCHMARK_FILE, info)  # last: a folder with benchmark.json is complete
    return DemoBuild(root, len(parts), len(tasks), drafts - len(tasks), shares, time.perf_counter() - t0)


def _shares(tasks: list[Task], costs: dict[str, dict]) -> dict[str, float]:
    """Shares of tasks by tag and of gold / naive queries exceeding the XS and S budgets when run unshielded."""
    n = max(1, len(tasks))
    ladder = _ladder()
    out = {tag: sum(tag in t.tags for t in tasks) / n for tag in ("budget_sensitive", "unanswerable_xs")}
    for level in ("XS", "S"):
        b = ladder[level]
        for which in ("gold", "naive"):
            over = sum(not QueryCost.from_json(costs[t.task_id][which]).fits(b) for t in tasks)
            out[f"{which}_exceeds_{level}"] = over / n
    return {k: round(v, 4) for k, v in out.items()}
