"""Evaluation sweeps: an `ExperimentConfig` played on Ray (or in-process) into one run's Parquet logs.

`run_sweep(cfg, address=None, out_dir=None, console=None, backend="ray")`:

1. resolves the benchmark (``demo`` → the embedded benchmark at ``demo_scale``, built into the cache dir on first
   use) and the split's tasks (database by database, the first ``limit``);
2. expands methods × budgets × seeds × tasks into `EpisodeSpec` s (`GroupSampler`, ``samples_per_group`` each),
   keeps each scoped method's cells (``scopes``, `bapsql.experiment.ExperimentConfig.scoped`) and skips the ids
   already in the run dir (deterministic ids: an interrupted sweep restarted resumes);
3. starts the actors — env workers (sharded by database, kept off a multi-node cluster's head), one engine host
   per engine and replica (shared by the methods naming that engine), the trajectory writer (no CPU reserved) —
   with a progress line while they are placed and `PlacementError` for one still unplaced after
   ``workers.placement_timeout_s`` — on a private local Ray (own temp dir under the run dir's ``tmp``, ``num_cpus``
   explicit, never ``ray stop``) or on the cluster at ``address``; ``backend="local"`` runs the same plain classes
   in this process;
4. runs the `Driver` with a rich progress bar (a placebo method ``P@shuffled_estimate`` runs after the others: its
   pool is recorded from the logged estimates of ``P@full`` into ``placebo/`` in the run folder, `bapsql.env.placebo`;
   once it ran, how far its shown payloads were from an exact permutation — `placebo_run_stats`, ``unmatched`` — is
   computed from the logs), live metrics to the monitor (W&B offline without an API key, or none), then flushes and
   closes the writer and writes ``sweep.json`` (config + per-cell summary + ``placebo``) beside the logs;
   the monitor then gets the table ``eval/trajectories`` of a few logged trajectories per method × level, one row
   per turn with the completion and observation text (`bapsql.logs.samples.run_trajectory_table`); the writer keeps
   turn text as ``cfg.log_text`` says (`bapsql.logs.text`);
5. returns a `SweepSummary`; `summary_table` renders it (the CLI prints it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from bapsql.experiment import ExperimentConfig, placebo_source_method, with_template_kwargs
from bapsql.files import atomic_write_text
from bapsql.models.resolve import resolve_model
from bapsql.progress import Progress
from bapsql.rollout.backend import ActorSpec
from bapsql.rollout.completion_cap import warn_completion_cap
from bapsql.rollout.driver import CellStats, Driver, DriverConfig, RolloutResult
from bapsql.rollout.groups import GroupSampler
from bapsql.rollout.phases import engine_phases, phase_experiment


@dataclass(frozen=True)
class SweepSummary:
    """What a sweep did: where its logs are, how many episodes ran or were already there, per-cell results."""

    run: str
    run_dir: Path
    split: str
    tasks: int
    episodes_total: int
    result: RolloutResult
    backend: str
    env_workers: int
    engines: dict[str, str]  # model method -> engine kind
    setup_s: float
    actor_restarts: dict[str, int] = dataclasses.field(default_factory=dict)  # "env/0" -> restarts (the backend's)
    placebo: dict[str, dict] = dataclasses.field(default_factory=dict)  # placebo method -> `placebo_run_stats`

    @property
    def cells(self) -> tuple[CellStats, ...]:
        return self.result.cells


def benchmark_dir(cfg: ExperimentConfig, *, announce: Callable[[str], None] | None = None) -> Path:
    """The benchmark folder of ``cfg`` (``demo`` / ``demo:<mix>`` → the cached embedded benchmark at
    ``cfg.demo_scale``, built when missing)."""
    from bapsql.data.tasks import resolve_benchmark

    return resolve_benchmark(cfg.benchmark, scale=cfg.demo_scale, announce=announce)


def actor_specs(cfg: ExperimentConfig, run_dir: Path, n_workers: int, agents: dict[str, Any],
                engines: dict[str, Any]) -> tuple[list[ActorSpec], dict[str, list[tuple]]]:
    """Actor specs of a sweep and, per model method, its engine replica keys. ``engines``: engine name -> config;
    the methods naming one engine (``model:<name>@<condition>``) share its replicas."""
    from bapsql.env.records import EnvOptions
    from bapsql.rollout.engine_host import EngineHost
    from bapsql.rollout.workers import EnvWorker
    from bapsql.rollout.writer_host import WriterHost

    w = cfg.workers
    options = EnvOptions(prompt_style=cfg.prompt_style)
    specs = [ActorSpec(("env", i), EnvWorker, (i,), {"agents": agents, "token_counter": cfg.token_counter,
                                                     "env_options": options, "calibration": cfg.calibration,
                                                     "placebo_dir": str((run_dir / "placebo").resolve())},
                       num_cpus=w.env_worker_cpus, resources=dict(w.env_resources), placement="spread")
             for i in range(n_workers)]
    replicas: dict[str, list[tuple]] = {}
    for name, ec in engines.items():  # one set of replicas per engine, shared by the methods that name it
        replicas[name] = [("engine", name, r) for r in range(w.engine_replicas)]
        specs += [ActorSpec(k, EngineHost, (ec,), {"threads": w.engine_threads}, num_cpus=w.engine_cpus,
                            num_gpus=w.engine_gpus, resources=dict(w.engine_resources)) for k in replicas[name]]
    keys = {m: replicas[cfg.engine_of(m)] for m in cfg.model_methods if cfg.engine_of(m) in replicas}
    # the writer is I/O-bound: it reserves no CPU, so pinned to the driver's node it always fits there
    specs.append(ActorSpec(("writer", 0), WriterHost, (str(run_dir.resolve()), cfg.run), {"text": cfg.log_text},
                           num_cpus=0.0,
                           resources=dict(w.writer_resources),
                           placement="driver" if w.writer == "driver" else "default"))
    return specs, keys


def run_sweep(cfg: ExperimentConfig, *, address: str | None = None, out_dir: str | Path | None = None,
              console: Any = None, backend: str = "ray",
              on_progress: Callable[[int, int, Any], None] | None = None, monitor: Any = None) -> SweepSummary:
    """Run the sweep (module docstring). ``on_progress(done, total, backend)`` is called as episodes finish.
    ``monitor``: a `bapsql.logs.monitor.Monitor` to use instead of the one ``cfg.monitor`` makes (the caller
    closes it)."""
    from bapsql.logs.monitor import make_monitor
    from bapsql.logs.writer import existing_episode_ids
    from bapsql.rollout.agent import AgentConfig
    from bapsql.data.tasks import load_tasks

    phases = engine_phases(cfg)
    if len(phases) > 1:
        return _run_phases(cfg, phases, address=address, out_dir=out_dir, console=console, backend=backend,
                           on_progress=on_progress, monitor=monitor)
    t0 = time.perf_counter()
    placebo_stats: dict[str, dict] = {}
    say = (lambda msg: console.print(f"[yellow]{msg}[/yellow]")) if console is not None else None
    run_dir = Path(out_dir) if out_dir is not None else cfg.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    root = benchmark_dir(cfg, announce=say)
    tasks = load_tasks(root, cfg.split, limit=cfg.limit)
    specs = cfg.scoped(GroupSampler(cfg.run, samples_per_group=cfg.samples_per_group).sweep(
        cfg.methods, tasks, cfg.budgets, cfg.seeds))  # each method's scope (cfg.scopes) keeps its cells
    done_ids = existing_episode_ids(run_dir)
    agents, engines = {}, {}
    for method in cfg.model_methods:
        s = cfg.sampling
        name = cfg.engine_of(method)
        if name not in engines:
            ec = with_template_kwargs(cfg.engines[name], s.template_kwargs, name)
            engines[name] = dataclasses.replace(ec, model=resolve_model(ec.model, announce=say),
                                                num_threads=ec.num_threads or cfg.workers.engine_threads)
        ec = engines[name]
        # the engine's chat-template options (sampling.template_kwargs merged in): prompts render as the server would
        agents[method] = AgentConfig(model_dir=str(ec.tokenizer_dir or ec.model), max_tokens=s.max_tokens,
                                     temperature=s.temperature, top_p=s.top_p, max_model_len=ec.max_model_len,
                                     template_kwargs=dict(ec.chat_template_kwargs))
    for name, ec in engines.items():  # an answer longer than a turn's new tokens cannot be given (completion_cap)
        warn_completion_cap(tasks, ec.tokenizer_dir or ec.model, cfg.sampling.max_tokens,
                            where=f"`{cfg.split}` (engine {name})",
                            key="sampling.max_tokens (a training config's eval.max_new_tokens)", say=say)
    n_workers = max(1, min(cfg.workers.env_workers, len({t.db_id for t in tasks}) or 1))
    actors, engine_keys = actor_specs(cfg, run_dir, n_workers, agents, engines)
    own_monitor = monitor is None
    if own_monitor:
        monitor = make_monitor(cfg.monitor.kind, project=cfg.monitor.project, run_name=cfg.run,
                               config=cfg.to_dict(), dir=run_dir)
    dcfg = DriverConfig(in_flight=cfg.workers.in_flight, scripted_batch=cfg.workers.scripted_batch,
                        max_reruns=cfg.workers.max_reruns)
    todo = sum(s.episode_id not in done_ids for s in specs)
    progress_bar = Progress(console, f"sweep {cfg.run}", todo)

    def progress(done: int, total: int) -> None:
        progress_bar.update(done)
        if on_progress is not None:
            on_progress(done, total, be)

    if backend == "local":
        from bapsql.rollout.backend import LocalBackend

        session = contextlib.nullcontext()
        be = LocalBackend()
    elif backend == "ray":
        from bapsql.rollout.ray_shell import RayBackend, ray_session, short_temp_dir

        # a private local Ray gets at least the logical CPUs its actors reserve (else they would never start)
        ncpu = max(cfg.ray.num_cpus or os.cpu_count() or 1, math.ceil(sum(a.num_cpus for a in actors)))
        session = ray_session(address or cfg.ray.address, num_cpus=ncpu, include_dashboard=cfg.ray.include_dashboard,
                              temp_dir=None if (address or cfg.ray.address) else short_temp_dir(run_dir / "tmp"))
        be = RayBackend(max_restarts=cfg.workers.max_restarts, placement_timeout_s=cfg.workers.placement_timeout_s)
    else:
        raise ValueError(f"backend must be 'ray' or 'local', got {backend!r}")
    try:
        with session:
            if backend == "ray" and cfg.ray.preflight:
                from bapsql.rollout.ray_shell.nodes import preflight

                preflight(root, run_dir)
            if backend == "ray":  # a progress line while the actors are placed; PlacementError when one never is
                with Progress(console, "placing actors", len(actors), interval_s=10.0) as placing:
                    be.start(actors, progress=placing)
            else:
                be.start(actors)
            setup_s = time.perf_counter() - t0
            progress_bar.start()
            try:
                driver = Driver(be, n_workers, engines=engine_keys, config=dcfg, monitor=monitor, progress=progress)
                placebo = {m: src for m in cfg.methods if (src := placebo_source_method(m)) is not None}
                first = [s for s in specs if s.method not in placebo]
                result = driver.run(first, skip=done_ids)
                if placebo:  # the placebo's methods run once the runs they permute are on disk (bapsql.env.placebo)
                    _flush_writer(be)
                    write_placebo_pools(run_dir, placebo)
                    later = driver.run([s for s in specs if s.method in placebo], skip=done_ids)
                    result = merge_results(result, later)
                    _flush_writer(be)
                    placebo_stats = placebo_run_stats(run_dir, placebo)
            finally:
                progress_bar.stop()
                _close_writer(be)
                restarts = {"/".join(map(str, k)): n for k, n in be.restarts().items()}
                be.shutdown()
        if restarts and say is not None:
            say(f"actor restarts: {restarts} (reruns {result.reruns})")
        monitor.summary({"episodes_run": result.episodes_run, "episodes_skipped": result.episodes_skipped,
                         "reruns": result.reruns, "rollout_s": round(result.wall_s, 3),
                         "actor_restarts": sum(restarts.values()),
                         **{f"success/{c.method}/{c.budget}": c.success_rate for c in result.cells}})
        _log_trajectory_table(monitor, run_dir)
    finally:
        if own_monitor:
            monitor.close()
    summary = SweepSummary(cfg.run, run_dir, cfg.split, len(tasks), len(specs), result, backend, n_workers,
                           {m: getattr(engines[cfg.engine_of(m)], "kind", "?") for m in cfg.model_methods},
                           round(setup_s, 3), restarts,
                           placebo_stats)
    _write_record(run_dir / "sweep.json", cfg, summary)
    if console is not None:
        console.print(summary_table(summary))
    return summary


def _run_phases(cfg: ExperimentConfig, phases: list[tuple[str, ...]], *, out_dir: str | Path | None,
                console: Any, monitor: Any, **kw: Any) -> SweepSummary:
    """``workers.engine_phases``: each group of methods (`bapsql.rollout.phases.engine_phases`) swept into the same run
    folder with its own actors, one after another; one summary and ``sweep.json`` for the whole config."""
    from bapsql.logs.monitor import make_monitor

    run_dir = Path(out_dir) if out_dir is not None else cfg.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    own_monitor = monitor is None
    if own_monitor:
        monitor = make_monitor(cfg.monitor.kind, project=cfg.monitor.project, run_name=cfg.run,
                               config=cfg.to_dict(), dir=run_dir)
    parts: list[SweepSummary] = []
    try:
        for i, methods in enumerate(phases):
            if console is not None:
                console.print(f"[yellow]engine phase {i + 1}/{len(phases)}: {', '.join(methods)}[/yellow]")
            parts.append(run_sweep(phase_experiment(cfg, methods), out_dir=run_dir, console=console,
                                   monitor=monitor, **kw))
    finally:
        if own_monitor:
            monitor.close()
    result = parts[0].result
    for p in parts[1:]:
        result = merge_results(result, p.result)
    restarts: dict[str, int] = {}
    for i, p in enumerate(parts):
        restarts.update({f"phase{i}/{k}": n for k, n in p.actor_restarts.items()})
    summary = SweepSummary(cfg.run, run_dir, cfg.split, parts[0].tasks, sum(p.episodes_total for p in parts), result,
                           parts[0].backend, max(p.env_workers for p in parts),
                           {m: k for p in parts for m, k in p.engines.items()},
                           round(sum(p.setup_s for p in parts), 3), restarts,
                           {m: st for p in parts for m, st in p.placebo.items()})
    _write_record(run_dir / "sweep.json", cfg, summary)
    return summary


def _log_trajectory_table(monitor: Any, run_dir: Path) -> None:
    """Log a few of the run's trajectories, turn by turn, to ``monitor`` (none when nothing is logged yet)."""
    from bapsql.logs.monitor import NullMonitor
    from bapsql.logs.reader import part_files
    from bapsql.logs.samples import TABLE_NAME, run_trajectory_table

    if isinstance(monitor, NullMonitor) or not part_files(run_dir, "episodes") or not part_files(run_dir, "turns"):
        return
    rows = run_trajectory_table(run_dir)
    if rows:
        monitor.log_table(TABLE_NAME, rows)


