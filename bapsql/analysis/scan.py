"""Out-of-core scan of trajectory logs into running aggregates (issue 33): memory bounded by clusters and tasks.

`scan_runs(run_dirs)` streams every episodes file, then every turns file, as Parquet record batches with column
projection (only the columns the analysis reads; answer/SQL/turn text are never touched) and string columns read
dictionary-encoded; each batch is conformed to the log schema exactly as `bapsql.analysis.load` conforms a whole
file (partition values from ``method=``/``budget=`` folders, `DEFAULTS` for absent columns, the same errors for
unreadable files, missing required columns and uncastable values), normalised (``method`` carries its condition,
``gold`` becomes the empty-gold flag) and folded into an `EpisodeAccumulator` / `TurnAccumulator`, then dropped.
Small batches (many small files, as the trajectory writer leaves them) are coalesced to `BATCH_ROWS` first. The
notes equal `load_runs`' notes. A `bapsql.progress.Progress` bar counts the rows scanned (from the files' footers).

`aggregate_logs(logs)` folds already loaded frames (`RunLogs`) through the same accumulators, so `summarize(logs)`
and the scan compute every statistic the same way. Both return an `AggregateSource`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from bapsql.analysis.accumulate import EPISODE_INPUT, TURN_INPUT, EpisodeAccumulator, TurnAccumulator
from bapsql.analysis.diagnostics import ladder_budgets
from bapsql.analysis.from_aggregates import AggregateSource
from bapsql.analysis.load import (
    CORE_COLUMNS,
    EPISODE_COLUMNS,
    NO_ROWS,
    NO_TURNS_NOTE,
    TURN_COLUMNS,
    TURN_REQUIRED,
    RunFiles,
    RunLogs,
    schema_field,
    absent_note,
    cast_column,
    check_columns,
    clash_note,
    condition_label,
    default_value,
    gold_is_empty,
    null_error,
    open_parquet,
    partition_values,
    run_files,
    unreadable_error,
    version_note,
)
from bapsql.errors import RunLogError
from bapsql.logs.schema import EPISODES_SCHEMA, TURNS_SCHEMA
from bapsql.progress import Progress

BATCH_ROWS = 1 << 16  # rows per folded batch (the lowest peak RSS of 2^15..2^17 on a 457k-episode file)
# What the scan reads of an episodes file: the core columns (checked for nulls) and what the statistics use.
SCAN_EPISODE_COLUMNS: tuple[str, ...] = tuple(
    c for c in EPISODE_COLUMNS
    if c in CORE_COLUMNS or c in EPISODE_INPUT or c in ("schema_version", "condition", "gold")
)
SCAN_TURN_COLUMNS: tuple[str, ...] = tuple(c for c in TURN_COLUMNS if c in TURN_INPUT or c == "condition")
_GOLD_CACHE_LIMIT = 1 << 16


class LineConsole:
    """A console for `Progress` that hands each plain progress line to a callback (``is_terminal`` false)."""

    is_terminal = False

    def __init__(self, emit: Callable[[str], None]) -> None:
        self.emit = emit

    def print(self, text: str) -> None:
        self.emit(str(text))


def _dictionary(array: pa.Array) -> tuple[np.ndarray, list]:
    """``(indices (N,) int64 with -1 for null, dictionary values as Python objects)`` of any array."""
    if not pa.types.is_dictionary(array.type):
        array = pc.dictionary_encode(array)
    return array.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64), array.dictionary.to_pylist()


_STRINGS = pa.dictionary(pa.int32(), pa.string())  # how the scan holds every string column


def _constant(value: object, n: int, type_: pa.DataType) -> pa.Array:
    """``n`` copies of ``value`` (None: nulls) as ``type_``; strings dictionary-encoded."""
    if pa.types.is_string(type_):
        indices = pa.nulls(n, pa.int32()) if value is None else pa.array(np.zeros(n, np.int32))
        return pa.DictionaryArray.from_arrays(indices, pa.array([] if value is None else [value], pa.string()))
    if value is None:
        return pa.nulls(n, type=type_)
    return pa.array(np.full(n, value), type=type_)


class _Normaliser:
    """Conforms and normalises the batches of one table; collects what the notes need."""

    def __init__(self, files: RunFiles, schema: pa.Schema, columns: Sequence[str], expected: Sequence[str],
                 required: Sequence[str]) -> None:
        self.files, self.schema, self.columns = files, schema, tuple(columns)
        self.expected, self.required = tuple(expected), tuple(required)
        self.absent: dict[str, int] = {}
        self.nulls: set[str] = set()
        self.clashes = 0
        self.newest: int | None = None
        self._gold: dict[str, bool | None] = {}

    def batches(self, file: Path, batch_rows: int) -> Iterator[dict[str, pa.Array]]:
        """The conformed columns of ``file``, batch by batch (`bapsql.analysis.load` semantics)."""
        root = self.files.root_of[file]
        names = set(open_parquet(file).schema_arrow.names)
        strings = [c for c in self.columns if c in names and pa.types.is_string(schema_field(self.schema, c).type)]
        parquet = open_parquet(file, read_dictionary=strings)
        partitions = partition_values(file, self.files)
        check_columns(file, names, partitions, self.expected, self.required, self.absent)
        read = [c for c in self.columns if c in names]
        try:
            # one thread: decoding threads keep their own allocator heaps (measured: ~+20 % peak RSS, no faster on
            # two cores)
            for batch in parquet.iter_batches(batch_size=batch_rows, columns=read, use_threads=False):
                yield self._conform(file, root, batch, names, partitions)
        except (OSError, pa.ArrowInvalid) as exc:
            raise unreadable_error(file, exc) from exc

    def _conform(self, file: Path, root: Path, batch: pa.RecordBatch, names: set[str],
                 partitions: dict[str, str]) -> dict[str, pa.Array]:
        out: dict[str, pa.Array] = {}
        n = batch.num_rows
        for name in self.columns:
            type_ = schema_field(self.schema, name).type
            if name in names:
                column = batch.column(batch.schema.get_field_index(name))
                if pa.types.is_string(type_) and not pa.types.is_dictionary(column.type):
                    column = cast_column(file, name, column, type_).dictionary_encode()
                want = _STRINGS if pa.types.is_string(type_) else type_
                out[name] = column if column.type == want else cast_column(file, name, column, want)
            elif name in partitions:
                out[name] = _constant(partitions[name], n, type_)
            else:
                out[name] = _constant(default_value(name, root), n, type_)
        return out

    def labels(self, columns: dict[str, pa.Array]) -> pa.Array:
        """The ``method`` labels with their condition (`condition_label`), dictionary-encoded; counts clashes."""
        m_idx, m_vals = _dictionary(columns["method"])
        c_idx, c_vals = _dictionary(columns["condition"])
        pairs, inverse, counts = np.unique(m_idx * (len(c_vals) + 1) + c_idx + 1, return_inverse=True,
                                           return_counts=True)
        labels = []
        for key, count in zip(pairs.tolist(), counts.tolist()):
            m, c = divmod(key, len(c_vals) + 1)
            label, _, clash = condition_label(str(m_vals[m]) if m >= 0 else "", c_vals[c - 1] if c else None)
            labels.append(label)
            self.clashes += count if clash else 0
        return pa.DictionaryArray.from_arrays(pa.array(inverse.reshape(-1).astype(np.int32)), pa.array(labels))

    def empty_gold(self, gold: pa.Array) -> pa.Array:
        """Per episode `gold_is_empty` (null where no gold is logged); each distinct gold text parsed once."""
        if gold.null_count == len(gold):
            return pa.nulls(len(gold), pa.bool_())
        idx, values = _dictionary(gold)
        if len(self._gold) > _GOLD_CACHE_LIMIT:
            self._gold.clear()
        flags = []
        for text in values:
            if text not in self._gold:
                self._gold[text] = gold_is_empty(text)
            flags.append(self._gold[text])
        return pc.take(pa.array(flags + [None], pa.bool_()), pa.array(np.where(idx < 0, len(values), idx)))

    def episodes(self, columns: dict[str, pa.Array]) -> pa.RecordBatch:
        """Conformed episode columns → the `EPISODE_INPUT` batch; notes the core columns with nulls and the newest
        schema version."""
        for name in CORE_COLUMNS:
            if columns[name].null_count:
                self.nulls.add(name)
        version = pc.max(columns["schema_version"]).as_py()
        if version is not None:
            self.newest = max(self.newest or version, version)
        out = {**columns, "method": self.labels(columns), "empty_gold": self.empty_gold(columns["gold"])}
        return pa.RecordBatch.from_arrays([out[c] for c in EPISODE_INPUT], names=list(EPISODE_INPUT))

    def turns(self, columns: dict[str, pa.Array]) -> pa.RecordBatch:
        """Conformed turn columns → the `TURN_INPUT` batch."""
        out = {**columns, "method": self.labels(columns)}
        return pa.RecordBatch.from_arrays([out[c] for c in TURN_INPUT], names=list(TURN_INPUT))


def _coalesced(batches: Iterator[pa.RecordBatch], rows: int) -> Iterator[pa.RecordBatch]:
    """Join consecutive small batches into batches of at least ``rows`` rows (the last may be smaller)."""
    def joined(pending: list[pa.RecordBatch]) -> pa.RecordBatch:  # dictionaries are unified on the way
        return pending[0] if len(pending) == 1 else pa.Table.from_batches(pending).combine_chunks().to_batches()[0]

    pending: list[pa.RecordBatch] = []
    size = 0
    for batch in batches:
        pending.append(batch)
        size += batch.num_rows
        if size >= rows:
            yield joined(pending)
            pending, size = [], 0
    if pending:
        yield joined(pending)


def _rows(files: Sequence[Path]) -> int:
    total = 0
    for f in files:
        try:
            total += pq.read_metadata(f).num_rows
        except (OSError, pa.ArrowException) as exc:
            raise unreadable_error(f, exc) from exc
    return total


def _scan(files: Sequence[Path], normaliser: _Normaliser, finish: Callable[[dict[str, pa.Array]], pa.RecordBatch],
          bar: Progress, batch_rows: int) -> Iterator[pa.RecordBatch]:
    for file in files:
        for columns in normaliser.batches(file, batch_rows):
            bar.advance(len(columns["method"]))
            yield finish(columns)
        pa.default_memory_pool().release_unused()  # a file's reader buffers go back before the next file's


def scan_runs(run_dirs: Sequence[str | Path], *, console: Any = None, batch_rows: int = BATCH_ROWS,
              vm_step_budgets: dict[str, int] | None = None) -> AggregateSource:
    """Scan the runs' episodes and turns into an `AggregateSource`. ``console``: where the progress bar goes (a
    rich console: a bar on a terminal, plain lines otherwise; a `LineConsole` for a callback; None: silent).
    Raises `RunLogError` as `load_runs` does."""
    files = run_files(run_dirs)
    episodes = _Normaliser(files, EPISODES_SCHEMA, SCAN_EPISODE_COLUMNS, EPISODE_COLUMNS, CORE_COLUMNS)
    turns = _Normaliser(files, TURNS_SCHEMA, SCAN_TURN_COLUMNS, TURN_COLUMNS, TURN_REQUIRED)
    acc = EpisodeAccumulator()
    turn_acc = TurnAccumulator(ladder_budgets("vm_steps") if vm_step_budgets is None else vm_step_budgets)
    with Progress(console, "scanning episodes", _rows(files.episodes)) as bar:
        for batch in _coalesced(_scan(files.episodes, episodes, episodes.episodes, bar, batch_rows), batch_rows):
            acc.add(batch)
    if files.turns:
        with Progress(console, "scanning turns", _rows(files.turns)) as bar:
            for batch in _coalesced(_scan(files.turns, turns, turns.turns, bar, batch_rows), batch_rows):
                turn_acc.add(batch)
    pa.default_memory_pool().release_unused()  # hand the readers' buffers back before the report is drawn
    if acc.episodes == 0:
        raise RunLogError(NO_ROWS)
    notes = [absent_note(episodes.absent, len(files.episodes)),
             clash_note(episodes.clashes) if episodes.clashes else None, version_note(episodes.newest),
             None if files.turns else NO_TURNS_NOTE]
    if episodes.nulls:
        raise null_error([c for c in CORE_COLUMNS if c in episodes.nulls])
    return AggregateSource(acc.finish(turn_acc), run_dirs=files.run_dirs, notes=tuple(n for n in notes if n),
                           episode_files=len(files.episodes), turn_files=len(files.turns))


def aggregate_logs(logs: RunLogs, *, batch_rows: int = BATCH_ROWS,
                   vm_step_budgets: dict[str, int] | None = None) -> AggregateSource:
    """Fold loaded frames (already conformed and labelled by `load_runs`) into an `AggregateSource`."""
    acc = EpisodeAccumulator()
    ep = logs.episodes
    frame = ep.assign(**{c: None for c in EPISODE_INPUT if c not in ep})[list(EPISODE_INPUT)]
    for batch in pa.Table.from_pandas(frame, preserve_index=False).to_batches(batch_rows):
        acc.add(batch)
    turn_acc = TurnAccumulator(ladder_budgets("vm_steps") if vm_step_budgets is None else vm_step_budgets)
    if len(logs.turns):
        tu = logs.turns.assign(**{c: None for c in TURN_INPUT if c not in logs.turns})[list(TURN_INPUT)]
        for batch in pa.Table.from_pandas(tu, preserve_index=False).to_batches(batch_rows):
            turn_acc.add(batch)
    return AggregateSource(acc.finish(turn_acc), run_dirs=logs.run_dirs, notes=logs.notes,
                           episode_files=logs.episode_files, turn_files=logs.turn_files)
