"""Loaders for user-supplied BIRD and Spider layouts.

- BIRD: question JSON files (``train.json``, ``dev.json``, mini-dev JSON, ...) whose records have ``db_id``,
  ``question``, ``SQL`` (and usually ``question_id``, ``evidence``, ``difficulty``); databases at
  ``*_databases/<db_id>/<db_id>.sqlite`` anywhere up to three folders deep.
- Spider: question JSON files whose records have ``db_id``, ``question``, ``query``; ``tables.json``; databases at
  ``database/<db_id>/<db_id>.sqlite``.

Contract: every record is accounted for. Unreadable files and malformed records go to ``unreadable_files``; records
whose database file is missing go to ``tasks_missing_database`` (and the database to ``missing_databases``); gold SQL
that fails to execute goes to ``failed_gold``; flagged gold results (too large, non-deterministic, empty) stay as
tasks tagged ``flag:<code>`` and are listed in ``flagged``. Splits are by database (`bapsql.data.splits`): databases
of a question file named ``*dev*`` stay ``dev`` when other question files exist, the rest are split by seed. An exact
question (case- and whitespace-normalized) is kept in one split only: the copy in the training side is dropped and
listed in ``duplicates`` (dev wins over validation wins over train).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from bapsql.data.benchmark import Benchmark, LoadManifest
from bapsql.data.splits import DEFAULT_FRACTIONS, SPLIT_NAMES, split_databases, split_of
from bapsql.data.naive import naive_from_gold
from bapsql.types import Task

_SKIP_FILES = {"tables.json", "column_meaning.json"}
_MAX_DEPTH = 3


def _json_files(root: Path) -> list[Path]:
    out = []
    for p in sorted(root.rglob("*.json")):
        rel = p.relative_to(root)
        if len(rel.parts) <= _MAX_DEPTH and p.name not in _SKIP_FILES and not p.name.endswith("_tables.json") \
                and not any(part.endswith("_databases") or part == "database" for part in rel.parts[:-1]):
            out.append(p)
    return out


def _peek(path: Path) -> dict | None:
    """The first record of a question file; None if it is not a JSON list of objects; {} if it starts like a JSON
    list but cannot be read (the loader then reports it)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return None
    if not text.lstrip().startswith("["):
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return {}
    return data[0] if isinstance(data, list) and data and isinstance(data[0], dict) else None


def looks_like_bird(root: Path) -> bool:
    has_dbs = any(p.is_dir() for p in root.rglob("*_databases"))
    return has_dbs and any((r := _peek(p)) is not None and ("SQL" in r or r == {}) for p in _json_files(root))


def looks_like_spider(root: Path) -> bool:
    return (root / "database").is_dir() and any(
        (r := _peek(p)) is not None and ("query" in r or r == {}) for p in _json_files(root))


def _find_databases(root: Path, layout: str) -> dict[str, Path]:
    """db_id → database file; the first match in sorted order wins."""
    dirs = [root / "database"] if layout == "spider" else sorted(p for p in root.rglob("*_databases") if p.is_dir())
    found: dict[str, Path] = {}
    for d in dirs:
        if not d.is_dir():
            continue
        for sub in sorted(p for p in d.iterdir() if p.is_dir()):
            f = sub / f"{sub.name}.sqlite"
            if f.is_file() and sub.name not in found:
                found[sub.name] = f.resolve()
    return found


def _records(root: Path, layout: str, unreadable: list) -> tuple[list[tuple[str, dict]], list[str]]:
    """(source file stem, record) pairs from every question file; problems appended to ``unreadable``."""
    sql_key = "SQL" if layout == "bird" else "query"
    out, files = [], []
    for p in _json_files(root):
        rel = str(p.relative_to(root))
        first = _peek(p)
        if first is None:
            continue
        try:
            data = json.loads(p.read_text())
        except (OSError, ValueError) as exc:
            unreadable.append((rel, f"cannot read JSON: {exc}"))
            continue
        if sql_key not in first:
            continue
        files.append(rel)
        for i, rec in enumerate(data):
            missing = [k for k in ("db_id", "question", sql_key) if not isinstance(rec, dict) or
                       not isinstance(rec.get(k), str)]
            if missing:
                unreadable.append((f"{rel}#{i}", f"record lacks string field(s) {missing}"))
                continue
            out.append((p.stem, {**rec, "_index": i}))
    return out, files


def _task(layout: str, stem: str, rec: dict, db_file: Path | None) -> Task:
    if layout == "bird":
        qid = rec.get("question_id", rec["_index"])
        return Task(task_id=f"bird-{stem}-{qid}", db_id=rec["db_id"], db_path=str(db_file or ""),
                    question=rec["question"].strip(), gold_sql=rec["SQL"].strip(),
                    evidence=str(rec.get("evidence") or "").strip(), difficulty=str(rec.get("difficulty") or ""),
                    source=f"bird:{stem}", naive_sql=naive_from_gold(rec["SQL"].strip()))
    return Task(task_id=f"spider-{stem}-{rec['_index']:05d}", db_id=rec["db_id"], db_path=str(db_file or ""),
                question=" ".join(rec["question"].split()), gold_sql=rec["query"].strip(), source=f"spider:{stem}",
                naive_sql=naive_from_gold(rec["query"].strip()))