def merge_results(a: RolloutResult, b: RolloutResult) -> RolloutResult:
    """Two consecutive `Driver.run` results of one sweep (disjoint methods) as one."""
    restarts = dict(a.restarts)
    for k, v in b.restarts.items():
        restarts[k] = max(restarts.get(k, 0), v)
    return RolloutResult(a.episodes_run + b.episodes_run, a.episodes_skipped + b.episodes_skipped,
                         a.reruns + b.reruns, restarts, a.generated_tokens + b.generated_tokens,
                         a.engine_calls + b.engine_calls, a.wall_s + b.wall_s, a.cells + b.cells,
                         a.trajectories + b.trajectories)


def write_placebo_pools(run_dir: Path, placebo: dict[str, str], *, seed: int = 0) -> dict[str, int]:
    """For each placebo method (→ its source method), the `PlaceboPool` of the source's logged estimate payloads,
    written to ``run_dir/placebo/<method>.json`` where the env workers load it. Returns payloads per method."""
    from bapsql.env.placebo import PlaceboPool, payloads_from_turns, pool_to_json
    from bapsql.errors import ConfigError
    from bapsql.logs.reader import read_episodes, read_turns
    from bapsql.rollout.groups import sample_seed

    eps, turns = read_episodes(run_dir), read_turns(run_dir)
    out_dir = run_dir / "placebo"
    out_dir.mkdir(parents=True, exist_ok=True)
    counts = {}
    for method, source in placebo.items():
        src_eps = eps[eps.method == source]
        if src_eps.empty:
            raise ConfigError(f"{method}: no logged episodes of {source} to record its placebo payloads from")
        src_turns = turns[turns.method == source].sort_values(["episode_id", "turn"])
        by_episode = dict(iter(src_turns.groupby("episode_id", sort=False)))
        recorded = []
        for r in src_eps.itertuples():
            if r.episode_id in by_episode:
                recorded += payloads_from_turns(r.budget, r.task_id, sample_seed(r.seed, r.task_id, r.budget, r.sample),
                                                by_episode[r.episode_id].itertuples())
        pool = PlaceboPool(recorded, seed=seed)
        atomic_write_text(out_dir / f"{method}.json", json.dumps(pool_to_json(pool)))
        counts[method] = len(recorded)
    return counts


