"""``bapsql eval`` / ``bapsql policies`` / ``bapsql conditions`` / ``bapsql sft-data``: thin wrappers over the
runner, the policy registry, the condition presets and the SFT exporter."""

from __future__ import annotations

import click

_BENCH_HELP = ("Benchmark folder (embedded, BIRD or Spider layout), or 'demo' for the small embedded benchmark "
               "('demo:binding' for its binding task mix).")


def _seeds(spec: str) -> tuple[int, ...]:
    try:
        seeds = tuple(int(s) for s in spec.split(",") if s.strip())
    except ValueError:
        raise click.UsageError(f"--seeds must be comma-separated integers such as 0,1,2; got {spec!r}") from None
    if not seeds:
        raise click.UsageError("--seeds needs at least one seed, e.g. --seeds 0")
    return seeds


def _budgets(spec: str) -> tuple[str, ...]:
    from bapsql.budgets import load_ladder
    from bapsql.errors import ConfigError

    try:
        return tuple(b.level for b in load_ladder().parse_levels(spec))
    except ConfigError as exc:
        raise click.UsageError(f"--budgets: {exc}") from None


def _check_benchmark(benchmark: str) -> None:
    from pathlib import Path

    from bapsql.data.tasks import demo_mix
    from bapsql.errors import ConfigError

    try:
        mix = demo_mix(benchmark)
    except ConfigError as exc:
        raise click.UsageError(f"--benchmark: {exc}") from None
    if mix is None and not Path(benchmark).is_dir():
        raise click.UsageError(f"--benchmark {benchmark!r} is not a folder; pass a benchmark folder, 'demo' or "
                               "'demo:<mix>'")


@click.command("eval")
@click.option("--benchmark", required=True, help=_BENCH_HELP)
@click.option("--split", default="dev", show_default=True,
              help="Split to evaluate (train, test = held-out tasks of the train databases, validation, dev).")
@click.option("--policy", "policy_name", required=True, metavar="NAME",
              help="Policy name, e.g. workflow.estimate_rewrite or scripted.drafter (see `bapsql policies`), "
                   "optionally with its condition as NAME@CONDITION.")
@click.option("--condition", "condition", default=None, metavar="NAME",
              help="Condition to run under (see `bapsql conditions`); default: the one in --policy, else full.")
@click.option("--calibration", default=None, type=click.Path(dir_okay=False, exists=True),
              help="Estimator calibration JSON (from `bapsql data calibrate`); default: the packaged one.")
@click.option("--posthoc-engine", default=None, type=click.Path(dir_okay=False, exists=True),
              help="Engine YAML of a model that decides the adaptive post-hoc control (default: the rule-based one).")
@click.option("--budgets", default="XS,S,M,L", show_default=True, help="Comma-separated budget levels.")
@click.option("--seeds", default="0", show_default=True, help="Comma-separated seeds, e.g. 0,1,2.")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Run folder for the logs.")
@click.option("--run-name", default=None, help="Run name in the logs (default: the --out folder's name).")
@click.option("--limit", default=None, type=click.IntRange(min=1), help="Evaluate only the first N tasks.")
@click.option("--log-text", default="all", show_default=True, type=click.Choice(["all", "sample", "none"]),
              help="Which episodes' turns keep their completion and observation text in the logs.")
@click.option("--log-text-share", default=0.1, show_default=True, type=click.FloatRange(0, 1, min_open=True),
              help="With --log-text sample: the share of episodes that keep it (chosen by episode id).")
def eval_cmd(benchmark: str, split: str, policy_name: str, condition: str | None, calibration: str | None,
             posthoc_engine: str | None, budgets: str, seeds: str, out_dir: str, run_name: str | None,
             limit: int | None, log_text: str, log_text_share: float) -> None:
    """Run one policy under one condition over a benchmark split × budgets × seeds in-process; log Parquet.

    Writes OUT/episodes/method=POLICY@CONDITION/budget=B/*.parquet, OUT/turns/... and OUT/sweep.json (methods and
    the calibration file with its hash); rerunning into the same OUT skips the episodes already logged. Prints a
    per-budget summary table.
    """
    from rich.console import Console

    from bapsql.errors import BapsqlError
    from bapsql.logs.text import TextLogConfig
    from bapsql.rollout.runner import evaluate

    _check_benchmark(benchmark)
    levels, seed_list = _budgets(budgets), _seeds(seeds)
    try:
        summary = evaluate(benchmark, split, policy_name, levels, seed_list, out_dir, run_name=run_name,
                           limit=limit, condition=condition, calibration=calibration,
                           posthoc_engine=posthoc_engine, console=Console(stderr=True),
                           log_text=TextLogConfig(mode=log_text, share=log_text_share))
    except BapsqlError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"{summary.method}: {summary.episodes_run} episodes logged to {out_dir} "
               f"({summary.episodes_skipped} already there) in {summary.wall_s:.1f}s")


