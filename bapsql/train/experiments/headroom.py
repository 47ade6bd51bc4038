"""GRPO's headroom: what sampling at the rollout temperature solves on held-out questions that greedy decoding does
not, measured before (or after) an RL run.

GRPO learns only from groups with mixed outcomes, and the evaluation decodes greedily. On a task that greedy
decoding fails, GRPO can turn it into a success by sharpening only where some samples already succeed; a task that
no sample solves needs the policy to learn something it does not yet do at all. `measure_headroom` plays the
validation questions of ``grpo.validate_every`` (`bapsql.train.loop.grpo_data.validation_tasks`: fresh questions of
the training databases, none a train, test or GRPO-prompt question) once by the evaluation's decoding and
``filter.group_size`` times at ``grpo.temperature``, with the SFT model (or a GRPO adapter on it), per level:

- ``greedy`` / ``sampled``: success of the greedy episode and mean success of the samples;
- ``pass_at``: unbiased pass@k (`pass_at_k`) for k = 1, 2, 4, ... up to the group size;
- ``sharpenable``: tasks greedy decoding fails and at least one sample solves. ``greedy + sharpenable / tasks`` is
  the greedy success GRPO reaches by sharpening alone (``ceiling``);
- ``at_risk``: tasks greedy decoding solves but at most half of the samples do (what sharpening the wrong way loses);
- ``in_band``: tasks whose group the filter keeps (``filter.min_success``..``filter.max_success`` successes);
- ``histogram``: tasks by successes out of the group (0..group size); ``failures``: the greedy episodes' failure
  kinds (`bapsql.logs.schema.FAILURE_KINDS`);
- ``failed_sql``: the greedy failures by how their last executed SQL differs from the gold query
  (`sql_difference`): ``same`` (the answer was wrong, not the query), ``literal`` (only a string or number differs:
  a value miscopied from the question), ``structure`` or ``no_query``.

`python -m jobs.headroom --config ... [--adapter DIR]` writes ``<run dir>/headroom[-<name>].json`` (`result_name`)
and prints the table. `pass_at_k`, `sql_difference`, `level_headroom` and `result_name` are pure.
"""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np


def pass_at_k(n: np.ndarray, c: np.ndarray, k: int) -> np.ndarray:
    """Unbiased pass@k per task (Chen et al. 2021): ``1 - C(n - c, k) / C(n, k)``, the chance that ``k`` of a task's
    ``n`` samples drawn without replacement hold at least one of its ``c`` successes.

    ``n``, ``c``: ``[T]`` integers with ``0 <= c <= n`` and ``k <= n``; returns ``[T]`` float64. Computed as
    ``1 - prod_{i = n - c + 1}^{n} (1 - k / i)`` (no large binomials)."""
    n = np.asarray(n, dtype=np.int64)
    c = np.asarray(c, dtype=np.int64)
    if n.shape != c.shape or np.any(c < 0) or np.any(c > n) or k < 1 or np.any(n < k):
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got k={k}")
    out = np.ones(n.shape, dtype=np.float64)
    for i in np.ndindex(n.shape):
        if n[i] - c[i] >= k:
            out[i] = 1.0 - float(np.prod(1.0 - k / np.arange(n[i] - c[i] + 1, n[i] + 1, dtype=np.float64)))
    return out


SQL_DIFFERENCES: tuple[str, ...] = ("same", "literal", "structure", "no_query")


def sql_difference(sql: str | None, gold_sql: str) -> str:
    """How ``sql`` differs from ``gold_sql`` (one of `SQL_DIFFERENCES`): ``no_query`` for ``None``; ``same`` when
    both parse to the same SQLite query; ``literal`` when they do once every string and number literal is blanked
    out; else ``structure`` (also for SQL that does not parse and is not textually the gold)."""
    import sqlglot
    from sqlglot import exp

    if sql is None:
        return "no_query"

    def canon(q: str, blank: bool) -> str | None:
        try:
            tree = sqlglot.parse_one(q, read="sqlite")
        except sqlglot.errors.SqlglotError:  # ParseError, and TokenError for text it cannot even tokenize
            return None
        if blank:
            tree = tree.transform(lambda n: exp.Literal.string("?") if isinstance(n, exp.Literal) else n)
        return tree.sql(dialect="sqlite")

    plain = canon(gold_sql, False)
    if sql.strip() == gold_sql.strip() or (plain is not None and canon(sql, False) == plain):
        return "same"
    blanked = canon(sql, True)
    return "literal" if blanked is not None and blanked == canon(gold_sql, True) else "structure"


