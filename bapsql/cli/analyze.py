"""``bapsql analyze``: the offline analysis job over one or more run directories (thin wrapper)."""

from __future__ import annotations

import click


@click.command("analyze")
@click.argument("runs", nargs=-1, required=True, type=click.Path(path_type=str))
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False, path_type=str),
              help="Folder for report.md, report.html, frontier.png, quality_tokens.png and summary.json.")
@click.option("--reference", default=None, metavar="METHOD",
              help="Method the others are compared against, e.g. 'scripted.drafter@dashboard' (default: none; "
                   "then the primary gates, Table 4 deltas and transitions are left out).")
@click.option("--replicates", default=10_000, show_default=True, type=click.IntRange(min=1),
              help="Database-cluster bootstrap replicates.")
@click.option("--seed", default=0, show_default=True, type=int, help="Seed of the bootstrap draws.")
def analyze(runs: tuple[str, ...], out_dir: str, reference: str | None, replicates: int, seed: int) -> None:
    """Analyse the Parquet trajectory logs of RUN directories (episodes/ and turns/ inside).

    Computes Budgeted Success and Frontier Scores, paired database-cluster bootstrap comparisons with the ordered
    primary gate, transitions and estimator diagnostics, and writes a Markdown/HTML report with figures.
    """
    import time

    from bapsql.analysis.analyze import analyze_runs
    from bapsql.errors import BapsqlError

    start = time.perf_counter()

    def progress(message: str) -> None:
        click.echo(f"[{time.perf_counter() - start:6.1f}s] {message}", err=True)

    try:
        summary = analyze_runs(runs, out_dir, reference=reference, replicates=replicates, seed=seed,
                               progress=progress)
    except BapsqlError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"analysed {summary.episodes:,} episodes of {len(summary.methods)} method(s)")
    click.echo(f"report: {out_dir}/report.html (also report.md, summary.json, figures)")
