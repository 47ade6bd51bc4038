"""``python -m jobs.harvest_slips --config configs/train/X.yaml --out FILE [--seeds 0,1] [--out-dir DIR]``: a slip
bank (`bapsql.policies.slips`) from a finished run's GRPO training rollouts.

Reads ``<run dir>/grpo/rollouts/turns/method=<rollout.method>@<condition>`` of each seed (training rollouts only: the
validation partitions, ``<method>.val@…``, hold the held-out questions and are never read), rebuilds the GRPO prompts
those episodes played (`bapsql.train.loop.grpo_data.grpo_tasks`) and writes, per task, the distinct first queries
SQLite refused for a name it lacks. A config's ``sft.slips: FILE`` then plays them in
``workflow.recover_from_error`` SFT episodes.
"""

from __future__ import annotations

import sys
import click


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--config", "config_path", required=True, type=click.Path(dir_okay=False),
              help="The training config of the run whose rollouts to read (configs/train/*.yaml).")
@click.option("--out", "out_path", required=True, type=click.Path(dir_okay=False), help="The bank to write (.jsonl).")
@click.option("--seeds", default=None,
              help="Comma-separated seeds whose GRPO rollouts to read (default: the config's).")
@click.option("--out-dir", default=None, help="Override the config's out_dir (where the run folders are).")
def main(config_path: str, out_path: str, seeds: str | None, out_dir: str | None) -> None:
    """Harvest a policy's own failed first queries from its GRPO rollouts."""
    from rich.console import Console

    from bapsql.data.tasks import resolve_benchmark
    from bapsql.errors import BapsqlError
    from bapsql.policies.slips import harvest_slips
    from bapsql.train.config import load_train_config
    from bapsql.train.loop.grpo_data import grpo_tasks

    console = Console(stderr=True)
    try:
        cfg = load_train_config(config_path, {"out_dir": out_dir} if out_dir else None)
        chosen = [int(s) for s in seeds.split(",") if s.strip()] if seeds else list(cfg.seeds)
        unknown = [s for s in chosen if s not in cfg.seeds]
        if unknown:
            raise click.UsageError(f"--seeds {unknown} are not among the config's seeds {list(cfg.seeds)}")
        root = resolve_benchmark(cfg.data.benchmark)
        part = f"method={cfg.rollout.method}@{cfg.condition}"
        runs = [(cfg.run_dir(seed) / "grpo" / "rollouts" / "turns" / part, grpo_tasks(cfg, seed, root))
                for seed in chosen]
        bank = harvest_slips(runs)
        path = bank.save(out_path, root)
    except BapsqlError as exc:
        console.print(f"[red]error:[/red] {exc}")
        sys.exit(2)
    console.print(f"{bank.n_slips} slips on {len(bank)} tasks from {len(runs)} run(s) -> {path}")


if __name__ == "__main__":
    main()
