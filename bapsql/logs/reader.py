"""Read trajectory logs back: one or many run directories → one pyarrow Table or pandas DataFrame.

Contract: `read_table(run_dirs, "episodes" | "turns")` returns a table with exactly the current schema
(`EPISODES_SCHEMA` / `TURNS_SCHEMA`, columns in schema order), whatever schema version wrote each file: a missing
nullable column is filled with nulls, columns the current schema no longer has are dropped, and the partition
columns (method, budget) come from the ``key=value`` folders. A run directory that does not exist or holds no files
of the table, or a file lacking a non-nullable column, raises `RunLogError`. ``episode_ids`` keeps only the rows of
those episodes (a file none of them is in is skipped after reading its ``episode_id`` column alone). Hidden or
temporary files (``.part-*.tmp``) are never read. The same folders open directly in DuckDB
(``read_parquet('RUN/episodes/**/*.parquet', hive_partitioning=1)``) and polars (``scan_parquet(...,
hive_partitioning=True)``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Collection, Iterable, Sequence

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from bapsql.errors import RunLogError
from bapsql.logs.schema import SCHEMA_VERSION
from bapsql.logs.writer import TABLES


def _as_dirs(run_dirs: str | Path | Iterable[str | Path]) -> list[Path]:
    if isinstance(run_dirs, (str, Path)):
        return [Path(run_dirs)]
    return [Path(d) for d in run_dirs]


def part_files(run_dir: str | Path, table: str) -> list[Path]:
    """The visible part files of ``table`` under ``run_dir``, in a stable order (partition, then part number)."""
    root = Path(run_dir) / table
    if not root.is_dir():
        return []
    return sorted(p for p in root.rglob("*.parquet")
                  if not any(part.startswith((".", "_")) for part in p.relative_to(root).parts))


def _partition_values(path: Path, root: Path) -> dict[str, str]:
    values = {}
    for part in path.relative_to(root).parts[:-1]:
        key, sep, value = part.partition("=")
        if sep:
            values[key] = value
    return values


def _conform(path: Path, root: Path, schema: pa.Schema, names: Sequence[str],
             episode_ids: pa.Array | None = None) -> pa.Table | None:
    """Read ``path`` and return the columns ``names`` cast to ``schema`` (filling nulls / partition values); with
    ``episode_ids``, only their rows (None when the file has none of them)."""
    present = set(pq.read_schema(path).names)
    keep = None
    if episode_ids is not None:
        keep = pc.is_in(pq.read_table(path, columns=["episode_id"]).column("episode_id"), value_set=episode_ids)
        if not pc.any(keep).as_py():
            return None
    raw = pq.read_table(path, columns=[n for n in names if n in present])
    if keep is not None:
        raw = raw.filter(keep)
    partition = _partition_values(path, root)
    arrays = []
    for name in names:
        field = schema.field(name)
        if name in present:
            try:
                arrays.append(raw.column(name).cast(field.type))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
                raise RunLogError(f"{path}: column {name!r} cannot be read as {field.type}: {exc}") from exc
        elif name in partition:
            arrays.append(pa.array([partition[name]] * raw.num_rows, type=field.type))
        elif field.nullable:
            arrays.append(pa.nulls(raw.num_rows, type=field.type))
        else:
            raise RunLogError(f"{path}: non-nullable column {name!r} is missing (schema v{SCHEMA_VERSION})")
    return pa.Table.from_arrays(arrays, schema=pa.schema([schema.field(n) for n in names]))


def read_table(run_dirs: str | Path | Iterable[str | Path], table: str = "episodes", *,
               columns: Sequence[str] | None = None, episode_ids: Collection[str] | None = None) -> pa.Table:
    """All rows of ``table`` ("episodes" or "turns") of every run in ``run_dirs``, conformed to the current schema
    (module docstring). ``columns`` selects a subset (in the order given); ``episode_ids`` the rows of those
    episodes."""
    if table not in TABLES:
        raise RunLogError(f"unknown log table {table!r}; expected one of {sorted(TABLES)}")
    schema = TABLES[table]
    names = list(columns) if columns is not None else schema.names
    unknown = [n for n in names if n not in schema.names]
    if unknown:
        raise RunLogError(f"unknown {table} column(s) {unknown}; the schema has {schema.names}")
    ids = None if episode_ids is None else pa.array(sorted(episode_ids), type=pa.string())
    pieces = []
    for run_dir in _as_dirs(run_dirs):
        if not run_dir.is_dir():
            raise RunLogError(f"{run_dir}: no such run directory")
        files = part_files(run_dir, table)
        if not files:
            raise RunLogError(f"{run_dir}: no {table}/**/*.parquet files; is this a bapsql run directory?")
        pieces.extend(p for f in files if (p := _conform(f, run_dir / table, schema, names, ids)) is not None)
    if not pieces:
        return pa.Table.from_pylist([], schema=pa.schema([schema.field(n) for n in names]))
    return pa.concat_tables(pieces)


def read_episodes(run_dirs: str | Path | Iterable[str | Path], *, columns: Sequence[str] | None = None):
    """The episodes of ``run_dirs`` as a pandas DataFrame (one row per episode)."""
    return read_table(run_dirs, "episodes", columns=columns).to_pandas()


def read_turns(run_dirs: str | Path | Iterable[str | Path], *, columns: Sequence[str] | None = None):
    """The turns of ``run_dirs`` as a pandas DataFrame. A turn written twice (an episode re-run after a crash between
    its turns and its episode row were flushed) is kept once: the last written."""
    frame = read_table(run_dirs, "turns", columns=columns).to_pandas()
    key = [c for c in ("run", "episode_id", "turn") if c in frame.columns]
    if len(key) == 3:
        frame = frame.drop_duplicates(subset=key, keep="last").reset_index(drop=True)
    return frame
