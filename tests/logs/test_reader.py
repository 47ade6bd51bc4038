"""Reading trajectory logs back: pyarrow/pandas, DuckDB, polars, older schema versions (bapsql/logs/reader.py)."""

from __future__ import annotations

from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bapsql.errors import RunLogError
from bapsql.logs.reader import read_episodes, read_table, read_turns
from bapsql.logs.schema import EPISODES_SCHEMA, TURNS_SCHEMA
from bapsql.logs.writer import TrajectoryWriter, file_schema, validate_row
from tests.logs._rows import episode_row, turn_rows

METHODS, BUDGETS, SEEDS, TASKS = ("raw", "bap_sql"), ("XS", "S", "M", "L"), (0, 1, 2), range(4)


@pytest.fixture(scope="module")
def run3(tmp_path_factory):
    """A 3-seed run: 2 methods x 4 budgets x 3 seeds x 4 tasks, written in several flushes."""
    root = tmp_path_factory.mktemp("run3")
    episodes = []
    with TrajectoryWriter(root, "main", flush_every=50) as w:
        for seed in SEEDS:
            for m in METHODS:
                for b in BUDGETS:
                    for t in TASKS:
                        e = episode_row("main", m, b, seed, t)
                        episodes.append(e)
                        w.add_episode(e, turn_rows(e))
    return root, episodes


def test_pandas_frames(run3):
    root, episodes = run3
    df = read_episodes(root)
    assert list(df.columns) == EPISODES_SCHEMA.names and len(df) == len(episodes)
    assert str(df["seed"].dtype) == "int64" and str(df["success"].dtype) == "bool"
    assert df.groupby(["method", "budget"]).size().to_dict() == {(m, b): 12 for m in METHODS for b in BUDGETS}
    assert df["success"].sum() == sum(e["success"] for e in episodes)
    turns = read_turns(root)
    assert len(turns) == sum(e["turns"] for e in episodes)
    assert list(read_episodes(root, columns=["seed", "reward"]).columns) == ["seed", "reward"]


def test_duckdb_reads_the_run_without_conversion(run3):
    duckdb = pytest.importorskip("duckdb")
    root, episodes = run3
    con = duckdb.connect()
    rows = con.execute(
        f"SELECT method, budget, seed, count(*) AS n, sum(success::INT) AS s "
        f"FROM read_parquet('{root}/episodes/**/*.parquet', hive_partitioning=1) GROUP BY ALL ORDER BY ALL").fetchall()
    expected = Counter((e["method"], e["budget"], e["seed"]) for e in episodes)
    wins = Counter((e["method"], e["budget"], e["seed"]) for e in episodes if e["success"])
    assert rows == sorted((m, b, s, n, wins[(m, b, s)]) for (m, b, s), n in expected.items())
    joined = con.execute(
        f"SELECT count(*) FROM read_parquet('{root}/turns/**/*.parquet', hive_partitioning=1) t "
        f"JOIN read_parquet('{root}/episodes/**/*.parquet', hive_partitioning=1) e USING (episode_id) "
        f"WHERE t.method = e.method AND t.budget = e.budget").fetchone()[0]
    assert joined == sum(e["turns"] for e in episodes)


def test_polars_reads_the_run_without_conversion(run3):
    pl = pytest.importorskip("polars")
    root, episodes = run3
    frame = pl.scan_parquet(f"{root}/episodes/**/*.parquet", hive_partitioning=True).collect()
    assert frame.height == len(episodes)
    assert set(EPISODES_SCHEMA.names) == set(frame.columns)
    per_seed = dict(frame.group_by("seed").agg(pl.col("reward").sum()).iter_rows())
    for seed in SEEDS:
        assert per_seed[seed] == pytest.approx(sum(e["reward"] for e in episodes if e["seed"] == seed))
    assert frame.filter(pl.col("budget") == "XS").height == len(METHODS) * len(SEEDS) * len(TASKS)


