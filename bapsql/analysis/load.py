"""Reading trajectory logs (Parquet) from run directories into pandas frames for the analysis.

Contract: a run directory holds ``episodes/**/*.parquet`` and optionally ``turns/**/*.parquet``, hive-partitioned
by ``method=``/``budget=`` (`bapsql.logs.schema`). Files may or may not repeat the partition columns. Readers are
tolerant across schema versions and systems: an episodes file needs only the `CORE_COLUMNS` (method, budget, seed,
task_id, db_id, correct, feasible, success, total_tokens, queries, result_tokens, vm_steps, turns; missing one is an
error naming the file); every other column the analysis reads is filled with its `DEFAULTS` value when a file lacks
it (``run``: the run folder's name, ``sample``: 0, ``breach``: false, anything else: null, which the report shows
as "—" or leaves out), and `RunLogs.notes` says which columns were absent from how many files. Columns the analysis
does not use are never read. Hidden or temporary files (a name or folder starting with ``.`` or ``_``, as an
atomic writer leaves them) are skipped. This module imports nothing from bapsql but the schema and the error types,
so it reads logs from any version or any other system.

`bapsql.analysis.scan` streams the same files out of core with the same conventions: `run_files`, `check_columns`,
`cast_column`, `default_value`, `condition_label` and the note/error texts live here so both readers agree.

Conditions (DESIGN §4): a method is ``POLICY@CONDITION``. `apply_conditions` makes the ``method`` label carry the
condition whenever it is known: a row whose ``condition`` column is set and whose method has no ``@`` becomes
``method@condition``; a row without a condition takes it from its method's ``@`` suffix. So every statistic, keyed
by method, groups by (policy, condition), with or without the column; `split_method` splits a label for display.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence
from urllib.parse import unquote

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from bapsql.errors import RunLogError
from bapsql.logs.schema import EPISODES_SCHEMA, PARTITION_COLUMNS, SCHEMA_VERSION, TURNS_SCHEMA

# The columns the analysis reads (a subset of the schemas; answer JSON and SQL text are never loaded; the gold JSON
# only to tell empty gold answers, kept as the boolean column ``empty_gold``, null when the logs lack it).
EPISODE_COLUMNS: tuple[str, ...] = (
    "schema_version", "run", "method", "condition", "budget", "seed", "task_id", "db_id", "sample", "correct",
    "feasible", "success", "official_ex", "reward", "evidence_score", "queries", "result_tokens", "vm_steps", "turns",
    "prompt_tokens", "completion_tokens", "total_tokens", "peak_context", "warnings", "rewrites", "rejections",
    "invalid_actions", "abstained", "breach", "failure", "gold",
)
# What every episodes file must hold (DESIGN §7): enough for success, cost and database-cluster statistics.
CORE_COLUMNS: tuple[str, ...] = (
    "method", "budget", "seed", "task_id", "db_id", "correct", "feasible", "success", "total_tokens", "queries",
    "result_tokens", "vm_steps", "turns",
)
RUN_NAME = object()  # DEFAULTS marker: the run folder's name
# Values for non-core columns a file lacks (None = null). Only these three need a value for the analysis to work.
DEFAULTS: dict[str, object] = {"run": RUN_NAME, "sample": 0, "breach": False}
# Fields the analysis reads that an older schema may not declare yet.
_EXTRA_FIELDS: dict[str, pa.Field] = {"condition": pa.field("condition", pa.string())}
TURN_COLUMNS: tuple[str, ...] = (
    "method", "condition", "budget", "seed", "task_id", "db_id", "episode_id", "turn", "action", "warning",
    "est_rows_p50", "est_rows_p95", "est_result_tokens_p50", "est_result_tokens_p95",
    "est_vm_steps_p50", "est_vm_steps_p95", "actual_rows", "actual_result_tokens", "actual_vm_steps",
    "status", "vm_steps_after",
)
# Turn columns read when present (the coverage diagnostic's cap-stopped and preflight-rejected runs), null otherwise.
OPTIONAL_TURN_COLUMNS: tuple[str, ...] = ("status", "vm_steps_after")


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


def schema_field(schema: pa.Schema, name: str) -> pa.Field:
    """The field ``name`` of ``schema``, or of the fields an older schema may not declare yet."""
    return schema.field(name) if name in schema.names else _EXTRA_FIELDS[name]


def open_parquet(file: Path, **kwargs: object) -> pq.ParquetFile:
    """``pq.ParquetFile(file)``, or `RunLogError` naming the file when it is not readable Parquet."""
    try:
        return pq.ParquetFile(file, **kwargs)
    except (OSError, pa.ArrowException) as exc:
        raise unreadable_error(file, exc) from exc


def unreadable_error(file: Path, exc: BaseException) -> RunLogError:
    return RunLogError(f"{file}: not a readable Parquet file ({exc}); remove it or rewrite the run's logs")


def check_columns(file: Path, present: set[str], partitions: Mapping[str, str], columns: Sequence[str],
                  required: Sequence[str], absent: dict[str, int]) -> None:
    """Raise `RunLogError` when a column in ``required`` is neither in the file (``present``) nor a partition
    value; count every other column of ``columns`` the file lacks in ``absent`` (``schema_version`` excepted)."""
    for name in columns:
        if name in present or name in partitions:
            continue
        if name in required:
            raise RunLogError(
                f"{file}: required column {name!r} is missing; every episodes file needs {list(required)}"
            )
        if name != "schema_version":
            absent[name] = absent.get(name, 0) + 1


def cast_column(file: Path, name: str, column: pa.Array | pa.ChunkedArray, type_: pa.DataType):
    """``column`` cast to ``type_``, or `RunLogError` naming the file and the column."""
    try:
        return column.cast(type_)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise RunLogError(f"{file}: column {name!r} cannot be read as {type_}: {exc}") from exc


def default_value(name: str, root: Path) -> object:
    """The value a file lacking column ``name`` is read with (`DEFAULTS`; None = null)."""
    default = DEFAULTS.get(name)
    return root.parent.name if default is RUN_NAME else default


def _read_conformed(file: Path, root: Path, schema: pa.Schema, columns: Sequence[str], required: Sequence[str],
                    absent: dict[str, int]) -> pa.Table:
    """One file → a table with exactly ``columns`` typed as in ``schema``: a missing column in ``required`` is an
    error, any other missing column takes its `DEFAULTS` value (null unless listed) and is counted in ``absent``."""
    present = set(open_parquet(file).schema_arrow.names)
    try:
        table = pq.read_table(file, columns=[c for c in columns if c in present])
    except (OSError, pa.ArrowException) as exc:
        raise unreadable_error(file, exc) from exc
    partitions = _partition_values(file, root)
    check_columns(file, present, partitions, columns, required, absent)
    arrays = []
    for name in columns:
        field = schema_field(schema, name)
        if name in present:
            arrays.append(cast_column(file, name, table.column(name), field.type))
        elif name in partitions:
            arrays.append(pa.array([partitions[name]] * table.num_rows, type=field.type))
        else:
            default = default_value(name, root)
            arrays.append(pa.nulls(table.num_rows, type=field.type) if default is None
                          else pa.array([default] * table.num_rows, type=field.type))
    fields = [schema_field(schema, c).with_nullable(True) for c in columns]
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


def _read_table(
    files: list[Path], root_of: dict[Path, Path], schema: pa.Schema, columns: Sequence[str],
    required: Sequence[str], absent: dict[str, int],
) -> pd.DataFrame:
    fields = pa.schema([schema_field(schema, c).with_nullable(True) for c in columns])
    tables = [_read_conformed(f, root_of[f], schema, columns, required, absent) for f in files]
    table = pa.concat_tables(tables) if tables else fields.empty_table()
    return table.to_pandas()


def split_method(label: str) -> tuple[str, str | None]:
    """``"P@C"`` → ``("P", "C")``; a label without ``@`` → ``(label, None)``."""
    policy, sep, condition = label.partition("@")
    return (policy, condition) if sep else (label, None)


def condition_label(method: str, condition: str | None) -> tuple[str, str | None, bool]:
    """`apply_conditions` for one (method, condition) pair: ``(label, condition, clash)``, ``clash`` when the
    logged condition differs from the method's ``@`` suffix (the label is kept then)."""
    cond = condition if isinstance(condition, str) and condition != "" else None
    policy, suffix = split_method(method)
    if suffix is not None:
        return method, suffix, cond is not None and cond != suffix
    return (f"{method}@{cond}", cond, False) if cond is not None else (method, None, False)


