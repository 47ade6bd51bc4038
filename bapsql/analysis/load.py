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

Conditions (DESIGN §4): a method is ``POLICY@CONDITION``. `apply_conditions` makes the ``method`` label carry the
condition whenever it is known: a row whose ``condition`` column is set and whose method has no ``@`` becomes
``method@condition``; a row without a condition takes it from its method's ``@`` suffix. So every statistic, keyed
by method, groups by (policy, condition), with or without the column; `split_method` splits a label for display.
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


def _field(schema: pa.Schema, name: str) -> pa.Field:
    return schema.field(name) if name in schema.names else _EXTRA_FIELDS[name]


def _read_conformed(file: Path, root: Path, schema: pa.Schema, columns: Sequence[str], required: Sequence[str],
                    absent: dict[str, int]) -> pa.Table:
    """One file → a table with exactly ``columns`` typed as in ``schema``: a missing column in ``required`` is an
    error, any other missing column takes its `DEFAULTS` value (null unless listed) and is counted in ``absent``."""
    try:
        present = set(pq.read_schema(file).names)
        table = pq.read_table(file, columns=[c for c in columns if c in present])
    except (OSError, pa.ArrowException) as exc:
        raise RunLogError(f"{file}: not a readable Parquet file ({exc}); remove it or rewrite the run's logs") from exc
    partitions = _partition_values(file, root)
    arrays = []
    for name in columns:
        field = _field(schema, name)
        if name in present:
            try:
                arrays.append(table.column(name).cast(field.type))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise RunLogError(f"{file}: column {name!r} cannot be read as {field.type}: {exc}") from exc
        elif name in partitions:
            arrays.append(pa.array([partitions[name]] * table.num_rows, type=field.type))
        elif name in required:
            raise RunLogError(
                f"{file}: required column {name!r} is missing; every episodes file needs {list(required)}"
            )
        else:
            if name != "schema_version":
                absent[name] = absent.get(name, 0) + 1
            default = DEFAULTS.get(name)
            if default is RUN_NAME:
                default = root.parent.name
            arrays.append(pa.nulls(table.num_rows, type=field.type) if default is None
                          else pa.array([default] * table.num_rows, type=field.type))
    return pa.Table.from_arrays(arrays, schema=pa.schema([_field(schema, c).with_nullable(True) for c in columns]))


def _read_table(
    files: list[Path], root_of: dict[Path, Path], schema: pa.Schema, columns: Sequence[str],
    required: Sequence[str], absent: dict[str, int],
) -> pd.DataFrame:
    fields = pa.schema([_field(schema, c).with_nullable(True) for c in columns])
    tables = [_read_conformed(f, root_of[f], schema, columns, required, absent) for f in files]
    table = pa.concat_tables(tables) if tables else fields.empty_table()
    return table.to_pandas()


def split_method(label: str) -> tuple[str, str | None]:
    """``"P@C"`` → ``("P", "C")``; a label without ``@`` → ``(label, None)``."""
    policy, sep, condition = label.partition("@")
    return (policy, condition) if sep else (label, None)


def apply_conditions(episodes: pd.DataFrame) -> tuple[pd.DataFrame, tuple[str, ...]]:
    """Make ``method`` carry the condition and ``condition`` hold it (module docstring); returns the frame and
    notes (rows whose ``condition`` disagrees with their method's suffix keep their method and its suffix as the
    condition, and are counted). An empty condition string is no condition."""
    method = episodes["method"].astype(str)
    cond = episodes["condition"].where(episodes["condition"] != "")
    has_at = method.str.contains("@", regex=False)
    suffix = pd.Series([split_method(m)[1] for m in method], index=method.index, dtype=object)
    known = cond.notna()
    notes = []
    clash = int((known & has_at & (cond != suffix)).sum())
    if clash:
        notes.append(f"{clash} episode(s) log a condition that differs from their method's '@' suffix; the "
                     "method label was kept")
    out = episodes.assign(
        method=method.where(~(known & ~has_at), method + "@" + cond.astype(str)),
        condition=suffix.where(has_at, cond),
    )
    return out, tuple(notes)


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
    absent: dict[str, int] = {}
    episodes = _read_table(episode_files, root_of, EPISODES_SCHEMA, EPISODE_COLUMNS, CORE_COLUMNS, absent)
    turn_required = [c for c in TURN_COLUMNS if not _field(TURNS_SCHEMA, c).nullable and c not in OPTIONAL_TURN_COLUMNS]
    turns = _read_table(turn_files, root_of, TURNS_SCHEMA, TURN_COLUMNS, turn_required, {})
    notes = []
    if episodes.empty:
        raise RunLogError("the episode files hold no rows; nothing to analyse")
    missing = sorted(c for c in absent if c not in ("condition", "gold"))
    if missing:
        files = sorted(set(absent[c] for c in missing))
        share = f"{files[0]}" if len(files) == 1 else f"{files[0]}–{files[-1]}"
        notes.append(
            f"episode column(s) absent from {share} of {len(episode_files)} file(s), analysed with defaults: "
            + ", ".join(f"{c} ({_default_text(c)})" for c in missing)
        )
    episodes = episodes.assign(empty_gold=empty_gold_column(episodes.pop("gold")))
    episodes, cond_notes = apply_conditions(episodes)
    turns, _ = apply_conditions(turns)
    notes += cond_notes
    versions = episodes["schema_version"].dropna()
    if len(versions) and int(versions.max()) > SCHEMA_VERSION:
        notes.append(
            f"logs use schema version {int(versions.max())}, newer than this reader's {SCHEMA_VERSION}; "
            "only the known columns were read"
        )
    if not turn_files:
        notes.append("no turns table in the runs: estimator coverage is not reported")
    nulls = [c for c in CORE_COLUMNS if episodes[c].isna().any()]
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


def empty_gold_column(gold: pd.Series) -> pd.Series:
    """Per episode: whether its logged gold answer (``Answer.to_json`` text) holds no value — the gold query
    returned no rows, so ``[]`` is correct without evidence; null where no gold is logged."""
    import json

    def empty(text: object) -> object:
        if not isinstance(text, str):
            return None
        try:
            obj = json.loads(text)
        except ValueError:
            return None
        return isinstance(obj, dict) and obj.get("kind") != "scalar" and obj.get("values") == []

    values = {t: empty(t) for t in gold.dropna().unique()}  # few distinct golds per task: parse each once
    return gold.map(values).astype("boolean")


def _default_text(column: str) -> str:
    default = DEFAULTS.get(column)
    if default is RUN_NAME:
        return "the run folder's name"
    return "null" if default is None else str(default).lower()
