"""The report of a `Summary`, in the paper's table layouts, as typed blocks.

All text is produced here, once: `report_blocks` turns the summary into a list of blocks (headings, paragraphs,
tables, figures), and `bapsql.analysis.render` (`render_markdown` / `render_html`) only lays those blocks out.
Numbers are rounded half-up (so 30.15 → 30.2, as the paper rounds); undefined values print as "—".

When the methods run under known conditions (``POLICY@CONDITION``), the per-method tables show a Policy and a
Condition column instead of one Method column. The Official EX table is always present: it reads the logged
``official_ex`` and says so when no episode records it. With fewer than five databases the comparison sections
say that their database-cluster intervals and sign tests are not meaningful.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from typing import TYPE_CHECKING, Sequence

import numpy as np

from bapsql.analysis.comparisons import GATE_BUDGETS
from bapsql.analysis.load import split_method
from bapsql.analysis.transitions import median_seed

if TYPE_CHECKING:
    from bapsql.analysis.analyze import Summary

DASH = "—"


def fmt(x: float | None, digits: int = 1, *, signed: bool = False, grouped: bool = False) -> str:
    """Half-up rounding to ``digits`` decimals; "—" for None/NaN; ``signed`` adds "+"; ``grouped`` adds commas."""
    if x is None or not math.isfinite(x):
        return DASH
    q = Decimal(f"{float(x):.9f}").quantize(Decimal(1).scaleb(-digits), rounding=ROUND_HALF_UP)
    if q == 0:
        q = abs(q)
    text = f"{q:,}" if grouped else f"{q}"
    return f"+{text}" if signed and q > 0 else text


def fmt_ci(lo: float, hi: float, digits: int = 1) -> str:
    return DASH if not (math.isfinite(lo) and math.isfinite(hi)) else f"[{fmt(lo, digits)}, {fmt(hi, digits)}]"


@dataclass(frozen=True)
class Heading:
    text: str
    level: int = 2


@dataclass(frozen=True)
class Paragraph:
    text: str


@dataclass(frozen=True)
class Bullets:
    items: tuple[str, ...]


@dataclass(frozen=True)
class Table:
    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    caption: str = ""


@dataclass(frozen=True)
class Figure:
    name: str  # file name, e.g. frontier.png
    caption: str


Block = Heading | Paragraph | Bullets | Table | Figure


def _seed_sd(values: Sequence[float]) -> float:
    return float(np.std(values, ddof=1)) if len(values) > 1 else math.nan


def _range(values: Sequence[float], digits: int = 1, signed: bool = True) -> str:
    vals = [v for v in values if math.isfinite(v)]
    if not vals:
        return DASH
    return f"{fmt(min(vals), digits, signed=signed)} to {fmt(max(vals), digits, signed=signed)}"


def _mcols(s: Summary) -> tuple[str, ...]:
    """Header cells naming a method: Policy and Condition when conditions are known, else Method."""
    return ("Policy", "Condition") if s.has_conditions else ("Method",)


def _mcells(s: Summary, m: str) -> tuple[str, ...]:
    if not s.has_conditions:
        return (m,)
    return (split_method(m)[0], s.conditions.get(m) or DASH)


def _few_databases(s: Summary) -> list[Block]:
    if not s.few_databases:
        return []
    return [Paragraph(f"**Only {s.databases} database(s)**: database-cluster intervals, database-t intervals and "
                      "sign tests over databases are not meaningful with fewer than five databases; the numbers "
                      "below are descriptive.")]


def _frontier_blocks(s: Summary) -> list[Block]:
    cols = _mcols(s) + tuple(f"{lv} (%)" for lv in s.levels) + ("Frontier Score (pp)",)
    rows = []
    for m in s.methods:
        cells = [fmt(c.success) if (c := s.cell(m, lv)) else DASH for lv in s.levels]
        rows.append((*_mcells(s, m), *cells, fmt(s.frontier.get(m))))
    blocks: list[Block] = [
        Heading("Budgeted Success (Table 2)"),
        Table(cols, tuple(rows), "Budgeted Success pooled over seeds. Frontier Score = (XS/2 + S + M + L/2) / 3, "
              "descriptive, in percentage points; — where a level is missing."),
    ]
    e = s.empty_gold
    if e:
        on = "; ".join(f"{m} {fmt(v)}%" for m, v in e["success"].items())
        blocks.append(Paragraph(f"Empty gold answers: {e['tasks']} of {e['of_tasks']} tasks have a gold query that "
                                "returns no rows, so an answer of [] is correct there without any evidence"
                                + (f" (Budgeted Success on their {e['episodes']:,} episodes: {on})." if on else ".")))
    blocks.append(Heading("Official EX", 3))
    if any(c.official_ex is not None for c in s.cells):
        ex_rows = tuple((*_mcells(s, m), *[fmt(c.official_ex) if (c := s.cell(m, lv)) else DASH for lv in s.levels])
                        for m in s.methods)
        blocks.append(Table(_mcols(s) + tuple(f"{lv} EX (%)" for lv in s.levels), ex_rows,
                            "Official (unbudgeted) execution accuracy of each episode's final SQL, from the logged "
                            "official_ex, over the episodes that record it; — where none do. As BIRD counts it: a "
                            "final SQL that errors or exceeds the cap is wrong, and so is an episode that ran no "
                            "SQL."))
        n_rows = tuple((*_mcells(s, m), *[f"{c.official_ex_n} / {c.episodes}" if (c := s.cell(m, lv)) else DASH
                                          for lv in s.levels]) for m in s.methods)
        blocks.append(Table(_mcols(s) + tuple(f"{lv} EX denominator" for lv in s.levels), n_rows,
                            "Episodes that record official_ex / episodes of the cell. Episodes this environment "
                            "logs without it: the task's gold SQL could not be run (or logs of other systems)."))
    else:
        blocks.append(Paragraph("Official EX: absent. No episode in these logs records official_ex, so "
                                "unbudgeted execution accuracy is not reported."))
    blocks.append(Figure("frontier.png", "Budgeted Success by level; bars are 95% database-cluster bootstrap "
                         f"intervals ({s.replicates:,} replicates)."))
    seed_rows = []
    for m in s.methods:
        per = s.frontier_per_seed.get(m, {})
        vals = [v for v in per.values() if v is not None]
        if vals:
            seed_rows.append((*_mcells(s, m), " / ".join(f"{k}: {fmt(v)}" for k, v in per.items() if v is not None),
                              fmt(_seed_sd(vals), 2)))
    if seed_rows:
        blocks.append(Heading("Frontier Score per seed", 3))
        blocks.append(Table(_mcols(s) + ("Frontier Score per seed", "seed SD"), tuple(seed_rows)))
    dbs = sorted({db for per in s.frontier_per_database.values() for db in per})
    if dbs:
        db_rows = tuple((db, *[fmt(s.frontier_per_database.get(m, {}).get(db)) for m in s.methods]) for db in dbs)
        blocks.append(Heading("Frontier Score per database", 3))
        blocks.append(Table(("Database",) + s.methods, db_rows, "Frontier Score (pp) per database (— where a "
                            "database lacks a level)."))
    return blocks


def _cost_blocks(s: Summary) -> list[Block]:
    cols = _mcols(s) + ("Budget", "Episodes", "Total tokens", "Active context (peak)", "Queries", "Result tokens",
                        "VM steps", "Turns", "Abstained (%)")
    rows = tuple(
        (*_mcells(s, c.method), c.budget, fmt(c.episodes, 0, grouped=True), fmt(c.total_tokens, 0, grouped=True),
         fmt(c.peak_context, 0, grouped=True), fmt(c.queries, 2), fmt(c.result_tokens, 1),
         fmt(c.vm_steps, 0, grouped=True), fmt(c.turns, 2), fmt(c.abstained))
        for c in s.cells
    )
    return [
        Heading("Interaction cost"),
        Table(cols, rows, "Means per episode; total tokens = prompt + completion + result + controller."),
        Figure("quality_tokens.png", "Quality–token trajectories: mean total tokens vs Budgeted Success per level."),
    ]


def _gate_blocks(s: Summary) -> list[Block]:
    if not s.gates:
        return []
    blocks: list[Block] = [Heading(f"Paired comparisons against {s.reference} (Table 3)"), *_few_databases(s)]
    for gate in s.gates:
        m = gate.method
        rows, robust = [], []
        for lv in s.levels:
            c = s.comparison(m, s.reference, lv)
            if c is None:
                continue
            q, t = c.quality, c.tokens
            rows.append((lv, f"{fmt(q.estimate, signed=True)} pp", f"{fmt(q.lower_95, signed=True)} pp",
                         f"{fmt(t.estimate, signed=True)}% {fmt_ci(t.ci_low, t.ci_high)}",
                         fmt_ci(q.ci_low, q.ci_high), fmt(c.pairs, 0, grouped=True)))
            robust.append((lv, fmt_ci(q.t_low, q.t_high), fmt(q.macro, signed=True),
                           f"[{fmt(q.lodo_min)}, {fmt(q.lodo_max)}]", _range(list(q.per_seed.values())),
                           f"{q.sign.favorable}/{q.sign.favorable + q.sign.unfavorable}, p={fmt(q.sign.p_value, 3)}",
                           fmt(c.mean_tokens_method - c.mean_tokens_reference, 1, signed=True),
                           f"{t.sign.favorable}/{t.sign.favorable + t.sign.unfavorable}, p={fmt(t.sign.p_value, 3)}"))
        steps = " → ".join(f"{st.criterion} {st.budget}: {st.status}" for st in gate.steps)
        verdict = "PASSED" if gate.passed else "not passed"
        blocks += [
            Heading(f"{m} − {s.reference}", 3),
            Table(("Budget", "Quality diff.", "NI lower bound", "Total-token change (95% CI)",
                   "Quality 95% CI", "Pairs"), tuple(rows),
                  f"Database-cluster bootstrap, {s.replicates:,} replicates, seed {s.seed}."),
            Paragraph(f"Primary gate (ordered, NI margin −{fmt(gate.margin_pp)} pp at "
                      f"{'/'.join(GATE_BUDGETS)}, then tokens): {steps}. Gate: **{verdict}**."),
            Table(("Budget", "Quality DB-t 95% CI", "DB-macro", "Leave-one-DB-out", "Per-seed range",
                   "Quality sign test", "Δ tokens / episode", "Token-reduction sign test"), tuple(robust),
                  "Exploratory, unadjusted. Sign tests are one-sided exact binomial over databases (ties dropped)."),
        ]
    return blocks


def _table4_blocks(s: Summary) -> list[Block]:
    levels = [lv for lv in GATE_BUDGETS if lv in s.levels]
    if len(s.methods) < 2 or not levels or s.reference is None:
        return []
    rows = []
    for m in s.methods:
        row = [*_mcells(s, m)]
        for lv in levels:
            vals = [c.success for c in s.per_seed if c.method == m and c.budget == lv]
            cell = s.cell(m, lv)
            sd = _seed_sd(vals)
            row.append(DASH if cell is None else fmt(cell.success) + (f" ± {fmt(sd)}" if math.isfinite(sd) else ""))
        for lv in levels:
            c = s.comparison(m, s.reference, lv)
            if m == s.reference or c is None:
                row.append(DASH)
            else:
                row.append(f"{fmt(c.quality.estimate, signed=True)} {fmt_ci(c.quality.ci_low, c.quality.ci_high)}")
        rows.append(tuple(row))
    cols = _mcols(s) + tuple(levels) + tuple(f"Δ vs {s.reference} {lv} (pp)" for lv in levels)
    return [Heading("Method diagnostics at XS/S (Table 4 layout)"),
            Table(cols, tuple(rows), "Success as mean ± seed SD (SD of per-seed pooled success); Δ with paired "
                  "95% database-cluster bootstrap intervals.")]


def _transition_blocks(s: Summary) -> list[Block]:
    if not s.transitions:
        return []
    blocks: list[Block] = [Heading(f"One-shot transitions against {s.reference} (Figure 3 layout)"),
                           Paragraph("Tasks are partitioned by the reference: always-correct, budget-sensitive "
                                     "(correct at L, not at some tighter level), persistent (wrong at L). "
                                     "Net = rescued + additional − regressed. Median seed by XS net.")]
    for m in sorted({t.method for t in s.transitions}):
        runs = [t for t in s.transitions if t.method == m]
        med = median_seed(runs)
        rows = tuple(
            (r.budget, str(r.rescued), str(r.regressed), str(r.additional), f"{r.net:+d}",
             _range([float(t.rows[i].net) for t in runs], 0))
            for i, r in enumerate(med.rows)
        )
        blocks += [
            Heading(f"{m} (seed {med.seed} vs reference seed {med.reference_seed})", 3),
            Paragraph(f"{med.tasks} tasks: {med.always_correct} always-correct, {med.budget_sensitive} "
                      f"budget-sensitive, {med.persistent} persistent-under-L."),
            Table(("Budget", "Rescued", "Regressed", "Additional", "Net", "Net across seeds"), rows),
        ]
    return blocks


def _diagnostic_blocks(s: Summary) -> list[Block]:
    blocks: list[Block] = [Heading("Estimator and behaviour diagnostics")]
    pooled = [c for c in s.coverage if c.budget is None]
    if pooled:
        blocks.append(Table(("Method", "Quantity", "p95 coverage (%)", "p50 coverage (%)", "Turns",
                             "Stopped by the VM cap", "Stopped, p95 above the cap", "Preflight-rejected"),
                            tuple((c.method, c.quantity.replace("_", " "), fmt(c.p95), fmt(c.p50),
                                   fmt(c.n_p95, 0, grouped=True), fmt(c.stopped, 0, grouped=True),
                                   fmt(c.censored_p95, 0, grouped=True), fmt(c.preflight_rejected, 0, grouped=True))
                                  for c in pooled),
                            "Share of executed turns with actual ≤ estimate, where both are logged. A run the "
                            "VM-step cap stopped cost more than its cap: for VM steps it is a miss when the "
                            "estimate was below the cap, and left out (unknown) when it was above; its rows and "
                            "result tokens are unknown. Preflight-rejected queries never ran and are not in the "
                            "coverage."))
    if s.warning_flow:
        flow = tuple((*_mcells(s, w.method), w.budget, fmt(w.warned_pct), fmt(w.rewrite_given_warning_pct),
                      fmt(w.success_given_rewrite_pct), fmt(w.recovery_pct)) for w in s.warning_flow)
        blocks.append(Table(_mcols(s) + ("Budget", "≥1 warning (%)", "Rewrite | warned (%)",
                                         "Success | warned+rewritten (%)", "Success | rejected (%)"), flow,
                            "Descriptive conditional frequencies; 'rejected' = at least one shield preflight "
                            "rejection."))
    if s.placebo:
        rows = tuple((m, str(r.get("source", DASH)), fmt(r.get("requests"), 0, grouped=True),
                      fmt(r.get("extra"), 0, grouped=True), fmt(r.get("unused"), 0, grouped=True),
                      fmt(r.get("unmatched"), 0, grouped=True), "yes" if r.get("unmatched") == 0 else "no")
                     for m, r in sorted(s.placebo.items()))
        blocks += [Heading("Cost-matched placebo", 3),
                   Table(("Placebo method", "Recorded from", "Requests shown", "Not recorded (drawn)",
                          "Recorded, not requested", "Unmatched", "Exact permutation"), rows,
                         "The shown p50/p95 payloads permute those the recording run requested at the same level; "
                         "requests it never made are drawn without replacement from the level's payloads. With 0 "
                         "unmatched the shown multiset is exactly the true one; the shield always keeps the true "
                         "estimate.")]
    kinds = sorted({k for f in s.failures for k in f.counts})
    if kinds:
        rows = tuple((*_mcells(s, f.method), f.budget, fmt(f.episodes, 0, grouped=True),
                      *[f"{f.counts.get(k, 0)} ({fmt(100.0 * f.counts.get(k, 0) / f.episodes)}%)" for k in kinds])
                     for f in s.failures)
        blocks.append(Table(_mcols(s) + ("Budget", "Episodes") + tuple(k.replace("_", " ") for k in kinds), rows,
                            "Failure taxonomy: episodes per failure kind (percent of all episodes of the cell)."))
    return blocks


def _pairwise_blocks(s: Summary) -> list[Block]:
    if not s.comparisons:
        return []
    rows = tuple(
        (f"{c.method} − {c.reference}", c.budget,
         f"{fmt(c.quality.estimate, signed=True)} {fmt_ci(c.quality.ci_low, c.quality.ci_high)}",
         f"{fmt(c.tokens.estimate, signed=True)}% {fmt_ci(c.tokens.ci_low, c.tokens.ci_high)}",
         f"{c.quality.sign.favorable}/{c.quality.sign.favorable + c.quality.sign.unfavorable}")
        for c in s.comparisons
    )
    return [Heading("All pairwise comparisons"), *_few_databases(s),
            Table(("Pair", "Budget", "Quality diff. pp (95% CI)", "Token change % (95% CI)", "DBs favouring"), rows)]


def report_blocks(s: Summary) -> list[Block]:
    """The whole report as blocks, in reading order."""
    head: list[Block] = [
        Heading("bapsql analysis report", 1),
        Paragraph(f"{s.episodes:,} episodes from {len(s.runs)} run(s): {', '.join(s.runs)}. Methods: "
                  f"{', '.join(s.methods)}. Budgets: {', '.join(s.levels)}. Databases: {s.databases}. "
                  f"Reference: {s.reference or DASH}. "
                  f"Bootstrap: {s.replicates:,} database-cluster replicates, seed {s.seed}."),
    ]
    if s.notes:
        head += [Heading("Notes", 3), Bullets(tuple(s.notes))]
    return (head + _frontier_blocks(s) + _cost_blocks(s) + _gate_blocks(s) + _table4_blocks(s)
            + _transition_blocks(s) + _diagnostic_blocks(s) + _pairwise_blocks(s))
