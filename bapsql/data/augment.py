"""Extra tasks on a split's own databases, for in-domain pretraining of small models (a copy-heavy corpus).

A 3M-parameter model has to learn to *copy* table, column and value strings out of the question and schema into
its SQL, and result values into its answer. The benchmark's few hundred training tasks are too few for that; the
embedded benchmark's generator (`bapsql.data.synth_tasks.propose`) can draw many more questions of the same
templates over the same databases with fresh random draws.

Contract of `augment_tasks(benchmark_dir, split, n_rounds, seed=..., exclude=...)`:

- for each database of ``split`` (a database split name; ``test`` has the train databases) that the embedded
  generator knows, ``n_rounds`` rounds of `propose` with a seeded generator (``seed`` and the round mixed with the
  database's id), trying the templates in the weights of the benchmark's task mix (`bapsql.data.mixes`);
- drops every draft whose normalised question equals a question of ``exclude`` (the held-out test tasks must never
  reach training) or an earlier draft;
- returns `Task` s with ids ``aug-<db_id>-<n>``, no stored gold answer (the environment derives it from the gold
  SQL, never charged), the draft's evidence hint and naive SQL, and tags ``template:<name>`` and ``augmented``.

Drafts are not executed here: the caller keeps only episodes a workflow solved (`bapsql.policies.sft_export`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

import numpy as np

from bapsql.errors import ConfigError
from bapsql.types import Task

def normalise(question: str) -> str:
    return " ".join(question.lower().split())


def augment_tasks(benchmark_dir: str | Path, split: str, n_rounds: int, *, seed: int = 1,
                  exclude: Iterable[Task] = (), db_ids: Iterable[str] | None = None) -> list[Task]:
    """Fresh tasks on the databases of ``split`` (see the module docstring); ``db_ids`` narrows the databases."""
    from bapsql.data.mixes import mix_named, recorded_mix
    from bapsql.data.synth_domains import DOMAINS
    from bapsql.data.synth_schema import domain_seed
    from bapsql.data.synth_tasks import propose
    from bapsql.data.synth_values import DbView
    from bapsql.data.tasks import load_tasks

    if n_rounds < 1:
        raise ConfigError(f"augment: n_rounds must be >= 1, got {n_rounds}")
    base = load_tasks(benchmark_dir, split)
    weights = mix_named(recorded_mix(benchmark_dir)).weights
    paths = {t.db_id: t.db_path for t in base}
    wanted = sorted(paths) if db_ids is None else sorted(set(db_ids) & set(paths))
    domains = {d.db_id: d for d in DOMAINS}
    banned = {normalise(t.question) for t in exclude}
    seen: set[str] = set()
    out: list[Task] = []
    for db_id in wanted:
        if db_id not in domains:
            continue  # not a database of the embedded generator
        view = DbView(paths[db_id], domains[db_id])
        try:
            n = 0
            for r in range(n_rounds):
                rng = np.random.default_rng([domain_seed(seed, db_id) % 2 ** 32, r])
                for d in propose(view, rng, weights):
                    key = normalise(d.question)
                    if key in banned or key in seen:
                        continue
                    seen.add(key)
                    out.append(Task(task_id=f"aug-{db_id}-{n}", db_id=db_id, db_path=paths[db_id],
                                    question=d.question, gold_sql=d.gold_sql, evidence=d.evidence,
                                    source="augment", tags=(f"template:{d.template}", "augmented", *d.tags),
                                    naive_sql=d.naive_sql))
                    n += 1
        finally:
            view.close()
    return out