def placebo_run_stats(run_dir: Path, placebo: dict[str, str]) -> dict[str, dict]:
    """For each placebo method (→ its source method) that ran: `bapsql.env.placebo.placebo_stats` of its logged
    estimate requests against the pool it permuted (``run_dir/placebo/<method>.json``), with the source named.
    Computed from the logs, so it covers every env worker (each holds its own copy of the pool) and resumed runs."""
    from bapsql.env.placebo import placebo_stats, pool_from_json, request_keys
    from bapsql.logs.reader import read_episodes, read_turns
    from bapsql.rollout.groups import sample_seed

    eps, turns = read_episodes(run_dir), read_turns(run_dir)
    out = {}
    for method, source in placebo.items():
        path = run_dir / "placebo" / f"{method}.json"
        if not path.is_file():
            continue
        pool = pool_from_json(json.loads(path.read_text()))
        mine = turns[turns.method == method].sort_values(["episode_id", "turn"])
        by_episode = dict(iter(mine.groupby("episode_id", sort=False)))
        requests = []
        for r in eps[eps.method == method].itertuples():
            if r.episode_id in by_episode:
                requests += request_keys(r.budget, r.task_id, sample_seed(r.seed, r.task_id, r.budget, r.sample),
                                         by_episode[r.episode_id].itertuples())
        out[method] = {"source": source, "seed": pool.seed, **placebo_stats(pool.recorded, requests)}
    return out


