"""Buffered, atomic Parquet writer of trajectory logs (DESIGN §6).

Layout of one run (hive partitioning by `PARTITION_COLUMNS`; the partition columns live in the path, not the file)::

    RUN_DIR/episodes/method=M/budget=B/part-00000.parquet
    RUN_DIR/turns/method=M/budget=B/part-00000.parquet

Contract:

- Rows are dicts validated on arrival against `EPISODES_SCHEMA` / `TURNS_SCHEMA`: an unknown column, a missing or
  null non-nullable column, a value of the wrong type, a ``failure``/``action`` outside its vocabulary, or a
  method/budget that is not a safe path name raises `LogRowError` naming the column. ``schema_version`` and ``run``
  are filled in when absent; a missing nullable column is null. `validate_row` is the definition; the writer takes
  a fast path (`_RowPacker`) that accepts exactly the rows it accepts and hands every other row to it, so errors and
  conversions (numpy scalars, ints in float columns) are the same.
- Files appear atomically: each is written under a hidden temporary name (``.part-N.parquet.tmp``, created with
  ``O_EXCL`` so concurrent writers never pick the same number) in its final folder, fsynced, then ``os.replace``d;
  readers (DuckDB, polars, pyarrow) never see a partial ``part-*.parquet``.
- A flush writes the turns before the episodes, so an episode row visible on disk implies its turns are too; a
  resumed sweep skips the ids from `existing_episode_ids` (ids are deterministic: `episode_id`).
"""

from __future__ import annotations

import functools
import hashlib
import json
import numbers
import operator
import os
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bapsql.errors import ConfigError, LogRowError
from bapsql.logs.schema import (
    ACTIONS,
    EPISODES_SCHEMA,
    FAILURE_KINDS,
    PARTITION_COLUMNS,
    SCHEMA_VERSION,
    TURNS_SCHEMA,
)

TABLES: dict[str, pa.Schema] = {"episodes": EPISODES_SCHEMA, "turns": TURNS_SCHEMA}
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")
_PART = re.compile(r"^\.?part-(\d+)\.parquet(?:\.tmp)?$")
_VOCABULARIES = {"failure": FAILURE_KINDS, "action": ACTIONS}
_INT_BOUNDS = {pa.int16(): 2**15, pa.int32(): 2**31, pa.int64(): 2**63}


def episode_id(run: str, method: str, budget: str, seed: int, task_id: str, sample: int = 0) -> str:
    """A stable id (20 hex digits) of one episode: the same arguments give the same id on every machine."""
    key = json.dumps([run, method, budget, int(seed), task_id, int(sample)], separators=(",", ":"))
    return hashlib.blake2b(key.encode("utf-8"), digest_size=10).hexdigest()


def file_schema(table: str) -> pa.Schema:
    """The schema stored inside each part file of ``table`` (the full schema minus the partition columns)."""
    schema = TABLES[table]
    return pa.schema([f for f in schema if f.name not in PARTITION_COLUMNS], metadata={
        b"bapsql.schema_version": str(SCHEMA_VERSION).encode(), b"bapsql.table": table.encode()})


@dataclass(frozen=True)
class _Column:
    """What `validate_row` checks for one column (precomputed once per schema: validation runs per row)."""

    name: str
    kind: str  # bool | int | float | str | other
    nullable: bool
    type: pa.DataType
    bound: int = 2**63
    vocabulary: tuple[str, ...] | None = None
    partition: bool = False


def _columns(schema: pa.Schema) -> tuple[_Column, ...]:
    out = []
    for f in schema:
        tp = f.type
        kind = ("bool" if pa.types.is_boolean(tp) else "int" if pa.types.is_integer(tp) else
                "float" if pa.types.is_floating(tp) else "str" if pa.types.is_string(tp) else "other")
        out.append(_Column(f.name, kind, f.nullable, tp, _INT_BOUNDS.get(tp, 2**63), _VOCABULARIES.get(f.name),
                           f.name in PARTITION_COLUMNS))
    return tuple(out)


