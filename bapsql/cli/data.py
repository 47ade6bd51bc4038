"""``bapsql data``: build the embedded benchmark, summarise any benchmark, build catalogs, fit calibration.

Contract (scripts rely on it): ``bapsql data stats --benchmark DIR --json`` prints ONE JSON object with at least
``databases``, ``tasks``, ``missing_databases`` (list), ``failed_gold`` (count) and ``answer_types`` (counts of
``scalar``, ``list``, ``ordered_list``). ``build-demo --out DIR`` writes a folder every ``--benchmark`` accepts.
``check --db FILE [--json]`` verifies a file without writing (exit 0 sound, 1 problems listed, 2 locked by a writer).
Bad input exits with a one-line error, never a traceback.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from bapsql.data.mixes import DEFAULT_MIX, MIXES

_BENCHMARK = click.option(
    "--benchmark", "benchmark", required=True, type=click.Path(path_type=Path),
    help="Benchmark folder: the embedded benchmark (from `bapsql data build-demo`), a BIRD layout or a Spider layout.")
_SEED = click.option("--seed", default=0, show_default=True, type=int,
                     help="Seed of the database-level split (BIRD/Spider layouts).")
_CACHE = click.option("--cache-dir", default=None, type=click.Path(file_okay=False, path_type=Path),
                      help="Cache for gold results and catalogs (default $BAPSQL_CACHE_DIR or ~/.cache/bapsql).")


def _progress():
    """A rich progress bar on stderr (stdout stays clean for --json), removed when done."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=Console(stderr=True), transient=True)


