"""``bapsql estimate``: the pre-execution estimate of one query, as a table or as JSON.

Contract (scripts rely on it): ``bapsql estimate --db F --sql Q --json`` prints ONE JSON object with ``rows``,
``result_tokens`` and ``vm_steps`` (each ``{"p50": x, "p95": y}``), ``columns``, ``probe_vm_steps``, ``plan``,
``features``, ``error`` and ``shape`` (the calibration class); with ``--budget LEVEL`` also ``budget`` (the level's
channels and whether each p95 fits). Exit 0 for an estimate, 2 for bad SQL (the JSON still printed, ``error`` set) or
an unusable database; never a traceback.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import click

DEFAULT_CAP = 50_000_000  # probe cap without --budget


class _Exit2(click.ClickException):
    exit_code = 2


def _fmt(x: float) -> str:
    return f"{x:,.0f}" if x >= 10 or x == 0 else f"{x:.2g}"


def _finite(x: float) -> float | str:
    return x if math.isfinite(x) else str(x)


@click.command("estimate")
@click.option("--db", "db", required=True, type=click.Path(path_type=Path), help="SQLite database file (read-only).")
@click.option("--sql", "sql", required=True, help="One SELECT / WITH / VALUES statement.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (the contract above).")
@click.option("--budget", "level", default=None, metavar="LEVEL",
              help="Budget level (XS, S, M, L): caps the LIMIT 0 probe at its VM steps and checks each p95 against "
                   "the level's channels.")
@click.option("--tokenizer", default="default", show_default=True,
              help="Token counter: 'default' (packaged tokenizer, else regex), 'regex', or a tokenizer path.")
@click.option("--calibration", "calibration", default=None, type=click.Path(path_type=Path),
              help="Calibration JSON (default: the packaged factors).")
@click.option("--cache-dir", default=None, type=click.Path(path_type=Path),
              help="Catalog cache folder (default: $BAPSQL_CACHE_DIR or ~/.cache/bapsql).")
def estimate(db: Path, sql: str, as_json: bool, level: str | None, tokenizer: str, calibration: Path | None,
             cache_dir: Path | None) -> None:
    """Estimate rows, result tokens and VM steps (p50/p95) of a query before running it."""
    from bapsql.budgets import load_ladder
    from bapsql.db.calibration import load_calibration
    from bapsql.db.handle import default_counter, open_database
    from bapsql.errors import ConfigError, DatabaseError
    from bapsql.tokens import load_token_counter

    if not db.is_file():
        raise _Exit2(f"database file not found: {db}; pass an existing SQLite file with --db")
    try:
        budget = load_ladder()[level] if level is not None else None
    except ConfigError as exc:
        raise click.UsageError(f"--budget: {exc}") from None
    try:
        counter = default_counter() if tokenizer == "default" else load_token_counter(tokenizer)
        cal = load_calibration(calibration)
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None
    try:
        handle = open_database(db, token_counter=counter, calibration=cal, cache_dir=cache_dir)
    except DatabaseError as exc:
        raise _Exit2(str(exc)) from None
    with handle:
        est = handle.estimator.estimate(sql, vm_step_cap=budget.vm_steps if budget else DEFAULT_CAP)
    fits = None
    if budget is not None:
        fits = {"rows": None, "result_tokens": est.result_tokens.p95 <= budget.result_tokens,
                "vm_steps": est.vm_steps.p95 <= budget.vm_steps}
    if as_json:
        obj = est.to_json()
        for q in ("rows", "result_tokens", "vm_steps"):
            obj[q] = {k: _finite(v) for k, v in obj[q].items()}
        if budget is not None:
            obj["budget"] = {"level": budget.level, "result_tokens": budget.result_tokens,
                             "vm_steps": budget.vm_steps, "fits": fits}
        click.echo(json.dumps(obj))
        if est.error:
            raise SystemExit(2)
        return
    if est.error:
        raise _Exit2(f"the query cannot run: {est.error}")
    lines = [f"{'':14s} {'p50':>14s} {'p95':>14s}"]
    for name, q in (("rows", est.rows), ("result tokens", est.result_tokens), ("VM steps", est.vm_steps)):
        note = ""
        if budget is not None and name != "rows":
            limit = budget.result_tokens if name == "result tokens" else budget.vm_steps
            note = f"   {'fits' if q.p95 <= limit else 'EXCEEDS'} {budget.level} ({limit:,})"
        lines.append(f"{name:14s} {_fmt(q.p50):>14s} {_fmt(q.p95):>14s}{note}")
    lines.append(f"columns: {', '.join(est.columns)}")
    lines.append(f"probe VM steps: {est.probe_vm_steps:,}   shape: {est.shape}")
    lines.append("plan:")
    lines.extend(f"  {p}" for p in est.plan)
    click.echo("\n".join(lines))
