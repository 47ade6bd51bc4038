"""The out-of-core scan (bapsql/analysis/scan.py): load_runs' semantics and errors, foreign logs, served traffic,
a progress bar, and aggregates whose size does not grow with the episodes."""

from __future__ import annotations

import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bapsql.analysis.analyze import summarize_source, summary_to_json
from bapsql.analysis.load import load_runs
from bapsql.analysis.scan import LineConsole, scan_runs
from bapsql.analysis.source import EpisodeSource
from bapsql.analysis.synthetic import SyntheticSpec, write_run, write_synthetic_run
from bapsql.errors import RunLogError
from tests.analysis.helpers import LADDER, assert_same_numbers, episodes_table, turns_table


def _same_as_reference(runs, *, reference=None, batch_rows=1 << 17):
    new = summarize_source(scan_runs(runs, batch_rows=batch_rows), reference=reference, replicates=50)
    old = summarize_source(EpisodeSource(load_runs(runs)), reference=reference, replicates=50)
    assert_same_numbers(summary_to_json(new), summary_to_json(old))
    return new


def _good_rows(n=6):
    return [dict(method="m", budget="XS", task_id=f"t{i}", db_id=f"d{i % 2}", success=i % 2 == 0)
            for i in range(n)]


def _write(run, table):
    (run / "episodes").mkdir(parents=True, exist_ok=True)
    pq.write_table(table, run / "episodes" / "part.parquet")


@pytest.mark.parametrize("breakage, message", [
    ("missing", "required column 'success'"),
    ("uncastable", "column 'seed'"),
    ("not parquet", "not a readable Parquet file"),
    ("no rows", "no rows"),
    ("nulls", r"nulls in required column\(s\) \['success'\]"),
    ("no episodes", "no episodes"),
])
def test_broken_logs_fail_as_load_runs_fails(tmp_path, breakage, message):
    run = tmp_path / "r"
    table = episodes_table(_good_rows(), nullable=True)
    if breakage == "missing":
        _write(run, table.drop_columns(["success"]))
    elif breakage == "uncastable":
        _write(run, table.set_column(table.schema.get_field_index("seed"), "seed", pa.array(["x"] * 6)))
    elif breakage == "not parquet":
        _write(run, table)
        (run / "episodes" / "part.parquet").write_text("not parquet")
    elif breakage == "no rows":
        _write(run, table.slice(0, 0))
    elif breakage == "nulls":
        _write(run, table.set_column(table.schema.get_field_index("success"), "success",
                                     pa.array([True, None] * 3, pa.bool_())))
    else:
        (run / "episodes").mkdir(parents=True)
    for read in (load_runs, scan_runs):
        with pytest.raises(RunLogError, match=message):
            read([run])
    with pytest.raises(RunLogError, match="not found"):
        scan_runs([tmp_path / "nope"])


def test_logs_of_other_systems_with_core_columns_only(tmp_path):
    """Plain pyarrow types, one flat file, no partitions, no turns: the same numbers and notes as the reference."""
    rows = [dict(method=m, budget=b, seed=s, task_id=f"q{i:03d}", db_id=f"db{i % 6}", correct=ok, feasible=True,
                 success=ok, total_tokens=900 + 7 * i, queries=1, result_tokens=30 + i, vm_steps=1000 * (1 + i % 5),
                 turns=3)
            for m in ("ours", "theirs") for b in LADDER for s in (0, 1) for i in range(24)
            for ok in [(i + s + len(m) + LADDER.index(b)) % 3 != 0]]
    (tmp_path / "theirs" / "episodes").mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "theirs" / "episodes" / "part.parquet")
    summary = _same_as_reference([tmp_path / "theirs"], reference="theirs")
    assert summary.gates and summary.transitions and summary.coverage == ()
    assert any(n.startswith("episode column(s) absent from 1 of 1 file(s)") for n in summary.notes)
    assert any("no turns table" in n for n in summary.notes)


