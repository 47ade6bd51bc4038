"""Reading trajectory logs (Parquet) from run directories into pandas frames for the analysis.

Contract: a run directory holds ``episodes/**/*.parquet`` and optionally ``turns/**/*.parquet``, hive-partitioned
by ``method=``/``budget=`` (`bapsql.logs.schema`). Files may or may not repeat the partition columns. Readers are
tolerant across schema versions: a missing *nullable* column is filled with nulls, a missing required column is an
error naming the file; columns the analysis does not use are never read. Hidden or temporary files (a name or
folder starting with ``.`` or ``_``, as an atomic writer leaves them) are skipped. This module imports nothing from
bapsql but the schema and the error types, so it reads logs from any version or any other system.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence
from urllib.parse import unquote

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from bapsql.errors import RunLogError
from bapsql.logs.schema import EPISODES_SCHEMA, PARTITION_COLUMNS, SCHEMA_VERSION, TURNS_SCHEMA

# The columns the analysis reads (a subset of the schemas; answer/gold JSON and SQL text are never loaded).
EPISODE_COLUMNS: tuple[str, ...] = (
    "schema_version", "run", "method", "budget", "seed", "task_id", "db_id", "sample", "correct", "feasible",
    "success", "official_ex", "reward", "evidence_score", "queries", "result_tokens", "vm_steps", "turns",
    "prompt_tokens", "completion_tokens", "total_tokens", "peak_context", "warnings", "rewrites", "rejections",
    "invalid_actions", "abstained", "breach", "failure",
)
TURN_COLUMNS: tuple[str, ...] = (
    "method", "budget", "seed", "task_id", "db_id", "episode_id", "turn", "action", "warning",
    "est_rows_p50", "est_rows_p95", "est_result_tokens_p50", "est_result_tokens_p95",
    "est_vm_steps_p50", "est_vm_steps_p95", "actual_rows", "actual_result_tokens", "actual_vm_steps",
)


@dataclass(frozen=True)
class RunLogs:
    """Episodes and turns of one or more runs, pooled. ``turns`` is empty (with its columns) when no run has one."""

    episodes: pd.DataFrame
    turns: pd.DataFrame
    run_dirs: tuple[str, ...]
    episode_files: int
    turn_files: int
    notes: tuple[str, ...]


def _parquet_files(root: Path) -> list[Path]:
    if not root.is_dir():
        return []
    files = []
    for f in sorted(root.rglob("*.parquet")):
        rel = f.relative_to(root).parts
        if any(p.startswith((".", "_")) for p in rel):
            continue
        if f.is_file():
            files.append(f)
    return files


def _partition_values(file: Path, root: Path) -> dict[str, str]:
    values = {}
    for part in file.relative_to(root).parts[:-1]:
        key, sep, value = part.partition("=")
        if sep and key in PARTITION_COLUMNS:
            values[key] = unquote(value)
    return values


def _read_conformed(file: Path, root: Path, schema: pa.Schema, columns: Sequence[str]) -> pa.Table:
    """One file → a table with exactly ``columns`` typed as in ``schema`` (nulls for missing nullable columns)."""
    try:
        present = set(pq.read_schema(file).names)
        table = pq.read_table(file, columns=[c for c in columns if c in present])
    except (OSError, pa.ArrowException) as exc:
        raise RunLogError(f"{file}: not a readable Parquet file ({exc}); remove it or rewrite the run's logs") from exc
    partitions = _partition_values(file, root)
    arrays = []
    for name in columns:
        field = schema.field(name)
        if name in present:
            try:
                arrays.append(table.column(name).cast(field.type))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise RunLogError(f"{file}: column {name!r} cannot be read as {field.type}: {exc}") from exc
        elif name in partitions:
            arrays.append(pa.array([partitions[name]] * table.num_rows, type=field.type))
        elif field.nullable or name == "schema_version":
            arrays.append(pa.nulls(table.num_rows, type=field.type))
        else:
            raise RunLogError(
                f"{file}: required column {name!r} is missing; the file does not follow the trajectory-log schema"
            )
    return pa.Table.from_arrays(arrays, schema=pa.schema([schema.field(c).with_nullable(True) for c in columns]))


def _read_table(
    files: list[Path], root_of: dict[Path, Path], schema: pa.Schema, columns: Sequence[str]
) -> pd.DataFrame:
    fields = pa.schema([schema.field(c).with_nullable(True) for c in columns])
    tables = [_read_conformed(f, root_of[f], schema, columns) for f in files]
    table = pa.concat_tables(tables) if tables else fields.empty_table()
    return table.to_pandas()


def load_runs(run_dirs: Sequence[str | Path]) -> RunLogs:
    """Read the episodes (and turns, when present) of every run directory into one pair of frames.

    Raises `RunLogError` when no directory is given, a directory is missing, a directory holds no episode files,
    or a file does not fit the schema.
    """
    if not run_dirs:
        raise RunLogError("no run directory given; pass one or more RUN folders holding episodes/**/*.parquet")
    episode_files: list[Path] = []
    turn_files: list[Path] = []
    root_of: dict[Path, Path] = {}
    for run in run_dirs:
        run_path = Path(run)
        if not run_path.is_dir():
            raise RunLogError(f"run directory not found: {run_path}")
        ep = _parquet_files(run_path / "episodes")
        if not ep:
            raise RunLogError(
                f"{run_path}: no episodes/**/*.parquet files; is this a run directory written by the trajectory writer?"
            )
        tu = _parquet_files(run_path / "turns")
        root_of.update({f: run_path / "episodes" for f in ep})
        root_of.update({f: run_path / "turns" for f in tu})
        episode_files += ep
        turn_files += tu
    episodes = _read_table(episode_files, root_of, EPISODES_SCHEMA, EPISODE_COLUMNS)
    turns = _read_table(turn_files, root_of, TURNS_SCHEMA, TURN_COLUMNS)
    notes = []
    if episodes.empty:
        raise RunLogError("the episode files hold no rows; nothing to analyse")
    versions = episodes["schema_version"].dropna()
    if len(versions) and int(versions.max()) > SCHEMA_VERSION:
        notes.append(
            f"logs use schema version {int(versions.max())}, newer than this reader's {SCHEMA_VERSION}; "
            "only the known columns were read"
        )
    if not turn_files:
        notes.append("no turns table in the runs: estimator coverage is not reported")
    required = [c for c in EPISODE_COLUMNS if not EPISODES_SCHEMA.field(c).nullable and c != "schema_version"]
    nulls = [c for c in required if episodes[c].isna().any()]
    if nulls:
        raise RunLogError(f"episodes have nulls in required column(s) {nulls}; the logs are malformed")
    return RunLogs(
        episodes=episodes.drop(columns=["schema_version"]),
        turns=turns,
        run_dirs=tuple(str(Path(r)) for r in run_dirs),
        episode_files=len(episode_files),
        turn_files=len(turn_files),
        notes=tuple(notes),
    )