def _load(benchmark: Path, seed: int, cache_dir: Path | None):
    """Load a benchmark with a progress bar for gold execution; BapsqlError → one-line ClickException."""
    from bapsql.data.load import load_benchmark
    from bapsql.errors import BapsqlError

    with _progress() as bar:
        task = bar.add_task("executing gold SQL", total=None)

        def progress(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        try:
            return load_benchmark(benchmark, seed=seed, cache_dir=cache_dir, progress=progress)
        except BapsqlError as exc:
            raise click.ClickException(str(exc)) from exc


@click.group("data")
def data() -> None:
    """Benchmarks: build the embedded one, inspect any, build catalogs, fit the estimator's calibration."""


@data.command("build-demo")
@click.option("--scale", type=click.Choice(["small", "full"]), default="small", show_default=True,
              help="small: ~10^3-10^4 rows per big table, a few hundred tasks, seconds. full: 10^5-10^6 rows, "
                   "> 2,000 tasks, about a minute or two.")
@click.option("--out", "out", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Folder to write (created; benchmark files inside are overwritten).")
@click.option("--seed", default=0, show_default=True, type=int, help="Generator seed (same seed, same bytes).")
@click.option("--workers", default=None, type=click.IntRange(min=1), help="Worker processes (default: up to 2).")
@click.option("--mix", default=DEFAULT_MIX, show_default=True, type=click.Choice(sorted(MIXES)),
              help="Task mix (bapsql.data.mixes): binding adds long lists whose gold outgrows XS and whose broad "
                   "draft outgrows S, 30 percent of each split.")
def build_demo_cmd(scale: str, out: Path, seed: int, workers: int | None, mix: str) -> None:
    """Generate the embedded benchmark: SQLite databases, tasks with typed gold answers, splits, manifest."""
    from bapsql.data.demo import build_demo
    from bapsql.data.synth_domains import DOMAINS
    from bapsql.errors import BapsqlError

    with _progress() as bar:
        task = bar.add_task(f"building {scale} benchmark ({mix} mix)", total=len(DOMAINS))
        try:
            res = build_demo(out, scale=scale, seed=seed, mix=mix, workers=workers,
                             progress=lambda db: bar.update(task, advance=1, description=f"built {db}"))
        except BapsqlError as exc:
            raise click.ClickException(str(exc)) from exc
    click.echo(f"wrote {res.databases} databases and {res.tasks:,} tasks to {res.root} in {res.seconds:.1f}s")
    click.echo("shares: " + ", ".join(f"{k} {v:.1%}" for k, v in res.shares.items()))


@data.command("stats")
@_BENCHMARK
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (the contract above).")
@_SEED
@_CACHE
def stats_cmd(benchmark: Path, as_json: bool, seed: int, cache_dir: Path | None) -> None:
    """Summarise a benchmark: databases, tasks, missing databases, failed gold SQL, answer types, splits."""
    from bapsql.data.stats import benchmark_stats

    st = benchmark_stats(_load(benchmark, seed, cache_dir))
    if as_json:
        click.echo(json.dumps(st.to_json(), indent=1, sort_keys=True))
        return
    _print_stats(st)


def _print_stats(st) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    top = Table(title=f"{st.name} ({st.kind})", show_header=False)
    top.add_column(no_wrap=True)
    top.add_column()
    rows = [("databases", f"{st.databases}"), ("tasks", f"{st.tasks:,}"),
            ("missing databases", ", ".join(st.missing_databases) or "none"),
            ("tasks without database", f"{st.tasks_missing_database:,}"), ("failed gold SQL", f"{st.failed_gold:,}"),
            ("unreadable files/records", f"{st.unreadable_files:,}"),
            ("cross-split duplicates dropped", f"{st.duplicates_dropped:,}"),
            ("answer types", ", ".join(f"{k} {v:,}" for k, v in st.answer_types.items())),
            ("flags", ", ".join(f"{k} {v:,}" for k, v in st.flags.items()) or "none"),
            ("empty gold answers", f"{st.empty_gold:,}"),
            ("difficulty", ", ".join(f"{k} {v:,}" for k, v in st.difficulty.items())),
            ("database size", f"{st.database_bytes / 2**20:,.1f} MiB")]
    if st.largest_table_rows is not None:
        rows.append(("largest table", f"{st.largest_table_rows:,} rows"))
    rows += [(f"share {k}", f"{v:.1%}") for k, v in {**st.shares, **st.measured}.items()]
    for k, v in rows:
        top.add_row(k, v)
    console.print(top)
    if st.empty_gold:
        console.print("empty gold: an answer of [] is correct there without evidence; GRPO leaves those tasks out of "
                      "its prompts unless grpo.empty_gold: include")
    sp = Table(title="splits")
    for col in ("split", "databases", "tasks", "scalar / list / ordered", "budget-sensitive", "unanswerable XS",
                "empty gold"):
        sp.add_column(col, no_wrap=col == "split")
    for name, s in st.splits.items():
        sp.add_row(name, str(s.databases), f"{s.tasks:,}", " / ".join(str(v) for v in s.answer_types.values()),
                   f"{s.shares['budget_sensitive']:.1%}", f"{s.shares['unanswerable_xs']:.1%}", f"{s.empty_gold:,}")
    console.print(sp)


@data.command("catalog")
@_BENCHMARK
@_SEED
@_CACHE
def catalog_cmd(benchmark: Path, seed: int, cache_dir: Path | None) -> None:
    """Build (or reuse) the cached catalog of every database of a benchmark."""
    from bapsql.db.catalog_cache import load_or_build_catalog
    from bapsql.errors import BapsqlError

    bench = _load(benchmark, seed, cache_dir)
    paths = bench.db_paths()
    with _progress() as bar:
        task = bar.add_task("catalogs", total=len(paths))
        tables = 0
        for db, path in sorted(paths.items()):
            bar.update(task, description=f"catalog {db}")
            try:
                tables += len(load_or_build_catalog(path, cache_dir).table_names)
            except BapsqlError as exc:
                raise click.ClickException(f"{db}: {exc}") from exc
            bar.update(task, advance=1)
    click.echo(f"catalogs ready for {len(paths)} databases ({tables} tables)")


@data.command("check")
@click.option("--db", "db", required=True, type=click.Path(path_type=Path), help="SQLite database file (read-only).")
@click.option("--full", is_flag=True, help="PRAGMA integrity_check (also checks index contents; slower) instead of "
                                           "quick_check.")
@click.option("--busy-timeout", default=3.0, show_default=True, type=click.FloatRange(min=0),
              help="Seconds to wait for another program's write lock.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (path, ok, mode, journal_mode, problems).")
def check_cmd(db: Path, full: bool, busy_timeout: float, as_json: bool) -> None:
    """Verify a database file's integrity (PRAGMA quick_check) without writing to it. Exit 0 when it is sound,
    1 when SQLite found problems (listed), 2 when it stayed locked by a writer."""
    from bapsql.db.dbfile import BusyWait, integrity_check
    from bapsql.errors import DatabaseBusy

    try:
        rep = integrity_check(db, full=full, wait=BusyWait(busy_timeout))
    except DatabaseBusy as exc:
        click.echo(str(exc), err=True)
        raise SystemExit(2) from None
    if as_json:
        click.echo(json.dumps({"path": str(rep.path), "ok": rep.ok, "mode": rep.mode,
                               "journal_mode": rep.journal_mode, "problems": list(rep.problems),
                               "seconds": round(rep.seconds, 4)}))
    elif rep.ok:
        click.echo(f"{rep.path}: ok ({rep.mode}, {rep.journal_mode} journal, {rep.seconds:.2f} s)")
    else:
        click.echo(f"{rep.path}: {len(rep.problems)} problem(s) found by {rep.mode}:")
        for p in rep.problems:
            click.echo(f"  {p}")
    if not rep.ok:
        raise SystemExit(1)


@data.command("calibrate")
@_BENCHMARK
@click.option("--out", "out", default=None, type=click.Path(dir_okay=False, path_type=Path),
              help="Calibration JSON to write (load it with `--calibration FILE` elsewhere). Default: not written.")
@click.option("--target-coverage", default=0.998, show_default=True, type=click.FloatRange(0.5, 0.999),
              help="p95 factors are fitted to cover this share of training samples (above the held-out goals, "
                   "since coverage drops on unseen databases).")
@click.option("--max-sqls-per-db", default=400, show_default=True, type=click.IntRange(min=1),
              help="Samples per database (gold, naive and variant SQL; a seeded draw when there are more).")
@click.option("--json", "as_json", is_flag=True, help="Print the coverage report as one JSON object.")
@_SEED
@_CACHE
def calibrate_cmd(benchmark: Path, out: Path | None, target_coverage: float, max_sqls_per_db: int, as_json: bool,
                  seed: int, cache_dir: Path | None) -> None:
    """Fit the estimator's calibration on the TRAINING databases; report p95 coverage on held-out ones."""
    from bapsql.data.calibrate import calibrate_benchmark
    from bapsql.errors import BapsqlError

    bench = _load(benchmark, seed, cache_dir)
    with _progress() as bar:
        task = bar.add_task("collecting samples", total=None)
        try:
            rep = calibrate_benchmark(
                bench, out=out, target_coverage=target_coverage, max_sqls_per_db=max_sqls_per_db, seed=seed,
                cache_dir=cache_dir, progress=lambda i, n, db: bar.update(task, completed=i, total=n,
                                                                         description=f"samples {db}"))
        except BapsqlError as exc:
            raise click.ClickException(str(exc)) from exc
    if as_json:
        click.echo(json.dumps(rep.to_json(), indent=1, sort_keys=True))
        return
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"p95 coverage (fit on {len(rep.train_databases)} training databases, {rep.train_samples:,} "
                    f"samples)")
    for col in ("quantity", "train p95", f"held-out p95 ({rep.heldout_samples:,} samples)", "held-out p50"):
        t.add_column(col)
    for q, cov in rep.coverage_heldout.items():
        t.add_row(q, f"{rep.coverage_train[q]['p95']:.1%}", f"{cov['p95']:.1%}", f"{cov['p50']:.1%}")
    Console().print(t)
    click.echo(f"calibration written to {rep.out_path}" if rep.out_path else "calibration not written (no --out)")