def _flush_writer(be: Any) -> None:
    """Make everything the writer actor holds durable (blocking)."""
    if hasattr(be, "call"):
        be.call(("writer", 0), "flush")
    else:
        be.actors[("writer", 0)].flush()


def _close_writer(be: Any) -> None:
    """Flush and close the writer actor (blocking)."""
    if hasattr(be, "call"):
        be.call(("writer", 0), "close")
    else:
        be.actors[("writer", 0)].close()


def _write_record(path: Path, cfg: ExperimentConfig, s: SweepSummary) -> None:
    from bapsql.rollout.runner import calibration_record

    r = s.result
    record = {"config": cfg.to_dict(), **calibration_record(cfg.calibration), "methods": list(cfg.methods),
              "run_dir": str(s.run_dir), "tasks": s.tasks, "episodes_total": s.episodes_total,
              "episodes_run": r.episodes_run, "episodes_skipped": r.episodes_skipped, "reruns": r.reruns,
              "restarts": r.restarts, "actor_restarts": s.actor_restarts, "generated_tokens": r.generated_tokens,
              "wall_s": round(r.wall_s, 3),
              "setup_s": s.setup_s, "backend": s.backend, "env_workers": s.env_workers, "engines": s.engines,
              "cells": [dataclasses.asdict(c) | {"success_rate": c.success_rate} for c in r.cells],
              "placebo": s.placebo}
    atomic_write_text(path, json.dumps(record, indent=2, default=str) + "\n")