def _norm(question: str) -> str:
    return " ".join(question.lower().split())


def load_real(root: Path, layout: str, *, seed: int = 0, cache_dir=None,
              progress: Callable[[int, int], None] | None = None) -> Benchmark:
    """Load a BIRD or Spider layout (see the module docstring): type every gold answer, split, dedupe."""
    from dataclasses import replace

    from bapsql.data.cache import GoldCache
    from bapsql.data.gold import derive_gold
    from bapsql.data.measure import measurement_token_counter
    from bapsql.db.sandbox import Sandbox
    from bapsql.errors import DatabaseError

    root = root.resolve()
    unreadable: list[tuple[str, str]] = []
    records, files = _records(root, layout, unreadable)
    dbs = _find_databases(root, layout)
    drafts: list[tuple[str, Task]] = []  # (source stem, task)
    missing_tasks: list[str] = []
    missing_dbs: set[str] = set()
    for stem, rec in records:
        t = _task(layout, stem, rec, dbs.get(rec["db_id"]))
        if rec["db_id"] not in dbs:
            missing_tasks.append(t.task_id)
            missing_dbs.add(rec["db_id"])
            continue
        drafts.append((stem, t))
    _, counter = measurement_token_counter()
    cache = GoldCache(cache_dir)
    failed, flagged, tasks = [], [], []
    sandboxes: dict[str, Sandbox] = {}
    try:
        for i, (stem, t) in enumerate(drafts):
            if t.db_id not in sandboxes:
                try:
                    sandboxes[t.db_id] = Sandbox(t.db_path)
                except DatabaseError as exc:
                    sandboxes[t.db_id] = None
                    unreadable.append((t.db_path, str(exc)))
            sb = sandboxes[t.db_id]
            if sb is None:
                failed.append((t.task_id, "database file is unreadable"))
                continue
            g = derive_gold(sb, t.gold_sql, token_counter=counter, cache=cache)
            if progress is not None:
                progress(i + 1, len(drafts))
            if not g.ok:
                failed.append((t.task_id, g.error))
                continue
            flagged.extend((t.task_id, f.code, f.reason) for f in g.flags)
            tags = (f"answer:{g.answer.kind}",) + tuple(f"flag:{f.code}" for f in g.flags)
            tasks.append((stem, replace(t, gold=g.answer, tags=tags)))
    finally:
        cache.flush()
        for sb in sandboxes.values():
            if sb is not None:
                sb.close()
    splits = _split(root, layout, [(s, t) for s, t in drafts], seed)
    kept, duplicates = _dedupe([t for _, t in tasks], splits)
    manifest = LoadManifest(
        layout=layout, root=str(root), question_files=tuple(files), databases=tuple(sorted(dbs)),
        missing_databases=tuple(sorted(missing_dbs)), unreadable_files=tuple(unreadable),
        tasks_missing_database=tuple(missing_tasks), failed_gold=tuple(failed), flagged=tuple(flagged),
        duplicates=tuple(duplicates), records=len(records), split_seed=seed, splits=splits,
    )
    return Benchmark(f"{layout}:{root.name}", layout, root, tuple(kept), splits, manifest, {})


def _split(root: Path, layout: str, drafts: list[tuple[str, Task]], seed: int) -> dict[str, tuple[str, ...]]:
    stems = {s for s, _ in drafts}
    dev_stems = {s for s in stems if "dev" in s.lower()}
    fixed: dict[str, str] = {}
    fractions: tuple[float, float, float] = DEFAULT_FRACTIONS
    if dev_stems and dev_stems != stems:
        fixed = {t.db_id: "dev" for s, t in drafts if s in dev_stems}
        fractions = (0.85, 0.15, 0.0)
    db_ids = {t.db_id for _, t in drafts}
    return split_databases(db_ids, seed=seed, fractions=fractions, fixed=fixed)


def _dedupe(tasks: list[Task], splits: dict[str, tuple[str, ...]]) -> tuple[list[Task], list[tuple[str, str]]]:
    """Keep each exact question in one split: the copy in an earlier split of (train, validation) is dropped."""
    where = split_of(splits)
    rank = {name: i for i, name in enumerate(SPLIT_NAMES)}
    best: dict[str, int] = {}
    for t in tasks:
        q = _norm(t.question)
        best[q] = max(best.get(q, -1), rank[where[t.db_id]])
    kept, dropped = [], []
    for t in tasks:
        s = rank[where[t.db_id]]
        if s < best[_norm(t.question)]:
            dropped.append((t.task_id, f"the same question appears in the {SPLIT_NAMES[best[_norm(t.question)]]} "
                                        "split"))
        else:
            kept.append(t)
    return kept, dropped