@dataclass(frozen=True)
class LevelHeadroom:
    """One budget level's headroom (see the module docstring); rates in [0, 1], counts of tasks."""

    level: str
    tasks: int
    group_size: int
    greedy: float
    sampled: float
    pass_at: dict[int, float]
    sharpenable: int
    at_risk: int
    in_band: int
    histogram: tuple[int, ...]
    failures: dict[str, int]
    failed_sql: dict[str, int]

    @property
    def ceiling(self) -> float:
        """The greedy success reached by turning every sharpenable task (and losing none)."""
        return self.greedy + self.sharpenable / self.tasks


def level_headroom(level: str, greedy: Sequence[bool], samples: np.ndarray, failures: Sequence[str],
                   band: tuple[int, int], sql_differences: Sequence[str] = ()) -> LevelHeadroom:
    """The headroom of one level from ``greedy`` ``[T]`` (the greedy episode's success per task), ``samples``
    ``[T, G]`` bool (the sampled group's successes) and ``failures`` ``[T]`` (the greedy episode's failure kind, ``""``
    for a success); ``band``: the filter's (min, max) successes per kept group; ``sql_differences`` ``[T]`` (or
    empty): the greedy episode's `sql_difference`, counted over its failures."""
    g = np.asarray(greedy, dtype=bool)
    s = np.asarray(samples, dtype=bool)
    if s.ndim != 2 or s.shape[0] != g.shape[0] or len(failures) != g.shape[0] or g.shape[0] == 0 or s.shape[1] == 0 \
            or len(sql_differences) not in (0, g.shape[0]):
        raise ValueError(f"level_headroom: greedy [T], samples [T, G], failures [T] and sql_differences [T] or [] must "
                         f"agree with T >= 1 and G >= 1, got {g.shape}, {s.shape}, {len(failures)}, "
                         f"{len(sql_differences)}")
    t, size = s.shape
    c = s.sum(axis=1)
    ks = [k for k in (2 ** i for i in range(size.bit_length())) if k <= size]
    n = np.full(t, size)
    return LevelHeadroom(
        level=level, tasks=t, group_size=size, greedy=float(g.mean()), sampled=float(s.mean()),
        pass_at={k: float(pass_at_k(n, c, k).mean()) for k in ks},
        sharpenable=int(np.sum(~g & (c > 0))), at_risk=int(np.sum(g & (2 * c <= size))),
        in_band=int(np.sum((c >= band[0]) & (c <= band[1]))),
        histogram=tuple(int(x) for x in np.bincount(c, minlength=size + 1)),
        failures=dict(Counter(f or "success" for f in failures).most_common()),
        failed_sql=_in_order(Counter(x for ok, x in zip(g, sql_differences) if not ok), SQL_DIFFERENCES))


def _in_order(counts: Counter, keys: Sequence[str]) -> dict[str, int]:
    """``counts`` as a dict in the order of ``keys``, without the zero ones."""
    return {k: counts[k] for k in keys if counts[k]}


def render_headroom(rows: Sequence[LevelHeadroom]) -> str:
    """A plain-text table of the levels' headroom."""
    if not rows:
        return "no levels measured"
    kmax = max(rows[0].pass_at)
    head = (f"{'level':<6} {'tasks':>5} {'greedy':>7} {'sampled':>8} {f'pass@{kmax}':>8} {'sharpenable':>11} "
            f"{'ceiling':>8} {'at risk':>7} {'in band':>7}  successes per task (0..{rows[0].group_size})")
    lines = [head]
    for r in rows:
        lines.append(f"{r.level:<6} {r.tasks:>5} {r.greedy:>7.3f} {r.sampled:>8.3f} {r.pass_at[kmax]:>8.3f} "
                     f"{r.sharpenable:>11} {r.ceiling:>8.3f} {r.at_risk:>7} {r.in_band:>7}  {list(r.histogram)}")
    for r in rows:
        lines.append(f"{r.level} greedy outcomes: " + ", ".join(f"{k} {v}" for k, v in r.failures.items()))
        if r.failed_sql:
            failed = ", ".join(f"{k} {v}" for k, v in r.failed_sql.items())
            lines.append(f"{r.level} greedy failures' SQL vs gold: {failed}")
    return "\n".join(lines)


def result_name(adapter: str | Path | None) -> str:
    """The name of a measurement's JSON file and rollout folder: ``headroom`` for the SFT model, else
    ``headroom-<parent>-<folder>-<digest>``, the digest (8 hex) of the adapter's absolute path, so two adapters whose
    last two folders share names (``<run A>/grpo/adapter``, ``<run B>/grpo/adapter``) never share a file."""
    if adapter is None:
        return "headroom"
    import hashlib

    path = Path(adapter).absolute()
    return f"headroom-{path.parent.name}-{path.name}-{hashlib.sha1(str(path).encode()).hexdigest()[:8]}"