def clash_note(episodes: int) -> str:
    return (f"{episodes} episode(s) log a condition that differs from their method's '@' suffix; the method label "
            "was kept")


def apply_conditions(episodes: pd.DataFrame) -> tuple[pd.DataFrame, tuple[str, ...]]:
    """Make ``method`` carry the condition and ``condition`` hold it (module docstring); returns the frame and
    notes (rows whose ``condition`` disagrees with their method's suffix keep their method and its suffix as the
    condition, and are counted). An empty condition string is no condition."""
    method = episodes["method"].astype(str)
    cond = episodes["condition"].where(episodes["condition"] != "")
    has_at = method.str.contains("@", regex=False)
    suffix = pd.Series([split_method(m)[1] for m in method], index=method.index, dtype=object)
    known = cond.notna()
    clash = int((known & has_at & (cond != suffix)).sum())
    notes = [clash_note(clash)] if clash else []
    out = episodes.assign(
        method=method.where(~(known & ~has_at), method + "@" + cond.astype(str)),
        condition=suffix.where(has_at, cond),
    )
    return out, tuple(notes)


@dataclass(frozen=True)
class RunFiles:
    """The visible Parquet files of some run directories: ``root_of`` maps a file to its table folder."""

    run_dirs: tuple[str, ...]
    episodes: tuple[Path, ...]
    turns: tuple[Path, ...]
    root_of: Mapping[Path, Path]


