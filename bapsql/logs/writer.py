"""Buffered, atomic Parquet writer of trajectory logs (DESIGN §6).

Layout of one run (hive partitioning by `PARTITION_COLUMNS`; the partition columns live in the path, not the file)::

    RUN_DIR/episodes/method=M/budget=B/part-00000.parquet
    RUN_DIR/turns/method=M/budget=B/part-00000.parquet

Contract:

- Rows are dicts validated on arrival against `EPISODES_SCHEMA` / `TURNS_SCHEMA`: an unknown column, a missing or
  null non-nullable column, a value of the wrong type, a ``failure``/``action`` outside its vocabulary, or a
  method/budget that is not a safe path name raises `LogRowError` naming the column. ``schema_version`` and ``run``
  are filled in when absent; a missing nullable column is null (`bapsql.logs.validate`: `validate_row` is the
  definition, `RowPacker` the fast path the writer takes, with the same results and errors). An episode is buffered
  with its turns or not at all.
- Buffered rows become Arrow record batches every ``ARROW_CHUNK`` rows of a partition, while they are fresh in
  memory; a flush joins a partition's batches into one file.
- Files appear atomically: each is written under a hidden temporary name (``.part-N.parquet.tmp``, created with
  ``O_EXCL`` so concurrent writers never pick the same number) in its final folder, fsynced, then ``os.replace``d;
  readers (DuckDB, polars, pyarrow) never see a partial ``part-*.parquet``.
- Turn text (``completion`` / ``observation``, schema v4): the writer's `TextLogConfig` (``text``; default: keep
  all) decides per episode id whether a turn keeps its text (`bapsql.logs.text.keeps_text`; deterministic, so a
  resumed run keeps the same episodes' text) and caps what it keeps at ``text.max_chars``; dropped text is null.
- A flush writes the turns before the episodes, so an episode row visible on disk implies its turns are too; a
  resumed sweep skips the ids from `existing_episode_ids` (ids are deterministic: `episode_id`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any, Iterable, Mapping

import pyarrow as pa
import pyarrow.parquet as pq

from bapsql.errors import ConfigError, LogRowError
from bapsql.logs.schema import PARTITION_COLUMNS, SCHEMA_VERSION
from bapsql.logs.text import TextLogConfig, apply_text_policy, keeps_text
from bapsql.logs.validate import TABLES, RowPacker, validate_row

__all__ = ["TABLES", "TrajectoryWriter", "episode_id", "existing_episode_ids", "file_schema", "validate_row",
           "write_part"]

_PART = re.compile(r"^\.?part-(\d+)\.parquet(?:\.tmp)?$")


def episode_id(run: str, method: str, budget: str, seed: int, task_id: str, sample: int = 0) -> str:
    """A stable id (20 hex digits) of one episode: the same arguments give the same id on every machine."""
    key = json.dumps([run, method, budget, int(seed), task_id, int(sample)], separators=(",", ":"))
    return hashlib.blake2b(key.encode("utf-8"), digest_size=10).hexdigest()


def file_schema(table: str) -> pa.Schema:
    """The schema stored inside each part file of ``table`` (the full schema minus the partition columns)."""
    schema = TABLES[table]
    return pa.schema([f for f in schema if f.name not in PARTITION_COLUMNS], metadata={
        b"bapsql.schema_version": str(SCHEMA_VERSION).encode(), b"bapsql.table": table.encode()})


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

    ``flush_every``: flush once this many rows (episodes + turns) are buffered. ``text``: which episodes' turns
    keep their completion / observation text (`TextLogConfig`; default: every episode's). Use as a context manager,
    or call `close` (which flushes). Rows are validated when added, so a bad row fails at its source. Each
    partition's rows become Arrow columns every ``ARROW_CHUNK`` rows, while they are fresh in memory; a flush only
    joins the chunks and writes them (converting rows gathered over a long run at close costs ~3× more: cache
    misses).
    """

    ARROW_CHUNK = 1024

    def __init__(self, run_dir: str | Path, run_name: str, *, flush_every: int = 2048,
                 text: TextLogConfig = TextLogConfig()):
        if flush_every < 1:
            raise ConfigError(f"flush_every must be at least 1, got {flush_every}")
        if not run_name:
            raise LogRowError("run_name must be a non-empty string")
        self.run_dir = Path(run_dir)
        self.run_name = run_name
        self.flush_every = flush_every
        self.text = text
        self._packers = {table: RowPacker(table, run_name) for table in TABLES}
        self._buffers: dict[tuple[str, str, str], list[tuple]] = {}  # validated rows not yet in Arrow form
        self._chunks: dict[tuple[str, str, str], list[pa.RecordBatch]] = {}  # rows in Arrow form, not yet written
        self._buffered = 0
        self.rows_written: dict[str, int] = {"episodes": 0, "turns": 0}
        self.files: list[Path] = []
        self._closed = False

    def _check_open(self) -> None:
        if self._closed:
            raise LogRowError(f"the trajectory writer of run {self.run_name!r} is closed")

    def _buffer(self, packed: Iterable[tuple[tuple[str, str, str], tuple]]) -> None:
        for key, values in packed:
            rows = self._buffers.setdefault(key, [])
            rows.append(values)
            self._buffered += 1
            if len(rows) >= self.ARROW_CHUNK:
                self._to_arrow(key)
        if self._buffered >= self.flush_every:
            self.flush()

    def _to_arrow(self, key: tuple[str, str, str]) -> None:
        """Move the buffered rows of ``key`` into one Arrow record batch."""
        table = key[0]
        schema, names = file_schema(table), self._packers[table].names
        columns = list(zip(*self._buffers.pop(key)))
        arrays = [pa.array(columns[i], type=schema.field(name).type)
                  for i, name in enumerate(names) if name not in PARTITION_COLUMNS]
        self._chunks.setdefault(key, []).append(pa.RecordBatch.from_arrays(arrays, schema=schema))

    def _keeps(self, eid: Any) -> bool:
        return keeps_text(eid, self.text) if isinstance(eid, str) else self.text.mode == "all"

    def _text(self, row: Mapping[str, Any], keep: bool) -> Mapping[str, Any]:
        return apply_text_policy(row, keep, self.text.max_chars)

    def add_turn(self, row: Mapping[str, Any]) -> None:
        """Buffer one turns row."""
        self._check_open()
        self._buffer([self._packers["turns"].pack(self._text(row, self._keeps(row.get("episode_id"))))])

    def add_episode(self, row: Mapping[str, Any], turns: Iterable[Mapping[str, Any]] = ()) -> None:
        """Buffer one episodes row after its ``turns`` rows; if any of them is invalid none is buffered."""
        self._check_open()
        pack, text, keep = self._packers["turns"].pack, self._text, self._keeps(row.get("episode_id"))
        packed = [pack(text(t, keep)) for t in turns]
        packed.append(self._packers["episodes"].pack(row))
        self._buffer(packed)

    def flush(self) -> list[Path]:
        """Write every buffered row (turns first, then episodes); returns the files written."""
        written = []
        for key in list(self._buffers):
            self._to_arrow(key)
        for table in ("turns", "episodes"):
            for key in sorted(k for k in self._chunks if k[0] == table):
                _, method, budget = key
                arrow = pa.Table.from_batches(self._chunks[key], schema=file_schema(table))
                folder = self.run_dir / table / f"method={method}" / f"budget={budget}"
                written.append(write_part(folder, arrow))
                self.files.append(written[-1])
                del self._chunks[key]  # only once on disk: a failed write keeps its rows for the next flush
                self._buffered -= arrow.num_rows
                self.rows_written[table] += arrow.num_rows
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
