"""The atomic, partitioned Parquet trajectory writer (bapsql/logs/writer.py)."""

from __future__ import annotations

import threading

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bapsql.errors import LogRowError
from bapsql.logs import writer as writer_mod
from bapsql.logs.reader import read_table
from bapsql.logs.schema import EPISODES_SCHEMA, SCHEMA_VERSION, TURNS_SCHEMA
from bapsql.logs.validate import TABLES, RowPacker
from bapsql.logs.writer import TrajectoryWriter, episode_id, existing_episode_ids, validate_row, write_part
from tests.logs._rows import episode_row, turn_rows

RUN = "sweep-1"


def _visible(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


@pytest.mark.parametrize("nulls", [False, True])
def test_round_trip_of_every_column(tmp_path, nulls):
    episodes = [episode_row(RUN, m, b, 0, t, nulls=nulls) for m in ("raw", "bap_sql") for b in ("XS", "S")
                for t in range(3)]
    with TrajectoryWriter(tmp_path, RUN) as w:
        for e in episodes:
            w.add_episode(e, turn_rows(e, nulls=nulls))
    expected = sorted((validate_row("episodes", e) for e in episodes), key=lambda r: r["episode_id"])
    got = sorted(read_table(tmp_path, "episodes").to_pylist(), key=lambda r: r["episode_id"])
    assert got == expected
    assert all(r["schema_version"] == SCHEMA_VERSION for r in got)
    turns = [validate_row("turns", t) for e in episodes for t in turn_rows(e, nulls=nulls)]
    key = lambda r: (r["episode_id"], r["turn"])  # noqa: E731
    assert sorted(read_table(tmp_path, "turns").to_pylist(), key=key) == sorted(turns, key=key)
    if nulls:
        assert all(r["official_ex"] is None and r["answer"] is None for r in got)
    assert w.rows_written == {"episodes": len(episodes), "turns": len(turns)}


def test_layout_is_hive_partitioned_and_files_hold_no_partition_columns(tmp_path):
    with TrajectoryWriter(tmp_path, RUN) as w:
        e = episode_row(RUN, "bap_sql", "XS", 1, 0)
        w.add_episode(e, turn_rows(e, 2))
    assert _visible(tmp_path) == ["episodes/method=bap_sql/budget=XS/part-00000.parquet",
                                  "turns/method=bap_sql/budget=XS/part-00000.parquet"]
    schema = pq.read_schema(tmp_path / "episodes/method=bap_sql/budget=XS/part-00000.parquet")
    assert "method" not in schema.names and "budget" not in schema.names
    assert schema.metadata[b"bapsql.schema_version"] == str(SCHEMA_VERSION).encode()


@pytest.mark.parametrize("column", [f.name for f in EPISODES_SCHEMA if not f.nullable and f.name not in
                                    ("schema_version", "run")])
def test_missing_or_null_non_nullable_episode_column_is_named(column):
    row = episode_row(RUN, "raw", "XS", 0, 0)
    del row[column]
    with pytest.raises(LogRowError, match=f"missing non-nullable column.*'{column}'"):
        validate_row("episodes", row, RUN)
    row[column] = None
    with pytest.raises(LogRowError, match=f"column '{column}' is not nullable"):
        validate_row("episodes", row, RUN)


@pytest.mark.parametrize("column", [f.name for f in TURNS_SCHEMA if not f.nullable and f.name not in
                                    ("schema_version", "run")])
def test_missing_non_nullable_turn_column_is_named(column):
    row = turn_rows(episode_row(RUN, "raw", "XS", 0, 0), 1)[0]
    del row[column]
    with pytest.raises(LogRowError, match=f"'{column}'"):
        validate_row("turns", row, RUN)


@pytest.mark.parametrize("change, message", [
    ({"colour": "red"}, r"unknown column\(s\) \['colour'\]"),
    ({"queries": "3"}, "column 'queries' expects int64, got str"),
    ({"queries": True}, "column 'queries' expects int64"),
    ({"reward": "high"}, "column 'reward' expects double"),
    ({"correct": 1}, "column 'correct' expects bool"),
    ({"task_id": 7}, "column 'task_id' expects string"),
    ({"sample": 2**40}, "column 'sample' value .* does not fit int32"),
    ({"failure": "bad_luck"}, "column 'failure' value 'bad_luck' is not one of"),
    ({"method": "raw/agent"}, "column 'method' value 'raw/agent' must be a safe path name"),
    ({"budget": "..", }, "must be a safe path name"),
    ({"run": "other"}, "column 'run' is 'other' but this writer writes run"),
])
def test_bad_episode_values_are_rejected_with_the_column_named(change, message):
    row = {**episode_row(RUN, "raw", "XS", 0, 0), **change}
    with pytest.raises(LogRowError, match=message):
        validate_row("episodes", row, RUN)


def test_numpy_scalars_are_accepted():
    row = {**episode_row(RUN, "raw", "XS", 0, 0), "queries": np.int64(3), "reward": np.float32(0.5),
           "correct": np.bool_(True)}
    out = validate_row("episodes", row, RUN)
    assert (out["queries"], out["reward"], out["correct"]) == (3, 0.5, True)
    assert type(out["queries"]) is int and type(out["correct"]) is bool


def test_turn_action_vocabulary():
    row = {**turn_rows(episode_row(RUN, "raw", "XS", 0, 0), 1)[0], "action": "drop_table"}
    with pytest.raises(LogRowError, match="column 'action' value 'drop_table'"):
        validate_row("turns", row, RUN)


def test_flush_every_and_close(tmp_path):
    w = TrajectoryWriter(tmp_path, RUN, flush_every=4)
    w.add_episode(episode_row(RUN, "raw", "XS", 0, 0))
    w.add_episode(episode_row(RUN, "raw", "XS", 0, 1))
    assert existing_episode_ids(tmp_path) == set()
    w.add_episode(episode_row(RUN, "raw", "XS", 0, 2), turn_rows(episode_row(RUN, "raw", "XS", 0, 2), 1))
    assert len(existing_episode_ids(tmp_path)) == 3  # 4 buffered rows → flushed
    w.add_episode(episode_row(RUN, "raw", "XS", 0, 3))
    w.close()
    assert len(existing_episode_ids(tmp_path)) == 4
    with pytest.raises(LogRowError, match="closed"):
        w.add_episode(episode_row(RUN, "raw", "XS", 0, 4))
    assert [p.parent.parent.parent.name for p in w.files[:2]] == ["turns", "episodes"]  # turns land first


def test_resume_skips_written_episodes_and_continues_numbering(tmp_path):
    tasks = range(6)
    with TrajectoryWriter(tmp_path, RUN) as w:
        for t in tasks[:3]:
            w.add_episode(episode_row(RUN, "raw", "XS", 0, t))
    done = existing_episode_ids(tmp_path)
    assert done == {episode_id(RUN, "raw", "XS", 0, f"t{t}", 0) for t in tasks[:3]}
    with TrajectoryWriter(tmp_path, RUN) as w:  # the resumed sweep
        for t in tasks:
            row = episode_row(RUN, "raw", "XS", 0, t)
            if row["episode_id"] not in done:
                w.add_episode(row)
    assert _visible(tmp_path / "episodes") == ["method=raw/budget=XS/part-00000.parquet",
                                               "method=raw/budget=XS/part-00001.parquet"]
    ids = read_table(tmp_path, "episodes", columns=["episode_id"]).column("episode_id").to_pylist()
    assert sorted(ids) == sorted({episode_id(RUN, "raw", "XS", 0, f"t{t}", 0) for t in tasks})
    assert existing_episode_ids(tmp_path / "nowhere") == set()


def test_episode_id_is_stable_and_distinct():
    # Ids are stored on disk and used to resume sweeps: they must never change across versions or machines.
    assert episode_id("run", "bap_sql", "XS", 1, "t1", 0) == "63ab9d06d34a16b5e0f4"
    ids = {episode_id("run", m, b, s, t, k) for m in ("a", "b") for b in ("XS", "S") for s in (0, 1)
           for t in ("t1", "t2") for k in (0, 1)}
    assert len(ids) == 32


def test_a_crashed_write_leaves_no_visible_file(tmp_path, monkeypatch):
    folder = tmp_path / "episodes" / "method=raw" / "budget=XS"
    real = pq.write_table

    def crash(table, where, **kw):
        where.write(b"PAR1 partial")
        raise OSError("disk full")

    monkeypatch.setattr(writer_mod.pq, "write_table", crash)
    table = pa.table({"x": [1, 2]})
    with pytest.raises(OSError, match="disk full"):
        write_part(folder, table)
    assert _visible(tmp_path) == []
    monkeypatch.setattr(writer_mod.pq, "write_table", real)
    assert write_part(folder, table).name == "part-00000.parquet"


def test_a_failed_flush_keeps_its_rows_for_the_next(tmp_path, monkeypatch):
    real = pq.write_table
    calls = []

    def flaky(table, where, **kw):
        calls.append(table.num_rows)
        if len(calls) == 1:
            raise OSError("transient I/O error")
        return real(table, where, **kw)

    monkeypatch.setattr(writer_mod.pq, "write_table", flaky)
    w = TrajectoryWriter(tmp_path, RUN)
    e = episode_row(RUN, "raw", "XS", 0, 0)
    w.add_episode(e, turn_rows(e, 3))
    with pytest.raises(OSError, match="transient"):
        w.flush()
    assert existing_episode_ids(tmp_path) == set()
    w.close()
    assert existing_episode_ids(tmp_path) == {e["episode_id"]}
    assert read_table(tmp_path, "turns").num_rows == 3 and w.rows_written == {"episodes": 1, "turns": 3}


def test_stale_temp_files_are_skipped_and_hidden(tmp_path):
    folder = tmp_path / "episodes" / "method=raw" / "budget=XS"
    folder.mkdir(parents=True)
    (folder / ".part-00000.parquet.tmp").write_bytes(b"left by a killed writer")
    with TrajectoryWriter(tmp_path, RUN) as w:
        w.add_episode(episode_row(RUN, "raw", "XS", 0, 0))
    names = sorted(p.name for p in folder.iterdir())
    assert names == [".part-00000.parquet.tmp", "part-00001.parquet"]
    assert read_table(tmp_path, "episodes").num_rows == 1


def test_concurrent_writers_never_share_a_part_number(tmp_path):
    folder = tmp_path / "turns" / "method=raw" / "budget=S"
    barrier = threading.Barrier(4)
    written: list = []

    def work(k):
        barrier.wait()
        for i in range(5):
            written.append(write_part(folder, pa.table({"writer": [k], "i": [i]})))

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(written)) == 20
    assert sorted(p.name for p in folder.iterdir()) == [f"part-{n:05d}.parquet" for n in range(20)]
    rows = pa.concat_tables([pq.read_table(p) for p in written]).to_pylist()
    assert sorted((r["writer"], r["i"]) for r in rows) == [(k, i) for k in range(4) for i in range(5)]