def run_files(run_dirs: Sequence[str | Path]) -> RunFiles:
    """List the episode and turn files of every run directory. Raises `RunLogError` when no directory is given,
    a directory is missing or holds no episode files."""
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
    return RunFiles(tuple(str(Path(r)) for r in run_dirs), tuple(episode_files), tuple(turn_files), root_of)


def partition_values(file: Path, files: RunFiles) -> dict[str, str]:
    """The ``method=`` / ``budget=`` values of ``file``'s folders (unquoted)."""
    return _partition_values(file, files.root_of[file])


# Turn columns a turns file must hold (non-nullable in the schema; the optional ones are read when present).
TURN_REQUIRED: tuple[str, ...] = tuple(
    c for c in TURN_COLUMNS if not schema_field(TURNS_SCHEMA, c).nullable and c not in OPTIONAL_TURN_COLUMNS
)
NO_ROWS = "the episode files hold no rows; nothing to analyse"
NO_TURNS_NOTE = "no turns table in the runs: estimator coverage is not reported"


def absent_note(absent: Mapping[str, int], episode_files: int) -> str | None:
    """The note naming the episode columns absent from some files (``absent``: column → files), or None."""
    missing = sorted(c for c in absent if c not in ("condition", "gold"))
    if not missing:
        return None
    files = sorted(set(absent[c] for c in missing))
    share = f"{files[0]}" if len(files) == 1 else f"{files[0]}–{files[-1]}"
    return (f"episode column(s) absent from {share} of {episode_files} file(s), analysed with defaults: "
            + ", ".join(f"{c} ({_default_text(c)})" for c in missing))


def version_note(newest: int | None) -> str | None:
    """The note for logs newer than this reader (``newest``: the largest logged schema version), or None."""
    if newest is None or newest <= SCHEMA_VERSION:
        return None
    return (f"logs use schema version {newest}, newer than this reader's {SCHEMA_VERSION}; only the known "
            "columns were read")


def null_error(columns: Sequence[str]) -> RunLogError:
    return RunLogError(f"episodes have nulls in required column(s) {list(columns)}; the logs are malformed")


def load_runs(run_dirs: Sequence[str | Path]) -> RunLogs:
    """Read the episodes (and turns, when present) of every run directory into one pair of frames.

    Raises `RunLogError` when no directory is given, a directory is missing, a directory holds no episode files,
    or a file does not fit the schema.
    """
    files = run_files(run_dirs)
    root_of = dict(files.root_of)
    absent: dict[str, int] = {}
    episodes = _read_table(list(files.episodes), root_of, EPISODES_SCHEMA, EPISODE_COLUMNS, CORE_COLUMNS, absent)
    turns = _read_table(list(files.turns), root_of, TURNS_SCHEMA, TURN_COLUMNS, TURN_REQUIRED, {})
    if episodes.empty:
        raise RunLogError(NO_ROWS)
    notes = [n for n in (absent_note(absent, len(files.episodes)),) if n]
    episodes = episodes.assign(empty_gold=empty_gold_column(episodes.pop("gold")))
    episodes, cond_notes = apply_conditions(episodes)
    turns, _ = apply_conditions(turns)
    notes += cond_notes
    versions = episodes["schema_version"].dropna()
    notes += [n for n in (version_note(int(versions.max()) if len(versions) else None),) if n]
    if not files.turns:
        notes.append(NO_TURNS_NOTE)
    nulls = [c for c in CORE_COLUMNS if episodes[c].isna().any()]
    if nulls:
        raise null_error(nulls)
    return RunLogs(
        episodes=episodes.drop(columns=["schema_version"]),
        turns=turns,
        run_dirs=files.run_dirs,
        episode_files=len(files.episodes),
        turn_files=len(files.turns),
        notes=tuple(notes),
    )


def gold_is_empty(text: object) -> bool | None:
    """Whether a logged gold answer (``Answer.to_json`` text) holds no value — the gold query returned no rows,
    so ``[]`` is correct without evidence; None when it is not logged or not readable."""
    if not isinstance(text, str):
        return None
    try:
        obj = json.loads(text)
    except ValueError:
        return None
    return isinstance(obj, dict) and obj.get("kind") != "scalar" and obj.get("values") == []


def empty_gold_column(gold: pd.Series) -> pd.Series:
    """Per episode: `gold_is_empty` of its logged gold answer; null where no gold is logged."""
    values = {t: gold_is_empty(t) for t in gold.dropna().unique()}  # few distinct golds per task: parse each once
    return gold.map(values).astype("boolean")


def _default_text(column: str) -> str:
    default = DEFAULTS.get(column)
    if default is RUN_NAME:
        return "the run folder's name"
    return "null" if default is None else str(default).lower()
