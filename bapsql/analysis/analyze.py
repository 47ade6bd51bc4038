"""The offline analysis job: run directories → `Summary` → report.md, report.html, PNG figures, summary.json.

`analyze_runs` scans the logs out of core into per-cluster aggregates (`bapsql.analysis.scan`), summarizes them and
writes the files (`write_report`); `summarize_source` assembles a `Summary` from any `bapsql.analysis.source.LogSource`
(the scan's aggregates, or `EpisodeSource`, the per-episode reference); `summarize` does it for loaded frames.
`summary.json`'s contract: ``methods[<method>]["success"][<level>]`` (percent) and
``methods[<method>]["frontier_score"]`` (pp or null), next to every other computed quantity (comparisons, primary
gates, transitions, diagnostics, notes).

Pairs: every unordered pair of methods is compared at every level; a pair that includes the reference is oriented
``other − reference``, any other pair ``first − second`` in alphabetical order. The reference is the method named by
the caller (``bapsql analyze --reference METHOD``, an experiment config's ``reference:``, a training recipe's
``eval.reference``); nothing is guessed from names or order. Without one, the reference-based sections (primary
gates, Table 4 deltas, transitions) are left out and the notes say so.

Methods are ``POLICY@CONDITION`` labels when the logs know the condition (`bapsql.analysis.load.apply_conditions`);
``Summary.conditions`` maps each method to its condition (None when unknown) for the report's Policy / Condition
columns. With fewer than `MIN_CLUSTER_DATABASES` databases the notes say that database-cluster intervals and sign
tests are not meaningful (they are still computed, as descriptive numbers).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import itertools
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from bapsql.analysis.comparisons import PairedComparison, PrimaryGate, primary_gate
from bapsql.analysis.diagnostics import Coverage, FailureCounts, WarningFlow
from bapsql.analysis.load import RunLogs, split_method
from bapsql.analysis.metrics import LADDER, CellMetrics, frontier_scores
from bapsql.analysis.source import LogSource
from bapsql.analysis.transitions import TransitionAnalysis
from bapsql.errors import RunLogError

SUMMARY_FORMAT = "bapsql.analysis.summary/1"
MIN_CLUSTER_DATABASES = 5  # below this, cluster-bootstrap intervals and sign tests over databases mean little
Progress = Callable[[str], None]


@dataclass(frozen=True)
class Summary:
    """Everything the analysis computed. Percentages in percent, Frontier Scores in pp, None/NaN = not defined."""

    runs: tuple[str, ...]
    episodes: int
    methods: tuple[str, ...]
    levels: tuple[str, ...]
    reference: str | None
    databases: int
    conditions: Mapping[str, str | None]  # method → its condition (None when the logs do not say)
    replicates: int
    seed: int
    cells: tuple[CellMetrics, ...]
    per_database: tuple[CellMetrics, ...]
    per_seed: tuple[CellMetrics, ...]
    success_ci: Mapping[tuple[str, str], tuple[float, float]]
    frontier: Mapping[str, float | None]
    frontier_per_seed: Mapping[str, Mapping[str, float | None]]
    frontier_per_database: Mapping[str, Mapping[str, float | None]]
    comparisons: tuple[PairedComparison, ...]
    gates: tuple[PrimaryGate, ...]
    transitions: tuple[TransitionAnalysis, ...]
    coverage: tuple[Coverage, ...]
    warning_flow: tuple[WarningFlow, ...]
    failures: tuple[FailureCounts, ...]
    notes: tuple[str, ...]
    placebo: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)  # method -> sweep.json record
    empty_gold: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # tasks whose gold answer is empty

    @property
    def has_conditions(self) -> bool:
        """Whether any method runs under a known condition (the report then shows Policy and Condition)."""
        return any(c is not None for c in self.conditions.values())

    @property
    def few_databases(self) -> bool:
        return self.databases < MIN_CLUSTER_DATABASES

    def cell(self, method: str, budget: str) -> CellMetrics | None:
        """The pooled cell of ``method`` at ``budget``, or None when the runs have none."""
        return next((c for c in self.cells if c.method == method and c.budget == budget), None)

    def comparison(self, method: str, reference: str, budget: str) -> PairedComparison | None:
        return next(
            (c for c in self.comparisons if (c.method, c.reference, c.budget) == (method, reference, budget)), None
        )


def comparison_pairs(methods: Sequence[str], reference: str | None) -> list[tuple[str, str]]:
    """Every unordered pair once, as ``(method, reference)`` orientation (see the module docstring)."""
    pairs = []
    for a, b in itertools.combinations(sorted(methods), 2):
        pairs.append((b, a) if a == reference else (a, b))
    return pairs


def _quiet(_: str) -> None:
    return None


def summarize(
    logs: RunLogs, *, reference: str | None = None, replicates: int = 10_000, seed: int = 0,
    progress: Progress = _quiet,
) -> Summary:
    """Compute every table of the report from loaded logs (folded into aggregates first, as the scan does).
    ``reference``: the method the others are compared against (None: no reference sections). Raises
    `RunLogError` for a ``reference`` the runs do not hold."""
    from bapsql.analysis.scan import aggregate_logs

    return summarize_source(aggregate_logs(logs), reference=reference, replicates=replicates, seed=seed,
                            progress=progress)


def summarize_source(
    source: LogSource, *, reference: str | None = None, replicates: int = 10_000, seed: int = 0,
    progress: Progress = _quiet,
) -> Summary:
    """`summarize` over any `LogSource`: aggregates from the scan (`bapsql.analysis.scan`) or the per-episode
    reference (`bapsql.analysis.source.EpisodeSource`)."""
    if replicates < 1:
        raise RunLogError(f"replicates must be at least 1, got {replicates}")
    methods, levels = source.methods, source.levels
    if reference is not None and reference not in methods:
        raise RunLogError(f"reference method {reference!r} is not in the runs; methods are {list(methods)}")
    ref = reference if len(methods) > 1 else None
    notes = list(source.notes)
    n_db = source.databases
    if n_db < MIN_CLUSTER_DATABASES:
        notes.append(f"only {n_db} database(s): database-cluster intervals and sign tests are not meaningful with "
                     f"fewer than {MIN_CLUSTER_DATABASES} databases; read them as descriptive")
    if ref is None and len(methods) > 1:
        notes.append("no reference method named (bapsql analyze --reference METHOD, or reference: in the "
                     "experiment config): primary gates, Table 4 deltas and transitions are left out")
    conditions = {m: split_method(m)[1] for m in methods}  # load.apply_conditions makes the label carry it
    progress(f"metrics: {source.episodes:,} episodes, {len(methods)} methods × {len(levels)} budgets")
    cells = source.cells()
    per_db = source.cells(by="db_id")
    per_seed = source.cells(by="seed")
    frontier = {m: f for (m, _), f in frontier_scores(cells).items()}
    for m in methods:
        have = {c.budget for c in cells if c.method == m}
        missing = [lv for lv in LADDER if lv not in have]
        if missing:
            notes.append(f"{m}: no episodes at {'/'.join(missing)}, so no Frontier Score (it needs XS, S, M and L)")
    fs_seed: dict[str, dict[str, float | None]] = {}
    for (m, g), f in frontier_scores(per_seed).items():
        fs_seed.setdefault(m, {})[str(g)] = f
    fs_db: dict[str, dict[str, float | None]] = {}
    for (m, g), f in frontier_scores(per_db).items():
        fs_db.setdefault(m, {})[str(g)] = f
    progress(f"bootstrap: success intervals ({replicates:,} replicates)")
    ci = source.success_intervals(replicates=replicates, seed=seed)
    pairs = comparison_pairs(methods, ref) if len(methods) > 1 else []
    progress(f"bootstrap: {len(pairs)} method pairs × {len(levels)} budgets ({replicates:,} replicates)")
    comps = source.paired_comparisons(pairs, budgets=levels, replicates=replicates, seed=seed)
    others = [m for m in methods if m != ref] if ref is not None else []
    gates = tuple(primary_gate(comps, m, ref) for m in others)
    progress("transitions and diagnostics")
    transitions: list[TransitionAnalysis] = []
    for m in others:
        transitions += source.transitions(m, ref)
    if others and not transitions:
        notes.append("no transition analysis: it needs the reference and another method at all of XS, S, M, L")
    breaches = sum(c.breaches for c in cells)
    if breaches:
        notes.append(f"{breaches} episode(s) carry the hard-breach audit flag: accounting is broken somewhere")
    placebo = placebo_records(source.run_dirs)
    for m in methods:
        if conditions.get(m) == "shuffled_estimate" and m not in placebo:
            notes.append(f"{m}: no placebo record in the runs' sweep.json, so how far its shown estimates were from "
                         "an exact permutation of the true ones is unknown")
    return Summary(
        runs=source.run_dirs,
        episodes=source.episodes,
        methods=methods,
        levels=levels,
        reference=ref,
        databases=n_db,
        conditions=conditions,
        replicates=replicates,
        seed=seed,
        cells=cells,
        per_database=per_db,
        per_seed=per_seed,
        success_ci=ci,
        frontier=frontier,
        frontier_per_seed=fs_seed,
        frontier_per_database=fs_db,
        comparisons=comps,
        gates=gates,
        transitions=tuple(transitions),
        coverage=source.coverage(),
        warning_flow=source.warning_flow(),
        failures=source.failures(),
        notes=tuple(notes),
        placebo=placebo,
        empty_gold=source.empty_gold(),
    )


def placebo_records(run_dirs: Sequence[str | Path]) -> dict[str, dict]:
    """Placebo method → its record (`bapsql.env.placebo`: recorded, requests, extra, unused, unmatched, ...) from
    the runs' ``sweep.json`` files; runs without one contribute nothing."""
    out: dict[str, dict] = {}
    for run in run_dirs:
        path = Path(run) / "sweep.json"
        try:
            record = json.loads(path.read_text()) if path.is_file() else {}
        except (OSError, ValueError):
            continue
        for method, stats in (record.get("placebo") or {}).items():
            if isinstance(stats, dict):
                out[str(method)] = stats
    return out