_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-2**64, max_value=2**64),
    st.sampled_from([0, -2**15, 2**15 - 1, 2**15, -2**31, 2**31, -2**63, 2**63 - 1, 2**63, 1.0, 0.5, float("nan")]),
    st.floats(allow_nan=False), st.text(max_size=4), st.sampled_from(["", "XS", "raw/agent", "answer", "bad_luck"]),
    st.sampled_from([np.int64(3), np.int32(-7), np.float32(0.25), np.bool_(True), np.float64(2.0)]))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(table=st.sampled_from(["episodes", "turns"]), nulls=st.booleans(),
       changes=st.lists(st.tuples(st.integers(min_value=0, max_value=60), _VALUES), max_size=4),
       drop=st.lists(st.integers(min_value=0, max_value=60), max_size=2), extra=st.booleans())
def test_the_writers_fast_path_accepts_and_rejects_exactly_what_validate_row_does(table, nulls, changes, drop,
                                                                                   extra):
    episode = episode_row(RUN, "raw", "XS", 0, 0, nulls=nulls)
    row = dict(episode if table == "episodes" else turn_rows(episode, 1, nulls=nulls)[0])
    names = TABLES[table].names
    for i, value in changes:
        row[names[i % len(names)]] = value
    for i in drop:
        row.pop(names[i % len(names)], None)
    if extra:
        row["colour"] = "red"
    writer = TrajectoryWriter("/nonexistent/never-flushed", RUN)
    writer._packers[table].pack(episode if table == "episodes" else turn_rows(episode, 1, nulls=nulls)[0])
    try:
        expected = tuple(validate_row(table, row, RUN).values())
    except LogRowError as err:
        with pytest.raises(LogRowError) as got:
            writer._packers[table].pack(row)
        assert str(got.value) == str(err)
    else:
        packed = writer._packers[table].pack(row)[1]
        assert packed == expected or (packed != packed and str(packed) == str(expected))  # nan != nan
        assert tuple(map(type, packed)) == tuple(map(type, expected))


