"""Running aggregates (bapsql/analysis/accumulate.py): independent of batching; turn counts = coverage."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from bapsql.analysis.accumulate import CHANNELS, EPISODE_INPUT, EpisodeAccumulator, TurnAccumulator
from bapsql.analysis.analyze import _jsonable
from bapsql.analysis.diagnostics import estimator_coverage
from bapsql.analysis.from_aggregates import AggregateSource
from tests.analysis.helpers import assert_same_numbers, turns_table


def _batch(rows):
    cols = {name: [r.get(name) for r in rows] for name in EPISODE_INPUT}
    types = {"seed": pa.int64(), "success": pa.bool_(), "official_ex": pa.bool_(), "abstained": pa.bool_(),
             "breach": pa.bool_(), "empty_gold": pa.bool_()}
    return pa.RecordBatch.from_arrays([pa.array(cols[n], types.get(n, pa.string() if n in (
        "method", "budget", "db_id", "task_id", "failure") else pa.int64())) for n in EPISODE_INPUT],
        names=list(EPISODE_INPUT))


def test_the_aggregates_do_not_depend_on_how_the_episodes_are_batched():
    rng = np.random.default_rng(0)
    rows = [dict(method=str(rng.choice(["a", "b"])), budget=str(rng.choice(["XS", "L"])), seed=int(rng.integers(2)),
                 db_id=f"d{rng.integers(3)}", task_id=f"t{rng.integers(5)}", success=bool(rng.random() < 0.5),
                 total_tokens=int(rng.integers(1, 99)), queries=1, result_tokens=2, vm_steps=3, turns=1,
                 peak_context=None if rng.random() < 0.5 else 7, failure=None if rng.random() < 0.3 else "x",
                 empty_gold=None if rng.random() < 0.5 else bool(rng.random() < 0.5)) for _ in range(200)]
    results = []
    for size in (1, 7, 200):
        acc = EpisodeAccumulator()
        for lo in range(0, len(rows), size):
            acc.add(_batch(rows[lo: lo + size]))
        source = AggregateSource(acc.finish(), run_dirs=("r",), notes=(), episode_files=1, turn_files=0)
        results.append(_jsonable((source.cells(), source.cells(by="db_id"), source.failures(), source.empty_gold(),
                                  source.paired_comparisons([("b", "a")], budgets=["XS", "L"], replicates=20, seed=0))))
    assert_same_numbers(results[0], results[1])  # sums in another order: equal to rounding
    assert_same_numbers(results[0], results[2])
    agg = acc.finish()
    assert agg.channel("episodes").sum() == 200 and agg.sums.shape[1] == len(CHANNELS)
    assert agg.channel("peak_context_n").sum() == sum(r["peak_context"] is not None for r in rows)


def test_turn_counts_give_the_estimator_coverage_of_the_turns_frame():
    """Cap-stopped runs (a miss below the cap, censored above it), a preflight rejection, nulls and a probe level."""
    stopped = dict(method="m", budget="XS", action="execute_query", status="truncated", actual_rows=None,
                   actual_result_tokens=None, actual_vm_steps=249_000, est_vm_steps_p50=90_000.0,
                   vm_steps_after=249_100)
    rows = [
        {**stopped, "est_vm_steps_p95": 249_500.0}, {**stopped, "est_vm_steps_p95": 400_000.0},
        {**stopped, "budget": "probe", "est_vm_steps_p95": 100.0},
        dict(method="m", budget="S", action="execute_query", status="ok", actual_rows=3, actual_vm_steps=1_000,
             est_rows_p50=2.0, est_rows_p95=5.0, est_vm_steps_p50=1_500.0, est_vm_steps_p95=2_000.0),
        dict(method="m", budget="XS", action="execute_query", status="rejected", est_vm_steps_p95=1e6),
        dict(method="n", budget="XS", action="inspect_schema", status=None),
        dict(method="n", budget="L", action="execute_query", status=None, actual_result_tokens=9,
             est_result_tokens_p50=10.0, est_result_tokens_p95=8.0),
    ]
    frame = turns_table(rows).to_pandas()
    acc = TurnAccumulator({"XS": 250_000, "S": 500_000, "M": 1_000_000, "L": 2_000_000})
    acc.add(pa.RecordBatch.from_pandas(frame[[c for c in frame.columns if c in
                                              ("method", "budget", "action", "status", "vm_steps_after")
                                              or c.startswith(("est_", "actual_"))]], preserve_index=False))
    source = AggregateSource(EpisodeAccumulator().finish(acc), run_dirs=(), notes=(), episode_files=0, turn_files=1)
    want = estimator_coverage(frame, {"XS": 250_000, "S": 500_000, "M": 1_000_000, "L": 2_000_000})
    assert_same_numbers(_jsonable(source.coverage()), _jsonable(want))
    vm = next(c for c in source.coverage() if (c.method, c.budget, c.quantity) == ("m", "XS", "vm_steps"))
    assert (vm.stopped, vm.censored_p95, vm.preflight_rejected, vm.n_p95, vm.p95) == (2, 1, 1, 1, 0.0)
