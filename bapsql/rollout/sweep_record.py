"""``sweep.json`` of an evaluation run folder written by `bapsql.rollout.runner.evaluate` (one policy per call).

Several ``bapsql eval`` calls may log into one run folder (one method each); the record keeps the union of their
methods and which calibration file the episodes used. A second call with a *different* calibration file (by hash)
is refused: the folder's episodes would otherwise mix estimators silently.
"""

from __future__ import annotations

import json
from pathlib import Path

from bapsql.errors import ConfigError
from bapsql.files import atomic_write_text

RECORD = "sweep.json"


def update_sweep_record(run_dir: str | Path, fields: dict) -> dict:
    """Merge ``fields`` (run, benchmark, split, methods, calibration, calibration_file, calibration_sha256,
    placebo: {method: `PlaceboPool.stats`}) into ``run_dir/sweep.json`` atomically and return the record."""
    path = Path(run_dir) / RECORD
    record: dict = {}
    if path.is_file():
        try:
            record = json.loads(path.read_text())
        except ValueError as exc:
            raise ConfigError(f"{path}: not valid JSON ({exc}); move it away or choose another --out") from exc
    old = record.get("calibration_sha256")
    if old is not None and old != fields.get("calibration_sha256"):
        raise ConfigError(f"{run_dir}: its episodes used calibration {record.get('calibration_file')} "
                          f"(sha256 {old[:12]}…), this run uses {fields.get('calibration_file')}; log into another "
                          "folder so the estimators do not mix")
    methods = list(dict.fromkeys([*record.get("methods", []), *fields.get("methods", [])]))
    placebo = {**record.get("placebo", {}), **fields.get("placebo", {})}  # per placebo method, one call each
    record.update({k: v for k, v in fields.items() if k not in ("methods", "placebo")}, methods=methods)
    if placebo:
        record["placebo"] = placebo
    atomic_write_text(path, json.dumps(record, indent=2) + "\n")
    return record
