"""Reading run directories: hive partitions, schema tolerance, clear errors."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as hst

from bapsql.analysis.load import load_runs
from bapsql.analysis.synthetic import write_run
from bapsql.errors import RunLogError
from tests.analysis.helpers import episodes_table, turns_table

METHODS = ("SQL-RL (matched)", "BAP-SQL SFT")


def _table():
    return episodes_table([
        dict(method=m, budget=b, task_id=f"t{i}", db_id=f"d{i % 2}", success=i % 2 == 0, official_ex=True)
        for m in METHODS for b in ("XS", "L") for i in range(3)
    ])


def test_reads_partitions_with_and_without_partition_columns(tmp_path):
    table = _table()
    write_run(tmp_path / "kept", table, turns_table([dict(method="BAP-SQL SFT", budget="XS")]))
    pq.write_to_dataset(table, tmp_path / "dropped" / "episodes", partition_cols=["method", "budget"])
    assert not any("method" in pq.read_schema(f).names for f in (tmp_path / "dropped").rglob("*.parquet"))
    for name in ("kept", "dropped"):
        logs = load_runs([tmp_path / name])
        assert len(logs.episodes) == 12
        assert sorted(logs.episodes["method"].unique()) == sorted(METHODS)
        assert sorted(logs.episodes["budget"].unique()) == ["L", "XS"]
        assert logs.episodes["success"].sum() == 8
    assert len(load_runs([tmp_path / "kept"]).turns) == 1
    assert any("no turns table" in n for n in load_runs([tmp_path / "dropped"]).notes)


def test_several_runs_pool_and_hidden_files_are_skipped(tmp_path):
    write_run(tmp_path / "r1", _table())
    write_run(tmp_path / "r2", _table())
    hidden = tmp_path / "r2" / "episodes" / "method=x" / "budget=XS"
    hidden.mkdir(parents=True)
    pq.write_table(_table(), hidden / ".part-1.parquet")  # an atomic writer's temp file
    (tmp_path / "r2" / "episodes" / "_tmp").mkdir()
    pq.write_table(_table(), tmp_path / "r2" / "episodes" / "_tmp" / "part.parquet")
    logs = load_runs([tmp_path / "r1", tmp_path / "r2"])
    assert len(logs.episodes) == 24 and logs.episode_files == 8


def test_missing_nullable_column_is_filled_with_nulls(tmp_path):
    table = _table().drop_columns(["official_ex", "schema_version"])
    (tmp_path / "r" / "episodes").mkdir(parents=True)
    pq.write_table(table, tmp_path / "r" / "episodes" / "part.parquet")
    ep = load_runs([tmp_path / "r"]).episodes
    assert ep["official_ex"].isna().all() and len(ep) == 12


def test_missing_required_column_is_a_clear_error(tmp_path):
    (tmp_path / "r" / "episodes").mkdir(parents=True)
    pq.write_table(_table().drop_columns(["success"]), tmp_path / "r" / "episodes" / "part.parquet")
    with pytest.raises(RunLogError, match="required column 'success'"):
        load_runs([tmp_path / "r"])


def test_uncastable_column_and_non_parquet_file_are_errors(tmp_path):
    (tmp_path / "r" / "episodes").mkdir(parents=True)
    bad = _table().set_column(_table().schema.get_field_index("seed"), "seed", pa.array(["x"] * 12))
    pq.write_table(bad, tmp_path / "r" / "episodes" / "part.parquet")
    with pytest.raises(RunLogError, match="column 'seed'"):
        load_runs([tmp_path / "r"])
    (tmp_path / "r" / "episodes" / "part.parquet").write_text("not parquet")
    with pytest.raises(RunLogError, match="not a readable Parquet file"):
        load_runs([tmp_path / "r"])


def test_missing_or_empty_run_directories_are_errors(tmp_path):
    with pytest.raises(RunLogError, match="no run directory"):
        load_runs([])
    with pytest.raises(RunLogError, match="not found"):
        load_runs([tmp_path / "nope"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(RunLogError, match="no episodes"):
        load_runs([tmp_path / "empty"])
    (tmp_path / "zero" / "episodes").mkdir(parents=True)
    pq.write_table(_table().slice(0, 0), tmp_path / "zero" / "episodes" / "part.parquet")
    with pytest.raises(RunLogError, match="no rows"):
        load_runs([tmp_path / "zero"])


def test_reads_what_the_production_trajectory_writer_writes(tmp_path):
    writer = pytest.importorskip("bapsql.logs.writer")
    table = _table()
    with writer.TrajectoryWriter(tmp_path / "run", "test", flush_every=5) as w:
        for row in table.to_pylist():
            w.add_episode({**row, "method": row["method"].replace(" ", "_").replace("(", "").replace(")", "")})
    logs = load_runs([tmp_path / "run"])
    assert len(logs.episodes) == 12 and logs.episode_files > 2
    assert sorted(logs.episodes["method"].unique()) == ["BAP-SQL_SFT", "SQL-RL_matched"]
    assert logs.episodes["success"].sum() == 8


@given(hst.lists(hst.tuples(hst.sampled_from(["a", "b@x", "b@", "c@y@z", "model.q@full"]),
                            hst.sampled_from([None, "", "x", "y", "full"])), min_size=1, max_size=12))
def test_condition_label_is_apply_conditions_for_one_pair(pairs):
    """The scan labels each distinct (method, condition) pair; the loader labels whole frames: the same labels."""
    import pandas as pd

    from bapsql.analysis.load import apply_conditions, clash_note, condition_label

    frame = pd.DataFrame({"method": [m for m, _ in pairs], "condition": [c for _, c in pairs]})
    out, notes = apply_conditions(frame)
    labels = [condition_label(m, c) for m, c in pairs]
    assert list(out["method"]) == [label for label, _, _ in labels]
    assert [c if isinstance(c, str) else None for c in out["condition"]] == [c for _, c, _ in labels]
    clashes = sum(clash for _, _, clash in labels)
    assert notes == ((clash_note(clashes),) if clashes else ())
