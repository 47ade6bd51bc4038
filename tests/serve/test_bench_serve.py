"""benchmarks/bench_serve.py at a tiny size with the scripted local engine (2 clients x 2 requests): it stops by
itself and reports per-turn percentiles, the 1-client baseline and the batching gain, 0 errors, every request logged
exactly once, a 429 case and a 503 case (engine killed, /healthz failing, back after the rebuild)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_serve.py"


@pytest.mark.slow  # ~9 s: it starts two services and runs every phase of the benchmark
def test_the_serving_benchmark_runs_small_and_reports_every_measure(capsys):
    spec = importlib.util.spec_from_file_location("bench_serve", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    report = bench.main(["--engine", "scripted", "--clients", "2", "--requests", "2", "--warmup", "1",
                         "--step-ms", "2", "--max-seconds", "120", "--startup-s", "120"])
    assert '"batching_gain"' in capsys.readouterr().out  # the JSON report is printed
    assert report["errors"] == 0 and report["single"]["answered"] == 2 and report["load"]["answered"] == 4
    for phase in ("single", "load"):
        assert report[phase]["turn_ms"]["p50"] > 0 and report[phase]["turn_ms"]["p95"] >= report[phase]["turn_ms"]["p50"]
        assert report[phase]["turns"] == 3 * report[phase]["answered"]  # estimate, execute, answer
    assert report["batching_gain"]["turns_per_s"] > 0 and report["engine_batch_peak"] >= 1
    assert report["logged"] == {"episodes": 7, "answered": 7, "exactly_once": True}
    c429 = report["case_429"]
    assert c429["status"] == 429 and int(c429["retry_after"]) >= 1 and c429["running_request_status"] == 200
    c503 = report["case_503"]
    assert c503["ask_status"] == 503 and "EngineDeadError" in c503["ask_error"]
    assert c503["healthz_status"] == 503 and "EngineDeadError" in c503["healthz_reason"]
    assert c503["after_status"] == 200
    assert report["probe_logged"]["exactly_once"] and report["probe_logged"]["episodes"] == 2
    assert report["db_file_unchanged"]