_COLUMNS = {table: _columns(schema) for table, schema in TABLES.items()}
_NAMES = {table: frozenset(schema.names) for table, schema in TABLES.items()}


def _check_value(table: str, col: _Column, value: Any) -> Any:
    """``value`` if it fits ``col`` (ints for integer columns, numbers for floats, ...), else `LogRowError`."""
    if value is None:
        if not col.nullable:
            raise LogRowError(f"{table} row: column {col.name!r} is not nullable but got None")
        return None
    vt, kind = type(value), col.kind
    if kind == "str":
        ok = vt is str or isinstance(value, str)
    elif kind == "float":
        ok = vt is float or (isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_)))
        value = float(value) if ok else value
    elif kind == "int":
        ok = vt is int or (isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_)))
        if ok:
            value = int(value)
            if not -col.bound <= value < col.bound:
                raise LogRowError(f"{table} row: column {col.name!r} value {value} does not fit {col.type}")
    elif kind == "bool":
        ok = vt is bool or isinstance(value, np.bool_)
        value = bool(value) if ok else value
    else:
        ok = True
    if not ok:
        raise LogRowError(f"{table} row: column {col.name!r} expects {col.type}, got {vt.__name__} {value!r:.80}")
    if col.vocabulary is not None and value not in col.vocabulary:
        raise LogRowError(f"{table} row: column {col.name!r} value {value!r} is not one of {list(col.vocabulary)}")
    if col.partition and not _SAFE_NAME.match(value):
        raise LogRowError(f"{table} row: column {col.name!r} value {value!r} must be a safe path name "
                          "(letters, digits, _ . + -; starting with a letter or digit)")
    return value


def _checker(table: str, col: _Column) -> Callable[[Any], Any]:
    """One column's check as a closure, with the type dispatch resolved once: exact builtin types take a fast path
    that accepts exactly what `_check_value` accepts; everything else (None, numpy scalars, wrong types) falls back
    to `_check_value`, which raises the same `LogRowError`."""
    slow = functools.partial(_check_value, table, col)
    if col.vocabulary is not None or col.partition:
        vocabulary, partition, safe = col.vocabulary, col.partition, _SAFE_NAME.match

        def check_str_vocab(value: Any) -> Any:
            if type(value) is str and (vocabulary is None or value in vocabulary) and (not partition or safe(value)):
                return value
            return slow(value)
        return check_str_vocab if col.kind == "str" else slow
    if col.kind == "str":
        return lambda value: value if type(value) is str else slow(value)
    if col.kind == "float":
        return lambda value: value if type(value) is float else slow(value)
    if col.kind == "bool":
        return lambda value: value if type(value) is bool else slow(value)
    if col.kind == "int":
        lo, hi = -col.bound, col.bound
        return lambda value: value if type(value) is int and lo <= value < hi else slow(value)
    return slow


_CHECKERS = {table: tuple((c.name, _checker(table, c)) for c in cols) for table, cols in _COLUMNS.items()}
_REQUIRED = {table: frozenset(c.name for c in cols if not c.nullable) for table, cols in _COLUMNS.items()}


def validate_row(table: str, row: Mapping[str, Any], run_name: str | None = None) -> dict[str, Any]:
    """A complete, checked copy of ``row`` for ``table`` ("episodes" or "turns"), or `LogRowError` naming the
    offending column. Fills ``schema_version`` and (when ``run_name`` is given) ``run``; absent nullable columns are
    None."""
    names = _NAMES[table]
    if not names.issuperset(row):
        unknown = [k for k in row if k not in names]
        raise LogRowError(f"{table} row: unknown column(s) {sorted(unknown)}; the {table} schema v{SCHEMA_VERSION} "
                          f"has {TABLES[table].names}")
    if "schema_version" not in row or (run_name is not None and "run" not in row):
        row = {"schema_version": SCHEMA_VERSION, **({"run": run_name} if run_name is not None else {}), **row}
    if run_name is not None and row["run"] != run_name:
        raise LogRowError(f"{table} row: column 'run' is {row['run']!r} but this writer writes run {run_name!r}")
    if not row.keys() >= _REQUIRED[table]:
        missing = [c.name for c in _COLUMNS[table] if not c.nullable and c.name not in row]
        raise LogRowError(f"{table} row: missing non-nullable column(s) {missing}")
    get = row.get
    return {name: check(get(name)) for name, check in _CHECKERS[table]}


