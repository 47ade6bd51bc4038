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
- ``fingerprint`` is the identity of the data the statistics describe (`bapsql.db.dbfile.data_fingerprint`: schema
  hash, page counts, largest rowids), read in the same read transaction as the statistics themselves, so a catalog
  never mixes two versions of a live database. Caching and staleness live in `bapsql.db.catalog_cache`.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import asdict, dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Callable

import apsw

from bapsql.db.dbfile import BusyWait, connect_readonly, data_fingerprint, explain_error
from bapsql.db.rows import cell_text
from bapsql.errors import DatabaseError

CATALOG_VERSION = 4  # 3: the fingerprint is the data's (schema hash, pages, rowids); 4: quantiles at QUANTILE_LEVELS
EXACT_ROWS = 200_000  # tables up to this size get exact statistics
SAMPLE_ROWS = 100_000  # target sample size for larger tables
WIDTH_SAMPLE = 2_000  # values per column whose cell_text width is measured
QUANTILE_SAMPLE = 20_000  # values per column sorted for quantiles
# Probability levels of the stored quantile boundaries: 5 % steps in the body, finer steps in both tails, where
# selective range filters (``price > t`` near the maximum) read them. With 5 % steps throughout, a filter keeping
# 0.3 % of a right-skewed column was estimated at 3.3 % (linear interpolation across the last 5 %), and the token
# p95 built on it was 50 times the result (benchmarks/RESULTS.md, "Tail quantiles").
QUANTILE_LEVELS: tuple[float, ...] = (
    0.0, 0.001, 0.002, 0.005, 0.01, 0.02, 0.03,
    *(i / 20 for i in range(1, 20)),
    0.97, 0.98, 0.99, 0.995, 0.998, 0.999, 1.0,
)
N_TOP = 8  # most frequent values kept per column
_HASH = 2654435761  # Knuth's multiplicative hash constant (sampling of large tables)
N_TEXT_SAMPLES = 16  # rendered sample cells kept per column (token-per-character ratios)

JSONValue = int | float | str | None


@dataclass(frozen=True)
class ColumnStats:
    """Statistics of one column. ``top`` holds (value, count) pairs for skewed or low-cardinality columns;
    ``quantiles`` holds the boundaries at `QUANTILE_LEVELS` of the majority kind of the non-null values (numbers or
    text, whichever is more common, when it is at least half of them)."""

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
        if obj.get("version") != CATALOG_VERSION:  # another version's statistics mean other things: rebuild
            raise ValueError(f"catalog format {obj.get('version')}, this version reads {CATALOG_VERSION}")
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
# building


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def open_readonly(db_path: str | Path, wait: BusyWait | None = None) -> apsw.Connection:
    """A plain read-only apsw connection (trusted, offline use only) that waits for writers within ``wait``'s bound.
    Raises `DatabaseError` (cause and fix) if unopenable, `DatabaseBusy` if a writer held its lock too long."""
    return connect_readonly(db_path, wait)


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
            quantiles = tuple(s[min(len(s) - 1, math.floor(p * (len(s) - 1) + 1e-9))] for p in QUANTILE_LEVELS)
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


def build_catalog(db_path: str | Path, *, progress: Callable[[int, int, str], None] | None = None,
                  wait: BusyWait | None = None) -> Catalog:
    """Scan ``db_path`` (read-only, one read transaction) and return its `Catalog`; ``progress(done, total, table)``
    is called before each table. Raises `DatabaseError` if it cannot be read, `DatabaseBusy` if a writer held its
    lock past the wait."""
    t0 = time.perf_counter()
    path = Path(db_path).resolve()
    conn = open_readonly(path, wait)
    try:
        conn.execute("BEGIN").fetchall()  # statistics and fingerprint from one snapshot of a live database
        fp = {"path": str(path), "version": CATALOG_VERSION, **data_fingerprint(conn)}
        schema = conn.execute(
            "SELECT type, name, rootpage, sql FROM sqlite_schema WHERE type IN ('table', 'view') ORDER BY rowid"
        ).fetchall()
        tables = []
        views = []
        wanted = [r for r in schema if r[0] == "table" and not r[1].startswith("sqlite_")
                  and not (r[3] or "").upper().startswith("CREATE VIRTUAL")]
        for typ, name, root, sql in schema:
            if typ == "view":
                views.append((name, sql or ""))
        for i, (_typ, name, root, sql) in enumerate(wanted):
            if progress is not None:
                progress(i, len(wanted), name)
            try:
                tables.append(_table_stats(conn, name, root, sql or ""))
            except apsw.BusyError:
                raise (wait or BusyWait()).busy_error(path) from None
            except apsw.Error as exc:
                why = explain_error(exc, path) or f"{db_path}: cannot read table {name!r}: {exc}"
                raise DatabaseError(why) from exc
        if progress is not None:
            progress(len(wanted), len(wanted), "")
    finally:
        conn.close()  # ends the read transaction
    return Catalog(
        db_path=str(path),
        fingerprint=fp,
        tables=tuple(tables),
        views=tuple(views),
        build_seconds=round(time.perf_counter() - t0, 4),
    )