def measure_headroom(cfg: Any, seed: int, *, adapter: str | Path | None = None, levels: Sequence[str] | None = None,
                     console: Any = None) -> tuple[list[LevelHeadroom], Path]:
    """Play the validation questions greedy and sampled (module docstring) with seed ``seed``'s SFT model, or with
    the LoRA ``adapter`` folder on it (e.g. ``<run>/grpo/adapter``); ``levels`` default to ``budgets.levels``.
    Returns the rows and the JSON file written under the run dir."""
    from bapsql.data.tasks import resolve_benchmark
    from bapsql.errors import ConfigError
    from bapsql.train.algo.sampler import Prompt
    from bapsql.train.loop.grpo_data import grpo_tasks, validation_tasks
    from bapsql.train.loop.grpo_setup import build_rollouts
    from bapsql.train.recipe.pipeline import policy_base, ray_context

    lv = tuple(levels or cfg.budgets.levels)
    unknown = sorted(set(lv) - set(cfg.budgets.levels))
    if unknown:
        raise ConfigError(f"headroom levels {unknown} are not among budgets.levels {list(cfg.budgets.levels)}")
    root = resolve_benchmark(cfg.data.benchmark)
    base = policy_base(cfg, seed, console)
    tasks = validation_tasks(cfg, seed, root, exclude=grpo_tasks(cfg, seed, root))
    name = result_name(adapter)
    run_dir = cfg.run_dir(seed)
    with ray_context(cfg, run_dir) if cfg.rollout.use_ray else contextlib.nullcontext():
        rollouts = build_rollouts(cfg, base=base, tasks=tasks, run_dir=run_dir / name, run_name=f"{cfg.name}-{name}",
                                  validation=tasks)
        try:
            if adapter is not None:
                if not (Path(adapter) / "adapter_config.json").is_file():
                    raise ConfigError(f"--adapter {adapter}: no adapter_config.json there (a LoRA adapter folder "
                                      "such as <run>/grpo/adapter or <run>/grpo/validated/update-00010)")
                rollouts.load_adapter(str(adapter), "headroom", 1)
            gold = {t.task_id: t.gold_sql for t in tasks}
            rows = []
            for level in lv:
                prompts = [Prompt(t.task_id, level, 0) for t in tasks]
                _say(console, f"headroom at {level}: {len(tasks)} questions, greedy and {cfg.filter.group_size} "
                              f"samples at T = {cfg.grpo.temperature}")
                with _episode_bar(console, rollouts.driver, f"headroom {level}",
                                  len(prompts) * (1 + cfg.filter.group_size)) as next_run:
                    greedy = rollouts.validate(prompts, 0)
                    next_run()
                    groups = rollouts.play(prompts, 0)
                rows.append(level_headroom(
                    level, [e.success for e in greedy], np.array([[x.success for x in g] for g in groups]),
                    [e.episode["failure"] for e in greedy], (cfg.filter.min_success, cfg.filter.max_success),
                    [sql_difference(_last_sql(e), gold[e.episode["task_id"]]) for e in greedy]))
        finally:
            rollouts.close()
    out = run_dir / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"seed": seed, "adapter": None if adapter is None else str(adapter),
                               "temperature": cfg.grpo.temperature,
                               "levels": [{**asdict(r), "ceiling": r.ceiling} for r in rows]}, indent=1))
    return rows, out


@contextlib.contextmanager
def _episode_bar(console: Any, driver: Any, label: str, total: int):
    """A progress bar of finished episodes over several driver runs (none without a console); yields the call that
    makes the next run count on from where the last one stopped."""
    from bapsql.progress import Progress

    base, last = [0], [0]

    def tick(done: int, _run_total: int) -> None:
        last[0] = done
        bar.update(base[0] + done)

    def next_run() -> None:
        base[0] += last[0]
        last[0] = 0

    with Progress(console, label, total) as bar:
        driver.progress = tick
        try:
            yield next_run
        finally:
            driver.progress = None
            bar.update(base[0] + last[0])


def _last_sql(trajectory: Any) -> str | None:
    """The SQL of an episode's last executed query (``None`` when it executed none)."""
    sqls = [t["sql"] for t in trajectory.turns if t["action"] == "execute_query" and t["sql"]]
    return sqls[-1] if sqls else None


def _say(console: Any, msg: str) -> None:
    if console is not None:
        console.print(f"[cyan]{msg}[/cyan]")