def test_the_fast_path_checks_integer_ranges_and_the_run_once_a_signature_is_known():
    packer = RowPacker("episodes", RUN)
    row = episode_row(RUN, "raw", "XS", 0, 0)
    packer.pack(row)  # the signature is now known
    for change, message in [({"sample": 2**31}, "does not fit int32"), ({"seed": -2**63 - 1}, "does not fit int64"),
                            ({"run": "other"}, "this writer writes run"), ({"failure": "bad_luck"}, "not one of")]:
        with pytest.raises(LogRowError, match=message):
            packer.pack({**row, **change})
    assert packer.pack({**row, "seed": -2**63})[1][packer.names.index("seed")] == -2**63


def test_a_bad_partition_name_is_refused_before_anything_is_buffered(tmp_path):
    w = TrajectoryWriter(tmp_path, RUN)
    with pytest.raises(LogRowError, match="safe path name"):
        w.add_episode(episode_row(RUN, "raw/agent", "XS", 0, 0))
    assert w._buffered == 0
    w.close()
    assert _visible(tmp_path) == []


def test_an_episode_with_one_bad_turn_buffers_none_of_its_rows(tmp_path):
    w = TrajectoryWriter(tmp_path, RUN)
    e = episode_row(RUN, "raw", "XS", 0, 0)
    turns = turn_rows(e, 3)
    turns[2]["action"] = "drop_table"
    with pytest.raises(LogRowError, match="column 'action' value 'drop_table'"):
        w.add_episode(e, turns)
    w.add_episode(episode_row(RUN, "raw", "XS", 0, 1), turn_rows(episode_row(RUN, "raw", "XS", 0, 1), 2))
    w.close()
    assert w.rows_written == {"episodes": 1, "turns": 2}
    assert set(read_table(tmp_path, "turns").column("episode_id").to_pylist()) == {
        episode_row(RUN, "raw", "XS", 0, 1)["episode_id"]}



