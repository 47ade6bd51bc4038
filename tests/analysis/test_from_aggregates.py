"""Statistics from running aggregates equal the per-episode reference (bapsql/analysis/from_aggregates.py)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hst

from bapsql.analysis.analyze import summarize, summarize_source, summary_to_json
from bapsql.analysis.from_aggregates import AggregateSource
from bapsql.analysis.load import load_runs
from bapsql.analysis.scan import scan_runs
from bapsql.analysis.source import EpisodeSource
from tests.analysis.helpers import assert_same_numbers, random_rows, write_random_run


def _both(run: Path, *, batch_rows: int, reference: str | None, replicates: int = 40, seed: int = 3):
    new = summarize_source(scan_runs([run], batch_rows=batch_rows), reference=reference, replicates=replicates,
                           seed=seed)
    old = summarize_source(EpisodeSource(load_runs([run])), reference=reference, replicates=replicates, seed=seed)
    return new, old


@given(rng_seed=hst.integers(0, 2**32 - 1), layout=hst.sampled_from(["hive", "dataset", "flat"]),
       batch_rows=hst.sampled_from([1, 3, 17, 1 << 17]), with_reference=hst.booleans())
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_aggregates_give_the_numbers_of_the_per_episode_reference(rng_seed, layout, batch_rows, with_reference):
    """Random logs (nulls, absent columns, conditions and clashes, repeated task ids, several samples per key,
    turns with cap-stopped and rejected runs), any file layout, any batch size: every number and note of the
    summary equals the one the per-episode functions compute over the whole frame."""
    rng = np.random.default_rng(rng_seed)
    rows, turns = random_rows(rng)
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        write_random_run(rng, run, rows, turns, layout)
        methods = sorted(load_runs([run]).episodes["method"].unique())
        reference = methods[0] if with_reference else None
        new, old = _both(run, batch_rows=batch_rows, reference=reference)
    assert_same_numbers(summary_to_json(new), summary_to_json(old))
    assert new.notes == old.notes and new.episodes == len(rows)


def test_summarize_of_loaded_frames_goes_through_the_aggregates(tmp_path):
    rng = np.random.default_rng(5)
    rows, turns = random_rows(rng)
    write_random_run(rng, tmp_path / "run", rows, turns, "hive")
    logs = load_runs([tmp_path / "run"])
    via_frames = summarize(logs, replicates=30, seed=1)
    old = summarize_source(EpisodeSource(logs), replicates=30, seed=1)
    assert_same_numbers(summary_to_json(via_frames), summary_to_json(old))


def test_cells_count_distinct_task_ids_databases_and_seeds(tmp_path):
    """A task id in two databases is one task of its cell, two tasks of no database."""
    rows = [dict(method="m", budget="XS", seed=s, task_id=t, db_id=d, success=ok)
            for s, t, d, ok in [(0, "t0", "d0", True), (0, "t0", "d1", False), (1, "t1", "d0", True),
                                (1, "t1", "d0", True)]]
    write_random_run(np.random.default_rng(0), tmp_path / "run", rows, [], "hive")
    source = scan_runs([tmp_path / "run"])
    assert isinstance(source, AggregateSource)
    (cell,) = source.cells()
    assert (cell.episodes, cell.tasks, cell.databases, cell.seeds) == (4, 2, 2, 2)
    assert cell.success == pytest.approx(75.0)
    by_db = {c.group: (c.tasks, c.seeds, c.episodes) for c in source.cells(by="db_id")}
    assert by_db == {"d0": (2, 2, 3), "d1": (1, 1, 1)}
    by_seed = {c.group: (c.tasks, c.databases) for c in source.cells(by="seed")}
    assert by_seed == {"0": (1, 2), "1": (1, 1)}
    with pytest.raises(ValueError, match="by must be"):
        source.cells(by="task_id")


def test_a_pair_counts_each_key_once_with_the_mean_of_its_samples(tmp_path):
    """Two samples of a key are one pair, at their mean success and mean tokens; keys one side lacks are out."""
    rows = [dict(method="new", budget="XS", task_id="t0", db_id="d0", success=True, total_tokens=100),
            dict(method="new", budget="XS", task_id="t0", db_id="d0", success=False, total_tokens=300, sample=1),
            dict(method="ref", budget="XS", task_id="t0", db_id="d0", success=False, total_tokens=100),
            dict(method="new", budget="XS", task_id="t1", db_id="d0", success=True, total_tokens=999)]
    write_random_run(np.random.default_rng(0), tmp_path / "run", rows, [], "hive")
    (c,) = scan_runs([tmp_path / "run"]).paired_comparisons([("new", "ref")], budgets=["XS"], replicates=10, seed=0)
    assert c.pairs == 1 and c.quality.estimate == pytest.approx(50.0)
    assert c.mean_tokens_method == pytest.approx(200.0) and c.tokens.estimate == pytest.approx(100.0)