def _jsonable(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, Mapping):
        return {("|".join(map(str, k)) if isinstance(k, tuple) else str(k)): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, (np.floating, float)):
        return float(obj) if math.isfinite(obj) else None
    if isinstance(obj, np.integer):
        return int(obj)
    return obj


_CELL_FIELDS: tuple[str, ...] = tuple(
    f.name for f in dataclasses.fields(CellMetrics) if f.name not in ("method", "budget", "group", "success")
)


def _by_level(cells: Sequence[CellMetrics], method: str, attr: str) -> dict[str, Any]:
    return {c.budget: getattr(c, attr) for c in cells if c.method == method}


def summary_to_json(summary: Summary) -> dict:
    """The ``summary.json`` document (plain JSON types; NaN becomes null)."""
    methods = {}
    for m in summary.methods:
        cells = [c for c in summary.cells if c.method == m]
        seed_scores = [v for v in summary.frontier_per_seed.get(m, {}).values() if v is not None]
        entry = {
            "policy": split_method(m)[0],
            "condition": summary.conditions.get(m),
            "success": _by_level(cells, m, "success"),
            "frontier_score": summary.frontier.get(m),
            "success_ci95": {lv: list(summary.success_ci[(m, lv)]) for lv in _by_level(cells, m, "success")},
            "frontier_score_per_seed": summary.frontier_per_seed.get(m, {}),
            "frontier_score_seed_sd": float(np.std(seed_scores, ddof=1)) if len(seed_scores) > 1 else None,
            "frontier_score_per_database": summary.frontier_per_database.get(m, {}),
        }
        for attr in _CELL_FIELDS:
            entry[attr] = _by_level(cells, m, attr)
        for name, rows in (("per_database", summary.per_database), ("per_seed", summary.per_seed)):
            table: dict[str, dict] = {}
            for c in rows:
                if c.method == m:
                    slot = table.setdefault(str(c.group), {"success": {}, **{a: {} for a in _CELL_FIELDS}})
                    for attr in ("success",) + _CELL_FIELDS:
                        slot[attr][c.budget] = getattr(c, attr)
            entry[name] = table
        methods[m] = entry
    doc = {
        "format": SUMMARY_FORMAT,
        "runs": list(summary.runs),
        "episodes": summary.episodes,
        "levels": list(summary.levels),
        "reference": summary.reference,
        "databases": summary.databases,
        "replicates": summary.replicates,
        "seed": summary.seed,
        "methods": methods,
        "comparisons": summary.comparisons,
        "primary_gates": summary.gates,
        "transitions": summary.transitions,
        "estimator_coverage": summary.coverage,
        "warning_flow": summary.warning_flow,
        "failures": summary.failures,
        "placebo": summary.placebo,
        "empty_gold": summary.empty_gold,
        "notes": list(summary.notes),
    }
    return _jsonable(doc)