@click.command("policies")
def policies_cmd() -> None:
    """List every scripted policy, one per line (the first word is the name); a model policy is model:ENGINE."""
    from bapsql.policies.registry import make_policy, policy_names

    for name in policy_names():
        doc = (type(make_policy(name)).__doc__ or "").strip().splitlines()
        click.echo(f"{name:<36} {doc[0] if doc else ''}".rstrip())


@click.command("conditions")
def conditions_cmd() -> None:
    """List every condition preset, one per line (the first word is the name), with its switches."""
    from bapsql.env.conditions import CONDITIONS

    for c in CONDITIONS.values():
        tools = ",".join(c.actions)
        click.echo(f"{c.name:<22} dashboard={'on' if c.show_dashboard else 'off'} estimates={c.estimates} "
                   f"preflight={c.preflight} rewrite={c.rewrite} posthoc={c.posthoc} tools={tools}  "
                   f"# {c.description}")


@click.command("sft-data")
@click.option("--benchmark", required=True, help=_BENCH_HELP)
@click.option("--split", default="train", show_default=True, help="Split whose tasks the workflows run on.")
@click.option("--n", "n", default=8192, show_default=True, type=click.IntRange(min=1), help="Pairs to collect.")
@click.option("--out", "out", required=True, type=click.Path(dir_okay=False), help="Output Parquet file.")
@click.option("--seed", default=0, show_default=True, type=int, help="Seed of the task / budget order.")
@click.option("--condition", default="full", show_default=True, metavar="NAME",
              help="Run the workflows under a condition, e.g. no_planning for the action-matched SFT set.")
@click.option("--tool-schemas/--no-tool-schemas", default=False, show_default=True,
              help="Also render the JSON tool schemas into the prompt (the env does not charge them).")
@click.option("--max-length", default=8192, show_default=True, type=click.IntRange(min=16),
              help="Drop pairs longer than this many tokens.")
@click.option("--branch-tries", default=0, show_default=True, type=click.IntRange(min=0),
              help="Let estimate_rewrite, justified_abstention and recover_after_rejection play up to this many "
                   "episodes for one that rewrites / abstains (0: off).")
@click.option("--per-episode/--per-turn", default=False, show_default=True,
              help="One row per episode's token stream (every completion in the loss) instead of one per turn.")
@click.option("--tokenizer", "tokenizer_dir", default=None, type=click.Path(file_okay=False, exists=True),
              help="Model folder whose tokenizer and chat template render and count the prompts (default: the "
                   "packaged one); budgets are in its tokens.")
def sft_data_cmd(benchmark: str, split: str, n: int, out: str, seed: int, condition: str,
                 tool_schemas: bool, max_length: int, branch_tries: int, per_episode: bool,
                 tokenizer_dir: str | None) -> None:
    """Export turn-level SFT pairs (prompt, completion, token ids, loss masks) from the nine workflows."""
    from rich.console import Console

    from bapsql.errors import BapsqlError
    from bapsql.policies.sft_export import export_sft

    _check_benchmark(benchmark)
    try:
        res = export_sft(benchmark, split, n, out, seed=seed, condition=condition,
                         tool_schemas=tool_schemas, max_length=max_length, console=Console(stderr=True),
                         branch_tries=branch_tries, per_episode=per_episode, tokenizer_dir=tokenizer_dir)
    except BapsqlError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"{res.pairs} pairs from {res.kept_episodes}/{res.episodes} kept episodes "
               f"({res.duplicates} duplicates, {res.too_long} too long) -> {res.path} in {res.wall_s:.1f}s")
    if res.pairs < n:
        click.echo(f"note: only {res.pairs} unique pairs exist for this split (asked for {n})", err=True)
    click.echo("per workflow: " + ", ".join(f"{k}={v}" for k, v in sorted(res.per_workflow.items())))
    click.echo("per budget: " + ", ".join(f"{k}={v}" for k, v in res.per_budget.items()))
    click.echo("took their branch: " + (", ".join(f"{k}={v}" for k, v in sorted(res.branched.items())) or "none"))
    click.echo("estimate first (kept episodes): " + (res.estimate_first_line() or "none"))