def summary_table(s: SweepSummary) -> Any:
    """The per-run summary (a rich `Table`): one row per method × budget, then the run's totals in the caption."""
    from rich.table import Table

    r = s.result
    t = Table(title=f"sweep {s.run}: {r.episodes_run} episodes run, {r.episodes_skipped} already logged "
                    f"({s.tasks} tasks of {s.split})")
    for col in ("method", "budget", "episodes", "success %", "total tokens", "queries", "result tok", "VM steps",
                "invalid", "breaches"):
        t.add_column(col, justify="left" if col in ("method", "budget") else "right")
    for c in r.cells:
        t.add_row(c.method, c.budget, str(c.episodes), f"{100 * c.success_rate:.1f}", f"{c.mean_total_tokens:.0f}",
                  f"{c.mean_queries:.2f}", f"{c.mean_result_tokens:.0f}", f"{c.mean_vm_steps:.0f}",
                  str(c.invalid_actions), str(c.breaches))
    t.caption = (f"{r.wall_s:.1f} s rollout + {s.setup_s:.1f} s setup · {r.episodes_per_s:.1f} episodes/s · "
                 f"{r.generated_tokens} generated tokens · reruns {r.reruns} · restarts {s.actor_restarts or 0} · "
                 f"{s.env_workers} env workers ({s.backend}) · logs in {s.run_dir}")
    return t