def analyze_runs(
    run_dirs: Sequence[str | Path],
    out_dir: str | Path,
    *,
    reference: str | None = None,
    replicates: int = 10_000,
    seed: int = 0,
    progress: Progress = _quiet,
    console: Any = None,
) -> Summary:
    """Analyse the runs and write ``report.md``, ``report.html``, ``frontier.png``, ``quality_tokens.png`` and
    ``summary.json`` into ``out_dir`` (created if needed). Figures are skipped, with a note, without matplotlib.

    The logs are scanned out of core (`bapsql.analysis.scan.scan_runs`): memory is bounded by clusters (methods ×
    budgets × seeds × databases) and tasks, not episodes. The scan's progress bar goes to ``console`` (a rich
    console) when given, else as plain lines to ``progress``."""
    from bapsql.analysis.scan import LineConsole, scan_runs

    progress(f"loading {len(run_dirs)} run(s)")
    bar = console if console is not None else (None if progress is _quiet else LineConsole(progress))
    source = scan_runs(run_dirs, console=bar)
    summary = summarize_source(source, reference=reference, replicates=replicates, seed=seed, progress=progress)
    return write_report(summary, out_dir, progress=progress)


def write_report(summary: Summary, out_dir: str | Path, *, progress: Progress = _quiet) -> Summary:
    """Write the report files of `analyze_runs` into ``out_dir``; returns the summary (with a note when
    matplotlib is missing and the figures are skipped)."""
    from bapsql.analysis.render import render_html, render_markdown

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    progress("figures")
    figures: dict[str, bytes] = {}
    if importlib.util.find_spec("matplotlib") is None:
        summary = dataclasses.replace(
            summary, notes=summary.notes + ("matplotlib is not installed (pip install 'bapsql[analysis]'): no figures",)
        )
    else:
        figures = _figures(summary)
    for name, png in figures.items():
        (out / name).write_bytes(png)
    progress(f"writing report to {out}")
    (out / "report.md").write_text(render_markdown(summary, figures=tuple(figures)))
    (out / "report.html").write_text(render_html(summary, figures=figures))
    (out / "summary.json").write_text(json.dumps(summary_to_json(summary), indent=1, allow_nan=False) + "\n")
    return summary


def _figures(summary: Summary) -> dict[str, bytes]:
    from bapsql.analysis.plots import frontier_png, quality_tokens_png

    success = {(c.method, c.budget): c.success for c in summary.cells}
    tokens = {(c.method, c.budget): c.total_tokens for c in summary.cells}
    return {
        "frontier.png": frontier_png(summary.methods, summary.levels, success, summary.success_ci),
        "quality_tokens.png": quality_tokens_png(summary.methods, summary.levels, success, tokens),
    }
