"""Per-database catalog statistics: built offline once per SQLite file, cached as JSON, read by the estimator and by
the environment's ``inspect_schema`` (which renders the text; this module only holds data).

Contract:
- `build_catalog(path)` opens its own read-only connection (the sandbox's authorizer forbids the PRAGMAs it needs)
  and reads only trusted, fixed SQL. Building is offline preprocessing and is never charged to an episode.
- Tables with at most `EXACT_ROWS` rows are scanned whole: distinct and null counts, top values and quantiles are
  exact. Larger tables use a deterministic sample of about 1/k of the rows (k = ceil(rows / SAMPLE_ROWS)): the rows
  whose Knuth multiplicative hash of the rowid, (rowid · 2654435761) mod 2^32, is 0 mod k (a plain rowid mod k would
  alias with periodic data; WITHOUT ROWID tables take every k-th row in scan order); null counts and
  frequencies are scaled by rows / sample size and distinct counts use the Duj1 estimator of Haas et al. (VLDB 1995),
  D = n·d / (n − f1 + f1·n/N), with n sampled values, d distinct among them, f1 of them seen once, N total values.
  Row counts are always exact.
- Average serialized widths are measured with `bapsql.db.rows.cell_text`, the text the shield charges for, on up to
  `WIDTH_SAMPLE` values per column, so estimates and charges measure the same text.
- `load_or_build_catalog(path, cache_dir)` caches under ``<cache>/catalogs/`` keyed by the file's absolute path; the
  cached file is reused only while the fingerprint (size, mtime, hash of the first and last pages, catalog version)
  still matches, otherwise it is rebuilt. An unwritable cache directory only loses the cache, never the catalog.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import apsw

from bapsql.db.rows import cell_text
from bapsql.errors import DatabaseError

CATALOG_VERSION = 2
EXACT_ROWS = 200_000  # tables up to this size get exact statistics
SAMPLE_ROWS = 100_000  # target sample size for larger tables
WIDTH_SAMPLE = 2_000  # values per column whose cell_text width is measured
QUANTILE_SAMPLE = 20_000  # values per column sorted for quantiles
N_QUANTILES = 20  # quantile boundaries at 0, 5, ..., 100 %
N_TOP = 8  # most frequent values kept per column
_HASH = 2654435761  # Knuth's multiplicative hash constant (sampling of large tables)
N_TEXT_SAMPLES = 16  # rendered sample cells kept per column (token-per-character ratios)

JSONValue = int | float | str | None


@dataclass(frozen=True)
class ColumnStats:
    """Statistics of one column. ``top`` holds (value, count) pairs for skewed or low-cardinality columns;
    ``quantiles`` holds `N_QUANTILES` + 1 boundaries of the majority kind of the non-null values (numbers or text,
    whichever is more common, when it is at least half of them)."""

    name: str
    type: str  # declared type ('' when none)
    pk: int  # position in the primary key (1-based), 0 when not part of it
    notnull: bool
    distinct: int  # distinct non-null values
    nulls: int
    avg_width: float  # mean characters of cell_text(value), NULLs included
    top: tuple[tuple[JSONValue, int], ...] = ()
    quantiles: tuple[JSONValue, ...] = ()
    quantile_share: float = 0.0  # share of the non-null values the quantiles describe (their kind's share)
    samples: tuple[str, ...] = ()  # cell_text of a few deterministic sample values

    @property
    def numeric(self) -> bool:
        return bool(self.quantiles) and isinstance(self.quantiles[0], (int, float))


@dataclass(frozen=True)
class IndexInfo:
    name: str
    columns: tuple[str, ...]  # key columns in order (expression parts appear as '<expr>')
    unique: bool
    partial: bool
    rootpage: int


@dataclass(frozen=True)
class ForeignKey:
    columns: tuple[str, ...]
    ref_table: str
    ref_columns: tuple[str, ...]


@dataclass(frozen=True)
class TableStats:
    name: str
    rows: int  # exact row count
    sampled: bool  # True when column statistics come from a sample
    sample_rows: int  # rows the statistics were computed on
    rootpage: int
    without_rowid: bool
    columns: tuple[ColumnStats, ...]
    indexes: tuple[IndexInfo, ...] = ()
    foreign_keys: tuple[ForeignKey, ...] = ()

    @cached_property
    def _by_name(self) -> dict[str, ColumnStats]:
        return {c.name.lower(): c for c in self.columns}

    def column(self, name: str) -> ColumnStats | None:
        """Case-insensitive column lookup (``None`` when absent)."""
        return self._by_name.get(name.lower())

    @property
    def avg_row_width(self) -> float:
        return sum(c.avg_width for c in self.columns)


@dataclass(frozen=True)
class Catalog:
    """Statistics of every table of one database; ``views`` maps view names to their SQL."""

    db_path: str
    fingerprint: dict[str, Any]
    tables: tuple[TableStats, ...]
    views: tuple[tuple[str, str], ...] = ()
    version: int = CATALOG_VERSION
    build_seconds: float = 0.0

    @cached_property
    def _by_name(self) -> dict[str, TableStats]:
        return {t.name.lower(): t for t in self.tables}

    @cached_property
    def _by_rootpage(self) -> dict[int, tuple[str, str | None]]:
        out: dict[int, tuple[str, str | None]] = {}
        for t in self.tables:
            out[t.rootpage] = (t.name, None)
            for ix in t.indexes:
                out[ix.rootpage] = (t.name, ix.name)
        return out

    def table(self, name: str) -> TableStats | None:
        """Case-insensitive table lookup (``None`` when absent)."""
        return self._by_name.get(name.lower())

    def view_sql(self, name: str) -> str | None:
        for n, sql in self.views:
            if n.lower() == name.lower():
                return sql
        return None

    def by_rootpage(self, rootpage: int) -> tuple[str, str | None] | None:
        """(table, index name or None) stored at b-tree root page ``rootpage``."""
        return self._by_rootpage.get(rootpage)

    @property
    def table_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.tables)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> "Catalog":
        tables = tuple(
            TableStats(
                **{
                    **t,
                    "columns": tuple(
                        ColumnStats(
                            **{
                                **c,
                                "top": tuple((v, n) for v, n in c["top"]),
                                "quantiles": tuple(c["quantiles"]),
                                "samples": tuple(c["samples"]),
                            }
                        )
                        for c in t["columns"]
                    ),
                    "indexes": tuple(IndexInfo(**{**i, "columns": tuple(i["columns"])}) for i in t["indexes"]),
                    "foreign_keys": tuple(
                        ForeignKey(tuple(f["columns"]), f["ref_table"], tuple(f["ref_columns"]))
                        for f in t["foreign_keys"]
                    ),
                }
            )
            for t in obj["tables"]
        )
        return cls(
            db_path=obj["db_path"],
            fingerprint=obj["fingerprint"],
            tables=tables,
            views=tuple((n, s) for n, s in obj["views"]),
            version=obj["version"],
            build_seconds=obj["build_seconds"],
        )


# ----------------------------------------------------------------------------------------------------------------------
# fingerprint and cache


def fingerprint(db_path: str | Path) -> dict[str, Any]:
    """Identity of a database file's current contents: absolute path, size, mtime and a SHA-256 of its first and last
    pages (page size read from the header). A ``-wal`` file next to it contributes its size and mtime."""
    p = Path(db_path).resolve()
    try:
        st = p.stat()
        with open(p, "rb") as f:
            head = f.read(100)
            page = int.from_bytes(head[16:18], "big") if len(head) >= 18 else 4096
            page = 65536 if page == 1 else (page or 4096)
            f.seek(0)
            first = f.read(page)
            f.seek(max(0, st.st_size - page))
            last = f.read(page)
    except OSError as exc:
        raise DatabaseError(f"cannot read database file {p}: {exc}") from exc
    fp: dict[str, Any] = {
        "path": str(p),
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "pages_sha256": hashlib.sha256(first + last).hexdigest(),
        "version": CATALOG_VERSION,
    }
    wal = p.with_name(p.name + "-wal")
    if wal.exists():
        wst = wal.stat()
        fp["wal"] = [wst.st_size, wst.st_mtime_ns]
    return fp


def default_cache_dir() -> Path:
    """``$BAPSQL_CACHE_DIR`` or ``~/.cache/bapsql`` (database folders may be read-only)."""
    env = os.environ.get("BAPSQL_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "bapsql"


def catalog_cache_path(db_path: str | Path, cache_dir: Path | None = None) -> Path:
    """Where the catalog of ``db_path`` is cached: one JSON file per absolute path."""
    p = Path(db_path).resolve()
    key = hashlib.sha256(str(p).encode()).hexdigest()[:16]
    return (cache_dir or default_cache_dir()) / "catalogs" / f"{p.stem}-{key}.json"


def load_or_build_catalog(db_path: str | Path, cache_dir: Path | None = None) -> Catalog:
    """The catalog of ``db_path`` from the cache when its fingerprint still matches, else freshly built (and cached).

    Raises `DatabaseError` when the file is missing or not a readable SQLite database."""
    fp = fingerprint(db_path)
    cache = catalog_cache_path(db_path, cache_dir)
    if cache.is_file():
        try:
            obj = json.loads(cache.read_text())
            if obj.get("fingerprint") == fp:
                return Catalog.from_json(obj)
        except (OSError, ValueError, KeyError, TypeError):
            pass  # a corrupt or outdated cache entry is rebuilt below
    catalog = build_catalog(db_path, _fingerprint=fp)
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=cache.parent, prefix=cache.name, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(catalog.to_json(), f)
        os.replace(tmp, cache)
    except OSError:
        pass  # unwritable cache: the catalog is still valid, only not reused
    return catalog


# ----------------------------------------------------------------------------------------------------------------------
# building


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def open_readonly(db_path: str | Path) -> apsw.Connection:
    """A plain read-only apsw connection (trusted, offline use only). Raises `DatabaseError` if unopenable."""
    p = Path(db_path)
    if not p.is_file():
        raise DatabaseError(f"database file not found: {p}")
    try:
        conn = apsw.Connection(str(p), flags=apsw.SQLITE_OPEN_READONLY)
        conn.execute("SELECT count(*) FROM sqlite_schema").fetchall()
    except apsw.Error as exc:
        raise DatabaseError(f"{p}: not a readable SQLite database ({exc})") from exc
    return conn


def distinct_duj1(n: int, d: int, f1: int, total: int) -> int:
    """Haas et al.'s Duj1 estimate of the distinct count of ``total`` values from a uniform sample of ``n`` values
    holding ``d`` distinct values of which ``f1`` occur once. Exact (returns d) when n == total."""
    if n <= 0 or d <= 0:
        return 0
    if n >= total:
        return d
    denom = n - f1 + f1 * n / total
    est = n * d / denom if denom > 0 else total
    return int(round(min(max(est, d), total)))


def _jsonable(v: Any) -> bool:
    return v is None or isinstance(v, (int, float, str))


def _column_stats(name: str, decl: str, pk: int, notnull: bool, values: list, n_total: int) -> ColumnStats:
    n = len(values)
    scale = n_total / n if n else 0.0
    counts = Counter(values)
    null_s = counts.pop(None, 0)
    d = len(counts)
    f1 = sum(1 for c in counts.values() if c == 1)
    distinct = distinct_duj1(n - null_s, d, f1, max(n_total - round(null_s * scale), 0)) if n < n_total else d
    step = max(1, n // WIDTH_SAMPLE)
    widths = [len(cell_text(v)) for v in values[::step]]
    avg_width = sum(widths) / len(widths) if widths else 0.0
    top: tuple[tuple[JSONValue, int], ...] = ()
    if counts:
        nonnull = n - null_s
        common = [(v, c) for v, c in counts.most_common(N_TOP) if _jsonable(v)]
        if d <= N_TOP or (common and common[0][1] > 2 * nonnull / d):
            top = tuple((v, int(round(c * scale))) for v, c in common)
    quantiles: tuple[JSONValue, ...] = ()
    share = 0.0
    nonnull_vals = [v for v in values[:: max(1, n // QUANTILE_SAMPLE)] if v is not None]
    if nonnull_vals:
        nums = [v for v in nonnull_vals if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v]
        texts = [v for v in nonnull_vals if isinstance(v, str)]
        major = nums if len(nums) >= len(texts) else texts
        share = len(major) / len(nonnull_vals)
        if major and share >= 0.5:  # quantiles of the majority kind; ``quantile_share`` says how much it covers
            s = sorted(major)
            quantiles = tuple(s[min(len(s) - 1, (len(s) - 1) * i // N_QUANTILES)] for i in range(N_QUANTILES + 1))
    sstep = max(1, n // N_TEXT_SAMPLES)
    samples = tuple(cell_text(v) for v in values[::sstep][:N_TEXT_SAMPLES])
    return ColumnStats(
        name=name,
        type=decl or "",
        pk=pk,
        notnull=notnull,
        distinct=distinct,
        nulls=int(round(null_s * scale)),
        avg_width=round(avg_width, 3),
        top=top,
        quantiles=quantiles,
        quantile_share=round(share, 4) if quantiles else 0.0,
        samples=samples,
    )


def _table_stats(conn: apsw.Connection, name: str, rootpage: int, create_sql: str) -> TableStats:
    qn = _q(name)
    info = conn.execute("SELECT name, type, \"notnull\", pk FROM pragma_table_info(?)", (name,)).fetchall()
    without_rowid = "without rowid" in (create_sql or "").lower().replace("\n", " ")
    n_rows = conn.execute(f"SELECT count(*) FROM {qn}").fetchall()[0][0]
    cols = ", ".join(_q(c[0]) for c in info)
    if n_rows <= EXACT_ROWS:
        rows = conn.execute(f"SELECT {cols} FROM {qn}").fetchall()
        sampled = False
    else:
        k = math.ceil(n_rows / SAMPLE_ROWS)
        if without_rowid:
            rows = [r for i, r in enumerate(conn.execute(f"SELECT {cols} FROM {qn}")) if i % k == 0]
        else:
            rows = conn.execute(f"SELECT {cols} FROM {qn} WHERE (_rowid_ * {_HASH} % 4294967296) % {k} = 0").fetchall()
        sampled = True
    by_col = list(zip(*rows)) if rows else [() for _ in info]
    columns = tuple(
        _column_stats(c[0], c[1], int(c[3]), bool(c[2]), list(vals), n_rows) for c, vals in zip(info, by_col)
    )
    indexes = []
    for _seq, iname, unique, _origin, partial in conn.execute(
        "SELECT seq, name, \"unique\", origin, partial FROM pragma_index_list(?)", (name,)
    ).fetchall():
        icols = tuple(
            c if c is not None else "<expr>"
            for (c,) in conn.execute("SELECT name FROM pragma_index_info(?) ORDER BY seqno", (iname,)).fetchall()
        )
        root = conn.execute("SELECT rootpage FROM sqlite_schema WHERE type='index' AND name=?", (iname,)).fetchall()
        indexes.append(IndexInfo(iname, icols, bool(unique), bool(partial), int(root[0][0]) if root else 0))
    fks: dict[int, list] = {}
    for fid, _seq, table, frm, to in conn.execute(
        "SELECT id, seq, \"table\", \"from\", \"to\" FROM pragma_foreign_key_list(?) ORDER BY id, seq", (name,)
    ).fetchall():
        fks.setdefault(fid, []).append((table, frm, to))
    foreign_keys = []
    for parts in fks.values():
        ref = parts[0][0]
        to_cols = [p[2] for p in parts]
        if any(t is None for t in to_cols):  # REFERENCES t without columns: the parent's primary key
            pk = conn.execute("SELECT name FROM pragma_table_info(?) WHERE pk > 0 ORDER BY pk", (ref,)).fetchall()
            to_cols = [r[0] for r in pk] or to_cols
        foreign_keys.append(ForeignKey(tuple(p[1] for p in parts), ref, tuple(str(t) for t in to_cols)))
    return TableStats(
        name=name,
        rows=int(n_rows),
        sampled=sampled,
        sample_rows=len(rows),
        rootpage=int(rootpage or 0),
        without_rowid=without_rowid,
        columns=columns,
        indexes=tuple(indexes),
        foreign_keys=tuple(foreign_keys),
    )


def build_catalog(db_path: str | Path, *, _fingerprint: dict[str, Any] | None = None) -> Catalog:
    """Scan ``db_path`` (read-only) and return its `Catalog`. Raises `DatabaseError` if it cannot be read."""
    t0 = time.perf_counter()
    fp = _fingerprint or fingerprint(db_path)
    conn = open_readonly(db_path)
    try:
        schema = conn.execute(
            "SELECT type, name, rootpage, sql FROM sqlite_schema WHERE type IN ('table', 'view') ORDER BY rowid"
        ).fetchall()
        tables = []
        views = []
        for typ, name, root, sql in schema:
            if typ == "view":
                views.append((name, sql or ""))
            elif not name.startswith("sqlite_") and not (sql or "").upper().startswith("CREATE VIRTUAL"):
                try:
                    tables.append(_table_stats(conn, name, root, sql or ""))
                except apsw.Error as exc:
                    raise DatabaseError(f"{db_path}: cannot read table {name!r}: {exc}") from exc
    finally:
        conn.close()
    return Catalog(
        db_path=str(Path(db_path).resolve()),
        fingerprint=fp,
        tables=tuple(tables),
        views=tuple(views),
        build_seconds=round(time.perf_counter() - t0, 4),
    )
