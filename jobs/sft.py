"""``python -m jobs.sft --config configs/train/X.yaml [--seed K]``: the SFT stage (Ray Train) of a training recipe.

Exports the workflows' turn pairs when the config names no Parquet, trains the LoRA adapter through Ray Train's
TorchTrainer (a private local Ray, or the cluster at ``rollout.ray_address``), and leaves
``<out_dir>/<name>-seed<K>/sft/{adapter,merged}``. Every seed of the config unless ``--seed`` picks one.
"""

from __future__ import annotations

import sys

import click


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--config", "config_path", required=True, type=click.Path(dir_okay=False),
              help="Training config YAML (configs/train/*.yaml or configs/smoke.yaml).")
@click.option("--seed", type=int, default=None, help="Train only this seed (default: every seed of the config).")
@click.option("--out-dir", default=None, help="Override the config's out_dir.")
def main(config_path: str, seed: int | None, out_dir: str | None) -> None:
    """Run the SFT stage of a training recipe."""
    from rich.console import Console

    from bapsql.errors import BapsqlError
    from bapsql.train.config import load_train_config
    from bapsql.train.recipe.pipeline import run_recipe

    console = Console(stderr=True)
    try:
        cfg = load_train_config(config_path, {"out_dir": out_dir} if out_dir else None)
        seeds = _seeds(cfg, seed)
        for s in seeds:
            result = run_recipe(cfg, s, stages=("sft",), console=console)
            if result.sft is not None:
                click.echo(f"seed {s}: SFT {result.sft.steps} steps over {result.sft.pairs} pairs, final loss "
                           f"{result.sft.losses[-1]:.4f}; merged model in {result.sft.merged_dir}")
    except BapsqlError as exc:
        raise click.ClickException(str(exc)) from exc


def _seeds(cfg, seed: int | None) -> tuple[int, ...]:
    if seed is None:
        return cfg.seeds
    if seed not in cfg.seeds:
        raise click.UsageError(f"--seed {seed} is not one of the config's seeds {list(cfg.seeds)}")
    return (seed,)


if __name__ == "__main__":
    main(args=sys.argv[1:], prog_name="python -m jobs.sft")
