"""The in-process evaluation runner: one policy × budgets × seeds over a benchmark split, logged as Parquet.

Contract of `evaluate(benchmark_dir, split, policy_name, budgets, seeds, out_dir, *, run_name=None, limit=None)`:

- runs every (budget, seed, task) episode in this process with ONE environment whose database handles stay warm
  (tasks are visited database by database), the env under the method's condition (``P@C``; ``full`` when none);
  a placebo condition (``estimates: permuted``) first plays the cell once with true estimates, unlogged, to record
  the payloads it permutes (`bapsql.env.placebo`);
- records the run (methods, benchmark, the calibration file and its hash) in ``out_dir/sweep.json``;
- the policy gets `oracle.policy_view(task)` (no gold) and, if scripted, the `OracleHint`;
- writes every episode and its turns through `bapsql.logs.writer.TrajectoryWriter` into
  ``out_dir/episodes/method=M/budget=B/part-*.parquet`` and ``out_dir/turns/...``; episode ids are deterministic
  (`episode_id(run, method, budget, seed, task_id)`), so a rerun into the same ``out_dir`` skips episodes already
  written; ``log_text`` (a `bapsql.logs.text.TextLogConfig`; default: all) is which episodes' turns keep their
  completion / observation text;
- returns a `RunSummary` (per-budget success, tokens, queries, invalid actions, breaches; wall time and the time
  spent logging). With a ``console`` it shows a rich progress bar and prints the per-budget table at the end.

``benchmark_dir = "demo"`` means the embedded benchmark at small scale in the cache dir, built there on first use
(announced on stderr; `bapsql.data.tasks.resolve_benchmark`); the split's tasks come from
`bapsql.data.tasks.load_tasks`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from bapsql.budgets import Budget, load_ladder
from bapsql.policies.base import Policy, PolicyOptions
from bapsql.policies.oracle import oracle_hint, policy_view
from bapsql.types import Task

FLUSH_EVERY = 20_000  # log rows buffered before a flush: few, large Parquet files (each file costs a write + fsync)
LOG_BATCH = 256  # finished episodes kept as records before their rows are built and validated, all in one go


def play_episode(env: Any, policy: Policy, task: Task, budget: Budget, seed: int, *,
                 on_turn: Callable[[list[dict], str, dict], None] | None = None) -> Any:
    """Play one episode of ``policy`` in ``env``; returns the env's `EpisodeSummary`.

    ``on_turn(messages, completion, info)`` is called before each step with the live messages the policy saw,
    its completion, and the info it decided from (the SFT exporter records turn pairs this way)."""
    observation, info = env.reset(task, budget, seed=seed)
    oracle = oracle_hint(task) if policy.needs_oracle else None
    policy.reset(policy_view(task), budget, seed, PolicyOptions(env.options.condition, oracle))
    while not env.done:
        completion = policy.act(observation, info)
        if on_turn is not None:
            on_turn(env.messages, completion, info)
        step = env.step(completion)
        observation, info = step.observation, step.info
    return env.summary()


@dataclass(frozen=True)
class BudgetStats:
    """Aggregates of one budget level over the episodes this invocation ran."""

    budget: str
    episodes: int
    successes: int
    mean_total_tokens: float
    mean_queries: float
    mean_turns: float
    invalid_actions: int
    breaches: int

    @property
    def success_rate(self) -> float:
        return self.successes / self.episodes if self.episodes else 0.0


@dataclass(frozen=True)
class RunSummary:
    """What one `evaluate` call did."""

    run: str
    run_dir: Path
    method: str
    split: str
    budgets: tuple[str, ...]
    seeds: tuple[int, ...]
    tasks: int
    episodes_run: int
    episodes_skipped: int
    per_budget: tuple[BudgetStats, ...]
    wall_s: float
    log_s: float  # time spent in the trajectory writer (buffering, validation, Parquet writes)
    play_s: float = 0.0  # time spent playing episodes (policy + env)
    files: tuple[Path, ...] = field(default_factory=tuple)
    placebo_unmatched: int | None = None  # placebo requests the recording pass did not make (None: no placebo)

    @property
    def invalid_actions(self) -> int:
        return sum(b.invalid_actions for b in self.per_budget)

    @property
    def breaches(self) -> int:
        return sum(b.breaches for b in self.per_budget)

    @property
    def log_share(self) -> float:
        """Logging time as a share of the run's wall time."""
        return self.log_s / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def episodes_per_s(self) -> float:
        """Episodes per second of playing time (setup and logging excluded)."""
        return self.episodes_run / self.play_s if self.play_s > 0 else 0.0


