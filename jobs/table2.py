"""``python -m jobs.table2 [--config configs/experiments/table2_cpu.yaml] [--quick] [--out-dir DIR] [--stages ...]
[--rows ...]``:
Table 2 in miniature (`bapsql.train.experiments.table2`): pretrain, SFT, BAP-SQL RL and matched SQL-RL per seed, one
evaluation sweep over the rows, then the analysis and ``table2.md``. Rerun the same command to resume an interrupted
run."""

from __future__ import annotations

import sys

import click

DEFAULT_CONFIG = "configs/experiments/table2_cpu.yaml"
DEFAULT_STAGES = "pretrain,protocol,sft,rl_full,rl_sql,eval,report"  # every stage (tests: STAGES in this order)


def _csv(text: str) -> tuple[str, ...]:
    """The non-empty, stripped items of a comma-separated option."""
    return tuple(s.strip() for s in text.split(",") if s.strip())


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--config", "config_path", default=DEFAULT_CONFIG, show_default=True,
              type=click.Path(dir_okay=False), help="Table 2 experiment YAML.")
@click.option("--quick", is_flag=True, help="The config's quick: preset (a first look, under 30 min on 2 cores).")
@click.option("--out-dir", default=None, help="Override train.out_dir (runs go to DIR/<name>-seed<k>).")
@click.option("--stages", default=DEFAULT_STAGES, show_default=True,
              help="Comma-separated stages; finished ones are reused, GRPO and the sweep resume where they stopped.")
@click.option("--rows", default=None,
              help="Comma-separated Table 2 rows (raw, dashboard, adaptive_posthoc, sft, sql_rl, bap_rl) the eval "
                   "stage plays, e.g. --stages eval --rows sft to see a row as soon as its model is trained; a later "
                   "eval resumes the rest. Default: every row.")
def main(config_path: str, quick: bool, out_dir: str | None, stages: str, rows: str | None) -> None:
    """Train and evaluate the rows of the paper's Table 2 and write the report."""
    from rich.console import Console

    from bapsql.errors import BapsqlError
    from bapsql.train.experiments.table2 import STAGES, load_table2_config
    from bapsql.train.experiments.table2_run import run_table2

    console = Console(stderr=True)
    wanted = _csv(stages)
    bad = sorted(set(wanted) - set(STAGES))
    if bad or not wanted:
        raise click.UsageError(f"--stages: unknown stage(s) {bad}; use a comma-separated subset of {','.join(STAGES)}")
    try:
        cfg = load_table2_config(config_path, quick=quick, out_dir=out_dir)
        report = run_table2(cfg, stages=wanted, rows=None if rows is None else _csv(rows), console=console)
    except BapsqlError as exc:
        raise click.ClickException(str(exc)) from exc
    if report is not None:
        click.echo(f"Table 2 report: {report / 'table2.md'}")


if __name__ == "__main__":
    main(args=sys.argv[1:], prog_name="python -m jobs.table2")
