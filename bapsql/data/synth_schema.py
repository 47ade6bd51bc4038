"""Declarative table specs for the embedded benchmark and the deterministic builder that turns them into SQLite files.

A `Domain` is a list of `Table` specs (parents before children); each `Table` is a list of `Col` specs whose
``kind`` says how the column's values are drawn with numpy:

- ``pk``: 1..n. ``fk``: a parent's id, Zipf-skewed over a random permutation of the parent's ids.
- ``name``: words combined from ``words`` (``unique=True`` samples combinations without replacement).
- ``cat``: a vocabulary, Zipf-skewed; ``dirty`` replaces that share by case/whitespace variants, ``na`` by 'N/A'.
- ``code``: short codes whose meaning (``labels``) is only given as a BIRD-style evidence hint.
- ``int`` / ``float``: ``dist`` uniform | lognormal | normal over ``lo``/``hi`` (lognormal: median ``lo``, sigma
  ``hi``), rounded to ``decimals``. ``date``: ISO dates uniform between years ``lo`` and ``hi``.
- ``nulls`` is the NULL share of any non-key column.

Contract: `build_database(domain, path, scale, seed)` writes the same bytes for the same arguments (apsw's pinned
SQLite, one transaction, indexes after data, VACUUM at the end). The spec also carries the question phrases
(``noun``/``plural``) that `bapsql.data.synth_tasks` uses to word questions.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path
from typing import Literal

import numpy as np

ColKind = Literal["pk", "fk", "name", "cat", "code", "int", "float", "date"]
Scale = Literal["small", "full"]
SCALES: tuple[str, ...] = ("small", "full")


@dataclass(frozen=True)
class Col:
    """One column: how to draw it and how questions name it."""

    name: str
    kind: ColKind
    noun: str = ""
    ref: str = ""  # fk: the parent table
    values: tuple[str, ...] = ()  # cat / code vocabulary, most frequent first
    labels: tuple[str, ...] = ()  # code: the meaning of each code (evidence)
    phrase: str = ""  # code: how a question names the subset, e.g. "{label} customers"
    zipf: float = 1.0
    lo: float = 0.0
    hi: float = 1.0
    dist: Literal["uniform", "lognormal", "normal"] = "uniform"
    decimals: int = 0
    nulls: float = 0.0
    dirty: float = 0.0
    na: float = 0.0
    index: bool = False
    words: tuple[tuple[str, ...], ...] = ()
    unique: bool = False

    @property
    def sql_type(self) -> str:
        return {"pk": "INTEGER", "fk": "INTEGER", "int": "INTEGER", "float": "REAL"}.get(self.kind, "TEXT")

    @property
    def numeric(self) -> bool:
        return self.kind in ("int", "float")


@dataclass(frozen=True)
class Table:
    """One table with its size at each scale and its question nouns ("order" / "orders")."""

    name: str
    noun: str
    plural: str
    rows_small: int
    rows_full: int
    cols: tuple[Col, ...]

    def rows(self, scale: Scale) -> int:
        return self.rows_small if scale == "small" else self.rows_full

    def col(self, name: str) -> Col:
        for c in self.cols:
            if c.name == name:
                return c
        raise KeyError(f"{self.name} has no column {name}")

    @property
    def name_col(self) -> Col | None:
        return next((c for c in self.cols if c.kind == "name"), None)


@dataclass(frozen=True)
class Domain:
    """One database of the embedded benchmark."""

    db_id: str
    title: str
    tables: tuple[Table, ...]

    def table(self, name: str) -> Table:
        for t in self.tables:
            if t.name == name:
                return t
        raise KeyError(f"{self.db_id} has no table {name}")


def ddl(table: Table) -> str:
    """CREATE TABLE statement with the primary key and foreign keys declared."""
    parts = []
    for c in table.cols:
        parts.append(f"{c.name} {c.sql_type}" + (" PRIMARY KEY" if c.kind == "pk" else ""))
    for c in table.cols:
        if c.kind == "fk":
            parts.append(f"FOREIGN KEY ({c.name}) REFERENCES {c.ref}(id)")
    return f"CREATE TABLE {table.name} (\n  " + ",\n  ".join(parts) + "\n)"


def index_ddl(table: Table) -> list[str]:
    return [f"CREATE INDEX idx_{table.name}_{c.name} ON {table.name}({c.name})" for c in table.cols if c.index]


def domain_seed(seed: int, db_id: str) -> int:
    """A per-database seed derived from the benchmark seed (stable across Python runs, unlike hash())."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{db_id}".encode()).digest()[:8], "little")


def zipf_weights(n: int, s: float) -> np.ndarray:
    """Probabilities ∝ 1 / rank^s over n items, shape (n,)."""
    w = 1.0 / np.arange(1, n + 1, dtype=np.float64) ** s
    return w / w.sum()