class _RowPacker:
    """Validates rows of one table as `validate_row` does and packs them as value tuples in schema order.

    Fast path, a handful of C-level calls per row instead of one Python check per column: read the values with
    ``map(row.get, ...)``, take their exact types, and look that type signature up among the signatures already
    proven valid (every value exactly the builtin type of its column, or None where the column is nullable). A known
    signature leaves the range of its integer values (``bit_length`` at most 15/31/63 for int16/32/64), the
    vocabulary and the ``run`` name to check. Anything else (a new signature, numpy scalars, an int in a float
    column, an int at or past a bound, a bad value) goes through `validate_row`, which converts it or raises its
    `LogRowError`.
    """

    _FAST = {"bool": bool, "int": int, "float": float, "str": str}

    def __init__(self, table: str, run_name: str):
        cols = _COLUMNS[table]
        self.table, self.run_name, self._cols = table, run_name, cols
        self.names = tuple(c.name for c in cols)
        self._names = _NAMES[table]
        self._defaults = tuple(SCHEMA_VERSION if c.name == "schema_version" else run_name if c.name == "run" else None
                               for c in cols)
        self._run = self.names.index("run")
        self._allowed = tuple(frozenset({self._FAST.get(c.kind, object)} | ({type(None)} if c.nullable else set()))
                              for c in cols)
        # per proven signature: (getter of its non-null integer values, their largest allowed bit lengths)
        self._good: dict[tuple[type, ...], tuple[Callable[[tuple], tuple], tuple[int, ...]]] = {}
        (self._vocab_at, self._vocab), = [(i, frozenset(c.vocabulary)) for i, c in enumerate(cols) if c.vocabulary]
        self.method_at, self.budget_at = (self.names.index(n) for n in PARTITION_COLUMNS)

    def _learn(self, sig: tuple[type, ...]) -> tuple[Callable[[tuple], tuple], tuple[int, ...]] | None:
        if not all(t in allowed for t, allowed in zip(sig, self._allowed)):
            return None
        at = [i for i, (c, t) in enumerate(zip(self._cols, sig)) if c.kind == "int" and t is int]
        getter = operator.itemgetter(*at) if len(at) > 1 else (lambda values, at=tuple(at): tuple(values[i] for i in at))
        self._good[sig] = fast = (getter, tuple(self._cols[i].bound.bit_length() - 1 for i in at))
        return fast

    def pack(self, row: Mapping[str, Any]) -> tuple:
        """The validated values of ``row`` in schema order, or `LogRowError` (see `validate_row`)."""
        if self._names.issuperset(row):
            values = tuple(map(row.get, self.names, self._defaults))
            sig = tuple(map(type, values))
            fast = self._good.get(sig) or self._learn(sig)
            if (fast is not None and values[self._run] == self.run_name and values[self._vocab_at] in self._vocab
                    and all(map(operator.le, map(int.bit_length, fast[0](values)), fast[1]))):
                return values
        return tuple(validate_row(self.table, row, self.run_name).values())


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_part(folder: Path, table: pa.Table) -> Path:
    """Write ``table`` atomically as the next free ``part-NNNNN.parquet`` of ``folder``; returns the final path."""
    folder.mkdir(parents=True, exist_ok=True)
    used = [int(m.group(1)) for p in folder.iterdir() if (m := _PART.match(p.name))]
    n = max(used, default=-1) + 1
    while True:
        final, tmp = folder / f"part-{n:05d}.parquet", folder / f".part-{n:05d}.parquet.tmp"
        try:
            fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:  # another writer holds this number
            n += 1
            continue
        if final.exists():  # another writer took this number and already finished
            os.close(fd)
            tmp.unlink()
            n += 1
            continue
        break
    try:
        with os.fdopen(fd, "wb") as fh:
            pq.write_table(table, fh, compression="zstd")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(folder)
    return final