def _write_old(root, table, drop=(), extra=None, version=0):
    """A part file as an older writer would have left it: some columns missing, maybe one since removed."""
    e = episode_row("old", "raw", "XS", 0, 0)
    row = validate_row("episodes", e) if table == "episodes" else validate_row("turns", turn_rows(e, 1)[0])
    schema = file_schema(table)
    fields = [f for f in schema if f.name not in drop]
    data = {f.name: [row[f.name]] for f in fields}
    data["schema_version"] = [version]
    if extra:
        data.update({k: [v] for k, v in extra.items()})
        fields += [pa.field(k, pa.string()) for k in extra]
    folder = root / table / "method=raw" / "budget=XS"
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pydict(data, schema=pa.schema(fields)), folder / "part-00000.parquet")
    return row


def test_older_schema_versions_are_conformed(tmp_path):
    row = _write_old(tmp_path, "episodes", drop=("official_ex", "gold"), extra={"legacy_note": "v0"})
    got = read_table(tmp_path, "episodes").to_pylist()
    assert got == [{**row, "official_ex": None, "gold": None, "schema_version": 0}]
    trow = _write_old(tmp_path, "turns", drop=("est_vm_steps_p50", "est_vm_steps_p95"))
    assert read_table(tmp_path, "turns").to_pylist() == [{**trow, "est_vm_steps_p50": None,
                                                          "est_vm_steps_p95": None, "schema_version": 0}]


def test_a_missing_non_nullable_column_is_an_error(tmp_path):
    _write_old(tmp_path, "episodes", drop=("wall_s",))
    with pytest.raises(RunLogError, match="non-nullable column 'wall_s' is missing"):
        read_table(tmp_path, "episodes")


def test_bad_inputs(tmp_path, run3):
    root, _ = run3
    with pytest.raises(RunLogError, match="no such run directory"):
        read_table(tmp_path / "nowhere")
    with pytest.raises(RunLogError, match="no episodes"):
        read_table(tmp_path)
    with pytest.raises(RunLogError, match="unknown log table"):
        read_table(root, "events")
    with pytest.raises(RunLogError, match="unknown episodes column"):
        read_table(root, columns=["colour"])


def test_several_runs_and_duplicate_turns(tmp_path, run3):
    root, episodes = run3
    e = episode_row("other", "raw", "XS", 0, 0)
    with TrajectoryWriter(tmp_path, "other") as w:
        w.add_episode(e, turn_rows(e, 2))
    with TrajectoryWriter(tmp_path, "other") as w:  # a crash-and-rerun rewrote the same turns
        for t in turn_rows(e, 2):
            w.add_turn({**t, "completion_tokens": 99})
    both = read_table([root, tmp_path], "episodes")
    assert both.num_rows == len(episodes) + 1
    assert set(both.column("run").to_pylist()) == {"main", "other"}
    turns = read_turns(tmp_path)
    assert len(turns) == 2 and set(turns["completion_tokens"]) == {99}
    assert read_table(tmp_path, "turns").num_rows == 4
    assert TURNS_SCHEMA.names == read_table(tmp_path, "turns").schema.names


def test_a_v3_turns_file_without_text_columns_reads_with_null_text(tmp_path):
    """Logs written before schema v4 (no completion / observation) still read: the text columns are null."""
    trow = _write_old(tmp_path, "turns", drop=("completion", "observation"), version=3)
    (got,) = read_table(tmp_path, "turns").to_pylist()
    assert got == {**trow, "completion": None, "observation": None, "schema_version": 3}
    assert read_turns(tmp_path)[["completion", "observation"]].isna().all(axis=None)


def test_episode_ids_select_rows_and_skip_files_without_them(tmp_path, run3, monkeypatch):
    root, episodes = run3
    want = {episodes[0]["episode_id"], episodes[-1]["episode_id"]}
    turns = read_table(root, "turns", episode_ids=want).to_pylist()
    assert {t["episode_id"] for t in turns} == want
    assert len(turns) == sum(e["turns"] for e in episodes if e["episode_id"] in want)
    assert read_table(root, "episodes", episode_ids=want).num_rows == 2
    assert read_table(root, "turns", episode_ids=set()).num_rows == 0
    full_reads = []
    real = pq.read_table

    def spy(path, columns=None, **kw):
        if columns != ["episode_id"]:
            full_reads.append(path)
        return real(path, columns=columns, **kw)

    monkeypatch.setattr(pq, "read_table", spy)
    read_table(root, "turns", episode_ids={episodes[0]["episode_id"]})
    assert len(full_reads) == 1  # only the file holding the episode is read beyond its ids