def summary_table(summary: RunSummary) -> Any:
    """The per-budget table (a rich `Table`) — the one place a run summary is rendered as text."""
    from rich.table import Table

    t = Table(title=f"{summary.method} on {summary.split} ({summary.episodes_run} episodes run, "
                    f"{summary.episodes_skipped} already logged)")
    for col in ("budget", "episodes", "success %", "total tokens", "queries", "turns", "invalid", "breaches"):
        t.add_column(col, justify="left" if col == "budget" else "right")
    for b in summary.per_budget:
        t.add_row(b.budget, str(b.episodes), f"{100 * b.success_rate:.1f}", f"{b.mean_total_tokens:.0f}",
                  f"{b.mean_queries:.2f}", f"{b.mean_turns:.2f}", str(b.invalid_actions), str(b.breaches))
    return t


def _stats(level: str, rows: list[dict]) -> BudgetStats:
    n = len(rows)
    mean = (lambda k: sum(r[k] for r in rows) / n if n else 0.0)
    return BudgetStats(level, n, sum(bool(r["success"]) for r in rows), mean("total_tokens"), mean("queries"),
                       mean("turns"), sum(r["invalid_actions"] for r in rows), sum(bool(r["breach"]) for r in rows))


def calibration_record(path: str | Path | None) -> dict:
    """Which calibration file a run's episodes used: its path (None: the packaged default) and its SHA-256."""
    from bapsql.data.benchmark import sha256_file
    from bapsql.db.calibration import DEFAULT_PATH

    p = Path(path) if path is not None else DEFAULT_PATH
    return {"calibration": str(path) if path is not None else None, "calibration_file": str(p),
            "calibration_sha256": sha256_file(p)}


def record_placebo(env: Any, policy: Policy, tasks: Sequence[Task], levels: Sequence[Budget],
                   seeds: Sequence[int]) -> Any:
    """The placebo's recording pass (`bapsql.env.placebo`): play the cell with TRUE estimates shown (nothing is
    logged) and return the `PlaceboPool` of the payloads it requested; ``env`` is restored afterwards."""
    import dataclasses

    from bapsql.env.placebo import PlaceboPool, payloads_from_turns

    options = env.options
    env.options = dataclasses.replace(options, condition=dataclasses.replace(options.condition, estimates="true"))
    recorded = []
    try:
        for budget in levels:
            for seed in seeds:
                for task in tasks:
                    play_episode(env, policy, task, budget, seed)
                    recorded += payloads_from_turns(budget.level, task.task_id, seed, env.turn_records)
    finally:
        env.options = options
    return PlaceboPool(recorded, seed=min(seeds) if seeds else 0)


