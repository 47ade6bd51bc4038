"""``bapsql sweep CONFIG``: run an experiment YAML (methods × budgets × seeds) on Ray and log Parquet trajectories."""

from __future__ import annotations

import click


@click.command("sweep")
@click.argument("config", type=click.Path(dir_okay=False))
@click.option("--address", default=None, metavar="ADDR",
              help="Join a running Ray cluster (auto, HOST:PORT or ray://HOST:PORT). Default: the config's ray.address, "
                   "else a private local Ray with its own temp dir.")
@click.option("--out", "out_dir", default=None, type=click.Path(file_okay=False),
              help="Run folder for the logs (default: the config's out_dir). Rerunning into it resumes.")
@click.option("--local", "local", is_flag=True, help="Run the actors in this process instead of on Ray (debugging).")
@click.option("--limit", default=None, type=click.IntRange(min=1), help="Override the config: first N tasks only.")
def sweep_cmd(config: str, address: str | None, out_dir: str | None, local: bool, limit: int | None) -> None:
    """Run the evaluation sweep described by CONFIG (e.g. configs/experiments/smoke.yaml).

    Writes OUT/episodes/method=M/budget=B/*.parquet, OUT/turns/... and OUT/sweep.json; episode ids are
    deterministic, so an interrupted sweep restarted with the same OUT skips what is already logged. Shows a
    progress bar and prints a per-method × budget summary at the end.
    """
    import sys
    from pathlib import Path

    from rich.console import Console

    from bapsql.errors import BapsqlError
    from bapsql.experiment import load_experiment
    from bapsql.rollout.sweep import run_sweep

    if not Path(config).is_file():
        raise click.UsageError(f"CONFIG {config!r} is not a file; pass an experiment YAML such as "
                               "configs/experiments/smoke.yaml")
    if local and address:
        raise click.UsageError("--local and --address exclude each other")
    try:
        cfg = load_experiment(config, limit=limit)
        console = Console(stderr=True, width=None if sys.stderr.isatty() else 150)
        summary = run_sweep(cfg, address=address, out_dir=out_dir, console=console,
                            backend="local" if local else "ray")
    except BapsqlError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"{summary.result.episodes_run} episodes logged to {summary.run_dir} "
               f"({summary.result.episodes_skipped} already there); analyse with: bapsql analyze {summary.run_dir}")