def _dirty_variant(value: str, k: int) -> str:
    return (f" {value}", f"{value} ", value.upper(), value.lower(), value.title(), f"  {value}")[k % 6]


def _names(col: Col, n: int, rng: np.random.Generator) -> list[str]:
    sizes = [len(w) for w in col.words]
    total = int(np.prod(sizes))
    if col.unique:
        if total < n:
            raise ValueError(f"column {col.name}: {total} word combinations cannot give {n} unique names")
        flat = rng.choice(total, size=n, replace=False)
    else:
        flat = rng.integers(0, total, size=n)
    out = []
    for f in flat.tolist():
        words = []
        for ws, size in zip(reversed(col.words), reversed(sizes)):
            f, r = divmod(f, size)
            words.append(ws[r])
        out.append(" ".join(reversed(words)))
    return out


def _numbers(col: Col, n: int, rng: np.random.Generator) -> np.ndarray:
    if col.dist == "uniform":
        if col.kind == "float":
            x = rng.uniform(col.lo, col.hi, size=n)
        else:
            x = rng.integers(int(col.lo), int(col.hi) + 1, size=n)
    elif col.dist == "lognormal":
        x = col.lo * np.exp(rng.normal(0.0, col.hi, size=n))
    else:
        x = rng.normal(col.lo, col.hi, size=n)
    x = np.maximum(x, 0)  # every quantity of the demo domains is non-negative
    if col.kind == "int":
        return np.rint(x).astype(np.int64)
    return np.round(x.astype(np.float64), col.decimals)


def _dates(col: Col, n: int, rng: np.random.Generator) -> list[str]:
    start = date(int(col.lo), 1, 1)
    span = (date(int(col.hi), 12, 31) - start).days
    offsets = rng.integers(0, span + 1, size=n).tolist()
    return [(start + timedelta(days=d)).isoformat() for d in offsets]


def generate_column(col: Col, n: int, rng: np.random.Generator, parent_rows: dict[str, int]) -> list:
    """The values of one column as a Python list of length n (None for NULL)."""
    if col.kind == "pk":
        return list(range(1, n + 1))
    if col.kind == "fk":
        m = parent_rows[col.ref]
        perm = rng.permutation(m) + 1
        values = perm[rng.choice(m, size=n, p=zipf_weights(m, col.zipf))].tolist()
    elif col.kind in ("cat", "code"):
        vocab = col.values
        idx = rng.choice(len(vocab), size=n, p=zipf_weights(len(vocab), col.zipf))
        values = [vocab[i] for i in idx.tolist()]
        if col.dirty:
            hit = np.flatnonzero(rng.random(n) < col.dirty).tolist()
            kinds = rng.integers(0, 6, size=len(hit)).tolist()
            for i, k in zip(hit, kinds):
                values[i] = _dirty_variant(values[i], k)
        if col.na:
            for i in np.flatnonzero(rng.random(n) < col.na).tolist():
                values[i] = "N/A"
    elif col.kind == "name":
        values = _names(col, n, rng)
    elif col.kind == "date":
        values = _dates(col, n, rng)
    else:
        values = _numbers(col, n, rng).tolist()
    if col.nulls:
        for i in np.flatnonzero(rng.random(n) < col.nulls).tolist():
            values[i] = None
    return values


def build_database(domain: Domain, path: str | Path, scale: Scale, seed: int) -> dict[str, int]:
    """Write ``domain`` as a fresh SQLite file at ``path``; return rows per table. Same arguments → same bytes."""
    import apsw

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for suffix in ("", "-journal", "-wal", "-shm"):
        Path(str(path) + suffix).unlink(missing_ok=True)
    rng = np.random.default_rng(domain_seed(seed, domain.db_id))
    conn = apsw.Connection(str(path))
    try:
        cur = conn.cursor()
        for pragma in ("journal_mode=OFF", "synchronous=OFF", "page_size=4096"):
            cur.execute(f"PRAGMA {pragma}").fetchall()
        sizes: dict[str, int] = {}
        cur.execute("BEGIN")
        for table in domain.tables:
            n = table.rows(scale)
            cur.execute(ddl(table))
            columns = [generate_column(c, n, rng, sizes) for c in table.cols]
            marks = ", ".join("?" * len(columns))
            cur.executemany(f"INSERT INTO {table.name} VALUES ({marks})", zip(*columns))
            sizes[table.name] = n
        for table in domain.tables:
            for stmt in index_ddl(table):
                cur.execute(stmt)
        cur.execute("COMMIT")
        cur.execute("VACUUM")
    finally:
        conn.close()
    return sizes
