"""Estimator coverage on the Spider training databases (benchmarks/RESULTS.md, "Estimator").

For every gold query of ``train_spider.json`` whose database is present: estimate it (raw, identity calibration),
execute it read-only through the shield with no visible output (exact rows, full result tokens, VM steps), then
report p50/p95 coverage (share of actual <= p50 / <= p95) and the median p95/actual ratio per quantity:
- ``in-sample``: factors fitted on all databases, evaluated on all;
- ``held-out``: databases split in two halves by a hash of their id; factors fitted on one half are evaluated on
  the other, both ways, and pooled (every query is scored by factors that never saw its database);
- ``packaged``: the shipped default (bapsql/resources/calibration.json).

    python benchmarks/spider_coverage.py [--data ../shared/data/spider_train] [--limit N] [--target T]
        [--write-default PATH]
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import statistics
import time
from collections import defaultdict
from pathlib import Path

from bapsql.db.calibration import (Calibration, Factors, QuantityCalibration, Sample, coverage, coverage_targets,
                                   fit_calibration, load_calibration)
from bapsql.db.calibration_samples import collect_samples
from bapsql.db.handle import default_counter, open_database

REPO = Path(__file__).resolve().parents[1]


def gather(data: Path, limit: int | None, cache_dir: Path | None) -> tuple[list[Sample], float, int]:
    items = json.loads((data / "train_spider.json").read_text())[:limit]
    by_db: dict[str, list[str]] = defaultdict(list)
    for ex in items:
        by_db[ex["db_id"]].append(ex["query"])
    counter = default_counter()
    samples: list[Sample] = []
    t0, skipped = time.perf_counter(), 0
    for db_id, sqls in sorted(by_db.items()):
        path = data / "database" / db_id / f"{db_id}.sqlite"
        if not path.is_file():
            skipped += len(sqls)
            continue
        with open_database(path, token_counter=counter, calibration=Calibration.identity(),
                           cache_dir=cache_dir) as h:
            got = collect_samples(h, sqls)
        skipped += len(sqls) - len(got)
        samples.extend(dataclasses.replace(s, db=db_id) for s in got)
    return samples, time.perf_counter() - t0, skipped


# The packaged default's targets: rows at 0.99; result tokens and VM steps at 0.975, which keeps every held-out
# coverage at or above the paper's 98.8 / 97.0 / 96.0 % while the token p95 of a filter is 3 times its point estimate
# instead of 4 (0.99 everywhere covered 99 % of tokens: a p99 more than a p95; benchmarks/RESULTS.md, "Estimator").
DEFAULT_TARGET = {"rows": 0.99, "result_tokens": 0.975, "vm_steps": 0.975}


def parse_target(text: str) -> float | dict[str, float]:
    """``0.99`` or ``rows=0.99,result_tokens=0.975,vm_steps=0.975`` (checked by `coverage_targets`)."""
    try:
        value = float(text) if "=" not in text else {
            k.strip(): float(v) for k, v in (part.split("=", 1) for part in text.split(",") if part.strip())}
        coverage_targets(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"--target {text!r}: {exc}") from exc
    return value


def target_text(target: float | dict[str, float]) -> str:
    return str(target) if not isinstance(target, dict) else ",".join(f"{k}={v}" for k, v in target.items())


def half(db: str) -> int:
    return int(hashlib.sha256(db.encode()).hexdigest(), 16) % 2


def table(title: str, cov: dict, inexact: dict | None = None) -> str:
    vm = cov["vm_steps"]
    stopped = f"; VM steps n={vm['n']}, {vm['stopped']} stopped by the cap" if vm.get("stopped") else ""
    lines = [f"{title} (n={cov['rows']['n']}{stopped})",
             "| quantity | p50 coverage | p95 coverage | median p95/actual |", "|---|---|---|---|"]
    rows = [(q, cov[q]) for q in ("rows", "result_tokens", "vm_steps")]
    if inexact is not None:
        rows.insert(1, (f"rows, inexact only (n={inexact['n']})", inexact))
    for q, c in rows:
        lines.append(f"| {q} | {100 * c['p50']:.1f}% | {100 * c['p95']:.1f}% | {c['median_p95_over_actual']:.2f} |")
    return "\n".join(lines)


def inexact_rows(samples: list[Sample], cal: Calibration) -> dict:
    """Row coverage over the estimates whose row count is not certain (no exact count, no binding LIMIT/key)."""
    return coverage([s for s in samples if not s.raw.rows_exact and s.raw.rows_ub > 1], cal)["rows"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data" / "spider_train")
    ap.add_argument("--limit", type=int, default=None, help="only the first N questions")
    ap.add_argument("--target", type=parse_target, default=DEFAULT_TARGET,
                    help="p95 target coverage used when fitting: one share (0.99) or one per quantity "
                         "(rows=0.99,result_tokens=0.975,vm_steps=0.975, the default)")
    ap.add_argument("--cache-dir", type=Path, default=None, help="catalog cache (default $BAPSQL_CACHE_DIR)")
    ap.add_argument("--write-default", type=Path, default=None, help="write factors fitted on all databases here")
    args = ap.parse_args()
    if not (args.data / "train_spider.json").is_file():
        raise SystemExit(f"no Spider data at {args.data}")
    samples, secs, skipped = gather(args.data, args.limit, args.cache_dir)
    dbs = sorted({s.db for s in samples})
    print(f"{len(samples)} queries on {len(dbs)} databases ({skipped} skipped), {secs:.1f} s\n")
    fit = dict(target_coverage=args.target)
    everything = fit_calibration(samples, **fit)
    print(table("in-sample (fit on all databases)", coverage(samples, everything), inexact_rows(samples, everything)),
          "\n")
    halves = [[s for s in samples if half(s.db) == k] for k in (0, 1)]
    scored: list[tuple[Sample, Calibration]] = []
    for k in (0, 1):
        cal = fit_calibration(halves[1 - k], **fit)
        print(table(f"held-out half {k} (fit on the other half's {len({s.db for s in halves[1 - k]})} databases)",
                    coverage(halves[k], cal), inexact_rows(halves[k], cal)), "\n")
        scored.extend((s, cal) for s in halves[k])
    pooled = {}
    for q in ("rows", "result_tokens", "vm_steps"):
        per = [coverage([s], cal)[q] for s, cal in scored]
        ratios = [c["median_p95_over_actual"] for c in per if c["median_p95_over_actual"] == c["median_p95_over_actual"]]
        n95, n50 = sum(c["n"] for c in per), sum(c["n_p50"] for c in per)  # a cap-stopped query: VM steps only
        pooled[q] = {"p50": sum(c["p50"] * c["n_p50"] for c in per) / max(n50, 1),
                     "p95": sum(c["p95"] * c["n"] for c in per) / max(n95, 1),
                     "median_p95_over_actual": float(statistics.median(ratios)), "n": n95}
    per = [coverage([s], cal)["rows"] for s, cal in scored
           if not s.stopped and not s.raw.rows_exact and s.raw.rows_ub > 1]
    inexact = {"p50": sum(c["p50"] for c in per) / len(per), "p95": sum(c["p95"] for c in per) / len(per), "n": len(per),
               "median_p95_over_actual": float(statistics.median(
                   [c["median_p95_over_actual"] for c in per if c["median_p95_over_actual"] > 0]))}
    print(table("held-out pooled (each query scored by factors fitted on the other half)", pooled, inexact), "\n")
    print(table("packaged default calibration", coverage(samples, load_calibration())))
    if args.write_default is not None:
        def tidy(qc: QuantityCalibration) -> QuantityCalibration:  # 4 decimals; p95 rounded up (coverage kept)
            r = lambda f: Factors(round(f.p50, 4), math.ceil(f.p95 * 1e4) / 1e4)  # noqa: E731
            return QuantityCalibration(r(qc.default), {k: r(v) for k, v in qc.by_shape.items()})

        cal = dataclasses.replace(
            everything, rows=tidy(everything.rows), result_tokens=tidy(everything.result_tokens),
            vm_steps=tidy(everything.vm_steps),
            source=f"benchmarks/spider_coverage.py --target {target_text(args.target)}: {len(samples)} gold queries "
                   f"of Spider train_spider.json on {len(dbs)} training databases",
            comment="Fitted by bapsql.db.calibration.fit_calibration: per quantity and shape class, p95 = the smallest "
                    "factor whose coverage on the fit set reaches target_coverage, p50 = the median actual/raw ratio. "
                    "rows and vm_steps factors multiply the raw estimate; the result_tokens p95 factor multiplies "
                    "rows_p95 x estimated tokens per row (plus the header). Raw estimates come from the identity "
                    "calibration, actuals from shielded executions (exact rows, full result tokens, VM steps).")
        cal.save(args.write_default)
        print(f"\nwrote {args.write_default}")


if __name__ == "__main__":
    main()
