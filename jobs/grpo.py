"""``python -m jobs.grpo --config configs/train/X.yaml [--seed K] [--resume]``: GRPO (and what it needs around it).

Runs, per seed: SFT when its merged model is missing (and ``sft.enabled``), the GRPO updates (``--resume``
continues from the latest checkpoint exactly), then the evaluation sweep + analysis report when ``eval.enabled`` —
so ``python -m jobs.grpo --config configs/smoke.yaml`` is the whole CPU smoke recipe. ``--stages`` picks stages.
Prints success by budget of the evaluated policies at the end.
"""

from __future__ import annotations

import sys

import click


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--config", "config_path", required=True, type=click.Path(dir_okay=False),
              help="Training config YAML (configs/train/*.yaml or configs/smoke.yaml).")
@click.option("--seed", type=int, default=None, help="Train only this seed (default: every seed of the config).")
@click.option("--resume", is_flag=True, help="Continue from the latest GRPO checkpoint (and keep existing SFT).")
@click.option("--stages", default="pretrain,sft,grpo,eval", show_default=True,
              help="Comma-separated stages to run; pretrain (when the config enables it) and sft run only when "
                   "their outputs are missing unless named alone.")
@click.option("--out-dir", default=None, help="Override the config's out_dir.")
def main(config_path: str, seed: int | None, resume: bool, stages: str, out_dir: str | None) -> None:
    """Run GRPO for a training recipe (SFT first when needed, evaluation after when configured)."""
    from rich.console import Console

    from bapsql.errors import BapsqlError
    from bapsql.train.config import load_train_config
    from bapsql.train.recipe.evaluation import pooled_report
    from bapsql.train.recipe.pipeline import run_recipe, sft_dir

    console = Console(stderr=True)
    wanted = tuple(s.strip() for s in stages.split(",") if s.strip())
    bad = sorted(set(wanted) - {"pretrain", "sft", "grpo", "eval"})
    if bad or not wanted:
        raise click.UsageError(f"--stages: unknown stage(s) {bad}; use a comma-separated subset of "
                               "pretrain,sft,grpo,eval")
    try:
        cfg = load_train_config(config_path, {"out_dir": out_dir} if out_dir else None)
        if seed is not None and seed not in cfg.seeds:
            raise click.UsageError(f"--seed {seed} is not one of the config's seeds {list(cfg.seeds)}")
        for s in (cfg.seeds if seed is None else (seed,)):
            run = list(wanted)
            if "sft" in run and cfg.sft.shared and s != cfg.seeds[0]:
                run.remove("sft")  # one SFT model for every seed: the first seed's stage trains it
                console.print(f"[cyan]sft.shared: seed {s} starts from {sft_dir(cfg, s)}[/cyan]")
            elif "sft" in run and (sft_dir(cfg, s) / "merged" / "config.json").is_file() and wanted != ("sft",):
                run.remove("sft")
                console.print(f"[cyan]SFT model exists in {sft_dir(cfg, s)}; skipping SFT[/cyan]")
            done = cfg.run_dir(s) / "pretrain" / "result.json"
            if "pretrain" in run and done.is_file() and wanted != ("pretrain",):
                run.remove("pretrain")
                console.print(f"[cyan]pretrained model exists in {done.parent}; skipping pretraining[/cyan]")
            result = run_recipe(cfg, s, resume=resume, stages=tuple(run), console=console)
            if result.grpo is not None:
                click.echo(f"seed {s}: GRPO reached update {result.grpo.updates} in {result.grpo.seconds:.0f} s; "
                           f"policy in {result.grpo.merged_dir}")
            for method, by_level in result.success.items():
                cells = ", ".join(f"{lv} {100 * v:.1f}%" for lv, v in by_level.items())
                click.echo(f"seed {s}: {method}: {cells}")
            if result.report_dir is not None:
                click.echo(f"seed {s}: report in {result.report_dir / 'report.md'}")
        if "eval" in wanted and cfg.eval.enabled and seed is None and len(cfg.seeds) > 1:
            pooled = pooled_report(cfg, cfg.seeds)
            if pooled is not None:
                click.echo(f"seeds {list(cfg.seeds)} pooled: report in {pooled / 'report.md'}")
    except BapsqlError as exc:
        raise click.ClickException(str(exc)) from exc


if __name__ == "__main__":
    main(args=sys.argv[1:], prog_name="python -m jobs.grpo")