def _text_run(root, cfg, episodes=60):
    from bapsql.logs.text import TextLogConfig

    rows = [episode_row(RUN, "raw", "XS", 0, t) for t in range(episodes)]
    with TrajectoryWriter(root, RUN, text=cfg or TextLogConfig()) as w:
        for e in rows:
            w.add_episode(e, turn_rows(e))
    return rows, read_table(root, "turns").to_pylist()


def test_the_writer_writes_the_turn_text_and_a_none_setting_leaves_it_null(tmp_path):
    from bapsql.logs.text import TextLogConfig

    rows, turns = _text_run(tmp_path / "all", None)
    by_key = {(t["episode_id"], t["turn"]): t for e in rows for t in turn_rows(e)}
    assert turns and all(t["completion"] == by_key[(t["episode_id"], t["turn"])]["completion"] and
                         t["observation"] == by_key[(t["episode_id"], t["turn"])]["observation"] for t in turns)
    _, none = _text_run(tmp_path / "none", TextLogConfig(mode="none"))
    assert len(none) == len(turns) and all(t["completion"] is None and t["observation"] is None for t in none)
    assert [t["sql"] for t in none] == [t["sql"] for t in turns]  # nothing else changes


def test_a_sampled_share_keeps_whole_episodes_chosen_by_id_the_same_on_a_rerun(tmp_path):
    from bapsql.logs.text import TextLogConfig, keeps_text

    cfg = TextLogConfig(mode="sample", share=0.3)
    rows, turns = _text_run(tmp_path / "a", cfg)
    kept = {t["episode_id"] for t in turns if t["completion"] is not None}
    assert kept == {e["episode_id"] for e in rows if keeps_text(e["episode_id"], cfg)}
    assert 0 < len(kept) < len(rows)
    assert all((t["completion"] is None) == (t["observation"] is None) == (t["episode_id"] not in kept)
               for t in turns)  # an episode keeps all its turns' text or none
    _, again = _text_run(tmp_path / "b", cfg)
    assert {t["episode_id"] for t in again if t["completion"] is not None} == kept


def test_the_writer_caps_long_text_from_any_source(tmp_path):
    from bapsql.logs.text import TEXT_CAP_CHARS, TextLogConfig

    e = episode_row(RUN, "raw", "XS", 0, 0)
    rows = turn_rows(e, 2)
    rows[0]["completion"] = "SELECT " + "x, " * 5000
    with TrajectoryWriter(tmp_path, RUN, text=TextLogConfig(max_chars=200)) as w:
        w.add_episode(e, rows)
        w.add_turn({**rows[1], "turn": 9, "observation": "o" * 9000})
    got = {t["turn"]: t for t in read_table(tmp_path, "turns").to_pylist()}
    assert len(got[0]["completion"]) == 200 and got[0]["completion"].startswith("SELECT x, x, ")
    assert "…[+" in got[0]["completion"] and len(got[9]["observation"]) == 200
    assert got[1]["completion"] == rows[1]["completion"]  # short text is kept as it is
    assert len(rows[0]["completion"]) > TEXT_CAP_CHARS  # the caller's row is not modified