def test_served_traffic_as_the_server_logs_it(tmp_path):
    """What `bapsql serve` writes (trajectory writer, many small flushes, method ``model.<name>@<condition>``, one
    task per request, no gold, turn text): the same summary as the reference."""
    writer = pytest.importorskip("bapsql.logs.writer")
    rng = np.random.default_rng(3)
    with writer.TrajectoryWriter(tmp_path / "logs", "serve", flush_every=5) as w:
        for i in range(40):
            level = str(rng.choice(["XS", "S"]))
            ep = episodes_table([dict(method="model.scripted@full", condition="full", budget=level,
                                      task_id=f"q-{i:04x}", db_id=str(rng.choice(["shop", "zoo"])),
                                      success=bool(rng.random() < 0.5), total_tokens=int(rng.integers(100, 900)),
                                      episode_id=f"e{i}", run="serve")]).to_pylist()[0]
            turns = turns_table([dict(method="model.scripted@full", condition="full", budget=level,
                                      task_id=ep["task_id"], db_id=ep["db_id"], episode_id=f"e{i}", turn=t,
                                      est_rows_p95=10.0, actual_rows=int(rng.integers(0, 20)), model_s=0.1,
                                      completion="SELECT 1", observation="1 row", run="serve")
                                     for t in range(2)]).to_pylist()
            w.add_episode(ep, turns)
    assert len(list((tmp_path / "logs" / "episodes").rglob("*.parquet"))) > 5
    summary = _same_as_reference([tmp_path / "logs"], batch_rows=7)
    assert summary.methods == ("model.scripted@full",) and summary.conditions == {"model.scripted@full": "full"}
    assert summary.episodes == 40 and summary.coverage


def test_the_scan_reports_progress_per_table(tmp_path):
    spec = SyntheticSpec(success={"a": {"XS": 0.5}}, tokens={"a": {"XS": 1000.0}}, n_tasks=30, seeds=(0,))
    write_synthetic_run(tmp_path / "run", spec)
    lines: list[str] = []
    scan_runs([tmp_path / "run"], console=LineConsole(lines.append), batch_rows=4)
    assert any(line.startswith("scanning episodes: 30/30 (100%)") for line in lines)
    assert any(line.startswith("scanning turns: ") for line in lines)
    assert any(line.startswith("scanning episodes: ") and "/30 (" in line and "30/30" not in line for line in lines)


def test_aggregates_are_bounded_by_clusters_and_tasks_not_episodes(tmp_path):
    """Eight times the episodes of the same tasks, methods, budgets, seeds and databases: arrays of the same size
    (counts widen from one byte per task key only as their values need)."""
    sizes = []
    for samples in (1, 8):
        rows = [dict(method=m, budget=b, seed=s, task_id=f"t{i}", db_id=f"d{i % 3}", sample=k, success=(i + k) % 2 == 0,
                     total_tokens=100 + i) for m in ("a", "b") for b in ("XS", "L") for s in (0, 1)
                for i in range(12) for k in range(samples)]
        run = tmp_path / f"r{samples}"
        write_run(run, episodes_table(rows))
        agg = scan_runs([run], batch_rows=16).aggregates
        assert agg.episodes == len(rows)
        sizes.append((agg.sums.shape, len(agg.task_n), {v.size for v in agg.task_n},
                      sum(v.nbytes for v in agg.task_n + agg.task_success)))
        shutil.rmtree(run)
    assert sizes[0] == sizes[1]


def test_analyze_runs_draws_the_scan_as_a_bar_on_a_terminal_console(tmp_path):
    import io

    from rich.console import Console

    from bapsql.analysis.analyze import analyze_runs

    spec = SyntheticSpec(success={"a": {"XS": 0.5}, "b": {"XS": 0.4}}, tokens={"a": {"XS": 900.0}, "b": {"XS": 800.0}},
                         n_tasks=40, seeds=(0,), turns_per_episode=0)
    write_synthetic_run(tmp_path / "run", spec)
    screen = io.StringIO()
    messages: list[str] = []
    summary = analyze_runs([tmp_path / "run"], tmp_path / "out", replicates=20, progress=messages.append,
                           console=Console(file=screen, force_terminal=True, width=100))
    assert summary.episodes == 80 and "scanning episodes" in screen.getvalue()
    assert not any(m.startswith("scanning") for m in messages)  # the bar went to the console, not the callback
    assert (tmp_path / "out" / "summary.json").is_file()
