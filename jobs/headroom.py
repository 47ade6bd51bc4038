"""``python -m jobs.headroom --config configs/train/X.yaml [--seed K] [--adapter DIR] [--levels XS,S]``: GRPO's
headroom on the held-out validation questions (`bapsql.train.experiments.headroom`).

Plays the validation questions once greedy and ``filter.group_size`` times at ``grpo.temperature`` with the seed's
SFT model (or the LoRA ``--adapter`` on it, e.g. ``<run>/grpo/adapter``), prints per level greedy success, sampled
success, pass@k, the tasks only sampling solves ("sharpenable": what GRPO can add by sharpening) and the tasks
greedy decoding solves but most samples fail ("at risk"), and writes ``<run dir>/headroom[-<adapter>-<digest>].json``
(`bapsql.train.experiments.headroom.result_name`: two adapters never share a file).
Needs the SFT stage's merged model (``python -m jobs.grpo --config X --stages pretrain,sft``).
"""

from __future__ import annotations

import sys

import click


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--config", "config_path", required=True, type=click.Path(dir_okay=False),
              help="Training config YAML (configs/train/*.yaml).")
@click.option("--seed", type=int, default=None, help="The run's seed (default: the config's first seed).")
@click.option("--adapter", default=None, type=click.Path(file_okay=False),
              help="A LoRA adapter folder on the SFT model to measure instead of the SFT model itself.")
@click.option("--levels", default=None, help="Comma-separated budget levels (default: the config's budgets.levels).")
@click.option("--out-dir", default=None, help="Override the config's out_dir.")
def main(config_path: str, seed: int | None, adapter: str | None, levels: str | None, out_dir: str | None) -> None:
    """Measure what sampling solves that greedy decoding does not, on held-out questions."""
    from rich.console import Console

    from bapsql.errors import BapsqlError
    from bapsql.train.config import load_train_config
    from bapsql.train.experiments.headroom import measure_headroom, render_headroom

    console = Console(stderr=True)
    try:
        cfg = load_train_config(config_path, {"out_dir": out_dir} if out_dir else None)
        if seed is not None and seed not in cfg.seeds:
            raise click.UsageError(f"--seed {seed} is not one of the config's seeds {list(cfg.seeds)}")
        lv = tuple(x.strip() for x in levels.split(",") if x.strip()) if levels else None
        rows, path = measure_headroom(cfg, cfg.seeds[0] if seed is None else seed, adapter=adapter, levels=lv,
                                      console=console)
    except BapsqlError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(render_headroom(rows))
    click.echo(f"written: {path}")


if __name__ == "__main__":
    main(args=sys.argv[1:], prog_name="python -m jobs.headroom")