def evaluate(benchmark_dir: str | Path, split: str, policy_name: str, budgets: Sequence[str | Budget],
             seeds: Iterable[int], out_dir: str | Path, *, run_name: str | None = None, limit: int | None = None,
             condition: str | None = None, console: Any = None, env_options: Any = None,
             token_counter: Any = None, calibration: str | Path | None = None,
             posthoc_engine: str | Path | None = None, log_text: Any = None) -> RunSummary:
    """Run ``policy_name`` (``P`` or ``P@C``) under its condition on ``split`` × ``budgets`` × ``seeds`` and log it
    (see the module docstring). ``condition`` overrides the one in the name; ``calibration`` is a calibration JSON
    (None: the packaged default), recorded with its hash in ``out_dir/sweep.json``; ``posthoc_engine`` an engine
    YAML whose model decides the ``adaptive`` post-hoc control (`bapsql.rollout.posthoc_engine`; None: the rule)."""
    from bapsql.data.tasks import load_tasks, resolve_benchmark
    from bapsql.db.calibration import load_calibration
    from bapsql.env.conditions import method_name, split_method
    from bapsql.env.episode import BudgetedSQLEnv
    from bapsql.env.handles import DatabaseHandles
    from bapsql.env.records import EnvOptions
    from bapsql.logs.writer import TrajectoryWriter, episode_id, existing_episode_ids
    from bapsql.rollout.groups import EpisodeSpec, episode_rows, group_id
    from bapsql.rollout.sweep_record import update_sweep_record
    from bapsql.policies.registry import canonical_name, make_policy
    from bapsql.tokens import load_token_counter

    t_start = time.perf_counter()
    announce = (lambda msg: console.print(f"[yellow]{msg}[/yellow]")) if console is not None else None
    root = resolve_benchmark(benchmark_dir, announce=announce)
    base, cond = split_method(canonical_name(policy_name))
    method = method_name(base, condition or cond)
    policy = make_policy(base)
    ladder = load_ladder()
    levels = tuple(b if isinstance(b, Budget) else ladder[b] for b in budgets)
    seeds = tuple(int(s) for s in seeds)
    tasks = load_tasks(root, split, limit=limit)
    out = Path(out_dir)
    run = run_name or out.resolve().name
    counter = token_counter if token_counter is not None else load_token_counter("default")
    options = (env_options if env_options is not None else EnvOptions()).under(split_method(method)[1])
    cal = load_calibration(calibration) if calibration is not None else None
    update_sweep_record(out, {"run": run, "benchmark": str(root), "split": split, "methods": [method],
                              **calibration_record(calibration)})
    done = existing_episode_ids(out)
    rows: dict[str, list[dict]] = {b.level: [] for b in levels}
    skipped, log_s, play_s = 0, 0.0, 0.0
    total = len(levels) * len(seeds) * len(tasks)

    from bapsql.progress import Progress

    progress = Progress(console, method, total).start()
    writer = TrajectoryWriter(out, run, flush_every=FLUSH_EVERY, **({} if log_text is None else {"text": log_text}))
    played: list[tuple] = []  # (episode id, level, seed, task, summary, turn records) not yet handed to the writer

    def log_played() -> None:  # in batches: the logging work runs hot, not interleaved with every episode
        for eid, level, seed, task, summary, records in played:
            spec = EpisodeSpec(eid, run, method, level, seed, 0, seed, task, group_id(task.task_id, level, seed))
            ep, turns = episode_rows(spec, summary, records)
            writer.add_episode(ep, turns)
            rows[level].append(ep)
        played.clear()

    controller = engine = None
    if posthoc_engine is not None:
        from bapsql.rollout.engines.base import load_engine_config
        from bapsql.rollout.posthoc_engine import EngineController

        controller = EngineController.from_config(load_engine_config(posthoc_engine))  # its chat-template options too
        engine = controller.engine
    try:
        with DatabaseHandles(counter, calibration=cal) as handles:
            env = BudgetedSQLEnv(token_counter=counter, handles=handles, options=options, controller=controller)
            if options.condition.estimates == "permuted":
                progress.update(description=f"{method} (placebo: recording the true estimates)")
                env.placebo = record_placebo(env, policy, tasks, levels, seeds)
                progress.update(description=method)
            for budget in levels:
                for seed in seeds:
                    for task in tasks:
                        eid = episode_id(run, method, budget.level, seed, task.task_id)
                        if eid in done:
                            skipped += 1
                        else:
                            t0 = time.perf_counter()
                            summary = play_episode(env, policy, task, budget, seed)
                            t1 = time.perf_counter()
                            play_s += t1 - t0
                            played.append((eid, budget.level, seed, task, summary, env.turn_records))
                            if len(played) >= LOG_BATCH:
                                log_played()
                            log_s += time.perf_counter() - t1
                        progress.advance()
    finally:
        t0 = time.perf_counter()
        try:
            log_played()  # an interrupted run still logs every episode it finished
        finally:
            writer.close()
        log_s += time.perf_counter() - t0
        progress.stop()
        if engine is not None:
            engine.close()
    if env.placebo is not None:  # how far the shown payloads were from an exact permutation (bapsql.env.placebo)
        update_sweep_record(out, {**calibration_record(calibration), "placebo": {method: {
            "source": "recording pass (true estimates, unlogged)", "seed": env.placebo.seed, **env.placebo.stats()}}})
    result = RunSummary(
        run=run, run_dir=out, method=method, split=split, budgets=tuple(b.level for b in levels), seeds=seeds,
        tasks=len(tasks), episodes_run=sum(len(v) for v in rows.values()), episodes_skipped=skipped,
        per_budget=tuple(_stats(b.level, rows[b.level]) for b in levels),
        wall_s=time.perf_counter() - t_start, log_s=log_s, play_s=play_s, files=tuple(writer.files),
        placebo_unmatched=env.placebo.unmatched if env.placebo is not None else None)
    if console is not None:
        console.print(summary_table(result))
    return result