class TrajectoryWriter:
    """Buffers episode and turn rows of one run and writes them as partitioned Parquet files (module docstring).

    ``flush_every``: flush once this many rows (episodes + turns) are buffered. Use as a context manager, or call
    `close` (which flushes). Rows are validated when added, so a bad row fails at its source.
    """

    def __init__(self, run_dir: str | Path, run_name: str, *, flush_every: int = 2048):
        if flush_every < 1:
            raise ConfigError(f"flush_every must be at least 1, got {flush_every}")
        if not run_name:
            raise LogRowError("run_name must be a non-empty string")
        self.run_dir = Path(run_dir)
        self.run_name = run_name
        self.flush_every = flush_every
        self._packers = {table: _RowPacker(table, run_name) for table in TABLES}
        self._buffers: dict[tuple[str, str, str], list[tuple]] = {}
        self._buffered = 0
        self.rows_written: dict[str, int] = {"episodes": 0, "turns": 0}
        self.files: list[Path] = []
        self._closed = False

    def _pack(self, table: str, row: Mapping[str, Any]) -> tuple[tuple[str, str, str], tuple]:
        """(buffer key, validated values) of one row; raises `LogRowError` and buffers nothing."""
        if self._closed:
            raise LogRowError(f"the trajectory writer of run {self.run_name!r} is closed")
        packer = self._packers[table]
        values = packer.pack(row)
        key = (table, values[packer.method_at], values[packer.budget_at])
        if key not in self._buffers:  # a new partition: its names become a path (known keys were checked)
            for value in key[1:]:
                if not _SAFE_NAME.match(value):
                    validate_row(table, row, self.run_name)  # raises the safe-path-name error
        return key, values

    def _buffer(self, packed: Iterable[tuple[tuple[str, str, str], tuple]]) -> None:
        for key, values in packed:
            self._buffers.setdefault(key, []).append(values)
            self._buffered += 1
        if self._buffered >= self.flush_every:
            self.flush()

    def add_turn(self, row: Mapping[str, Any]) -> None:
        """Buffer one turns row."""
        self._buffer([self._pack("turns", row)])

    def add_episode(self, row: Mapping[str, Any], turns: Iterable[Mapping[str, Any]] = ()) -> None:
        """Buffer one episodes row after its ``turns`` rows; if any of them is invalid none is buffered."""
        packed = [self._pack("turns", t) for t in turns]
        packed.append(self._pack("episodes", row))
        self._buffer(packed)

    def flush(self) -> list[Path]:
        """Write every buffered row (turns first, then episodes); returns the files written."""
        written = []
        for table in ("turns", "episodes"):
            schema, names = file_schema(table), self._packers[table].names
            keep = [i for i, name in enumerate(names) if name not in PARTITION_COLUMNS]
            for key in sorted(k for k in self._buffers if k[0] == table):
                rows = self._buffers[key]
                _, method, budget = key
                columns = list(zip(*rows))
                arrow = pa.Table.from_arrays([pa.array(columns[i], type=schema.field(names[i]).type) for i in keep],
                                             schema=schema)
                folder = self.run_dir / table / f"method={method}" / f"budget={budget}"
                written.append(write_part(folder, arrow))
                self.files.append(written[-1])
                del self._buffers[key]  # only once on disk: a failed write keeps its rows for the next flush
                self._buffered -= len(rows)
                self.rows_written[table] += len(rows)
        return written

    def close(self) -> None:
        """Flush what is buffered; later adds raise."""
        if not self._closed:
            self.flush()
            self._closed = True

    def __enter__(self) -> "TrajectoryWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def existing_episode_ids(run_dir: str | Path) -> set[str]:
    """Ids of the episodes already on disk under ``run_dir`` (empty when the run has none yet), for resuming."""
    root = Path(run_dir) / "episodes"
    if not root.is_dir():
        return set()
    ids: set[str] = set()
    for path in sorted(root.rglob("part-*.parquet")):
        ids.update(pq.read_table(path, columns=["episode_id"]).column("episode_id").to_pylist())
    return ids
