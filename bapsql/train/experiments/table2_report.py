"""The report of Table 2 in miniature (`bapsql.train.experiments.table2`): two analyses of the rows' sweeps and
``table2.md``.

``write_report`` writes into ``<out_dir>/<name>-table2``:

- ``table2/``: `bapsql.analysis.analyze_runs` with the dashboard row as reference (Budgeted Success, Frontier Scores,
  database-cluster intervals, paired comparisons of every pair, ``frontier.png``, ``quality_tokens.png``);
- ``gate/``: the same runs with the SFT row as reference: the Table 3 primary gate of each RL row against SFT;
- ``rl_*_seed<k>.png``: the GRPO learning curves; ``table2.json`` (`Table2Result`) and ``table2.md``, which sets the
  miniature table beside the paper's Table 2 and lists, computed from these results, which of the paper's
  orderings hold here (`orderings`), then the mechanism diagnostics: per row and level the share of episodes with a
  policy-visible warning and of warned episodes that rewrite (the sweep's warning flow), and per RL stage and level
  the spread inside its training groups (`bapsql.train.experiments.mechanism`).
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bapsql.analysis.analyze import Summary
from bapsql.train.experiments.mechanism import GroupSpread, read_group_spread
from bapsql.train.experiments.stage_plan import read_stages, stages_path
from bapsql.train.experiments.table2 import RL_REWARDS, SEED_STAGES, Row, Table2Config, table2_rows

LEVELS: tuple[str, ...] = ("XS", "S", "M", "L")
# The paper's Table 2 (BIRD-derived dev set, Qwen-class 4B backbone, three adapters): XS, S, M, L, Frontier Score.
PAPER_TABLE2: dict[str, tuple[float, float, float, float, float]] = {
    "raw": (17.9, 19.1, 19.7, 19.9, 19.2),
    "dashboard": (17.7, 17.6, 17.4, 19.0, 17.8),
    "adaptive_posthoc": (26.0, 29.2, 31.5, 33.5, 30.2),
    "sft": (31.4, 34.0, 36.2, 37.5, 34.9),
    "sql_rl": (32.2, 35.2, 38.7, 40.4, 36.7),
    "bap_rl": (34.8, 37.6, 39.2, 39.0, 37.9),
}
# The paper's Table 3 (BAP-SQL RL − SFT): quality diff (pp), NI lower bound (pp), total-token change % [95% CI].
PAPER_TABLE3: dict[str, tuple[float, float, float, float, float]] = {
    "XS": (3.4, 2.0, -4.5, -5.9, -3.2), "S": (3.6, 2.1, -5.0, -6.4, -3.7),
    "M": (3.0, 1.5, -3.0, -4.2, -1.8), "L": (1.5, 0.2, 0.2, -0.9, 1.3),
}


@dataclass(frozen=True)
class Cell:
    row: str
    level: str  # XS..L, or "FS" (Frontier Score, pp)
    value: float | None
    ci: tuple[float, float] | None
    paper: float | None


@dataclass(frozen=True)
class Ordering:
    """``higher − lower`` at ``level`` here and in the paper; ``holds``: same sign as the paper's (None: not
    measured here); ``clear``: the 95 % paired interval excludes zero on the paper's side."""

    higher: str
    lower: str
    level: str
    paper_delta: float
    delta: float | None
    ci: tuple[float, float] | None
    holds: bool | None
    clear: bool


@dataclass(frozen=True)
class Table2Result:
    preset: str
    reduced: tuple[str, ...]
    rows: tuple[Row, ...]
    cells: tuple[Cell, ...]
    orderings: tuple[Ordering, ...]
    attenuation: Ordering | None  # BAP-SQL RL − SFT gain at XS (higher) vs at L (lower)
    gates: tuple[Any, ...]  # `PrimaryGate` of each RL row against SFT
    episodes: int
    databases: int
    notes: tuple[str, ...]
    # "<stage> seed <k>" -> the spread inside that GRPO stage's training groups, per level
    spread: dict[str, tuple[GroupSpread, ...]] = dataclasses.field(default_factory=dict)


def _sign(x: float) -> int:
    return (x > 0) - (x < 0)


def _delta(s: Summary, a: str, b: str, level: str) -> tuple[float | None, tuple[float, float] | None]:
    """``a − b`` (pp) and its paired 95 % interval from the analysis's comparisons (either orientation)."""
    if level == "FS":
        fa, fb = s.frontier.get(a), s.frontier.get(b)
        return (fa - fb if fa is not None and fb is not None else None), None
    c = s.comparison(a, b, level)
    if c is not None:
        return c.quality.estimate, (c.quality.ci_low, c.quality.ci_high)
    c = s.comparison(b, a, level)
    if c is not None:
        return -c.quality.estimate, (-c.quality.ci_high, -c.quality.ci_low)
    return None, None


def _ordering(s: Summary, hi: Row, lo: Row, level: str, paper: float) -> Ordering:
    d, ci = _delta(s, hi.logged, lo.logged, level)
    ok = d is not None and math.isfinite(d)
    holds = (_sign(d) == _sign(paper) and _sign(d) != 0) if ok else None
    clear = bool(holds and ci is not None and (ci[0] > 0 if paper > 0 else ci[1] < 0))
    return Ordering(hi.key, lo.key, level, paper, d if ok else None, ci, holds, clear)


def orderings(s: Summary, rows: tuple[Row, ...]) -> tuple[tuple[Ordering, ...], Ordering | None]:
    """Each adjacent pair of rows in the paper's order, and BAP-SQL RL vs SFT, at every level and the Frontier
    Score, as measured here against the paper's sign; plus the attenuation (gain over SFT at L below that at XS)."""
    by = {r.key: r for r in rows}
    keys = [r.key for r in rows if r.key in PAPER_TABLE2]
    pairs = list(zip(keys[1:], keys[:-1])) + ([("bap_rl", "sft")] if {"bap_rl", "sft"} <= set(by) else [])
    out = []
    for hi, lo in pairs:
        for i, level in enumerate(LEVELS + ("FS",)):
            if level != "FS" and level not in s.levels:
                continue
            out.append(_ordering(s, by[hi], by[lo], level, PAPER_TABLE2[hi][i] - PAPER_TABLE2[lo][i]))
    att = None
    if {"XS", "L"} <= set(s.levels):
        g_xs, _ = _delta(s, by["bap_rl"].logged, by["sft"].logged, "XS")
        g_l, _ = _delta(s, by["bap_rl"].logged, by["sft"].logged, "L")
        p_xs = PAPER_TABLE2["bap_rl"][0] - PAPER_TABLE2["sft"][0]
        p_l = PAPER_TABLE2["bap_rl"][3] - PAPER_TABLE2["sft"][3]
        known = g_xs is not None and g_l is not None
        att = Ordering("gain@XS", "gain@L", "XS vs L", p_xs - p_l, (g_xs - g_l) if known else None, None,
                       attenuates(g_xs, g_l) if known else None, False)
    return tuple(out), att


def attenuates(gain_xs: float, gain_l: float) -> bool:
    """The paper's attenuation: a positive gain over SFT at XS that is smaller at L. A gain that is negative at XS
    (RL below SFT) does not attenuate, however it changes by L."""
    return gain_xs > 0 and gain_xs - gain_l > 0


def table2_result(cfg: Table2Config, s2: Summary, s3: Summary) -> Table2Result:
    rows = table2_rows(cfg)
    cells = []
    for r in rows:
        paper = PAPER_TABLE2.get(r.key)
        for i, level in enumerate(LEVELS):
            c = s2.cell(r.logged, level)
            cells.append(Cell(r.key, level, c.success if c else None, s2.success_ci.get((r.logged, level)),
                              paper[i] if paper else None))
        cells.append(Cell(r.key, "FS", s2.frontier.get(r.logged), None, paper[4] if paper else None))
    ords, att = orderings(s2, rows)
    rl = {r.logged for r in rows if r.key in ("sql_rl", "bap_rl")}
    gates = tuple(g for g in s3.gates if g.method in rl)
    return Table2Result(cfg.preset, cfg.reduced, rows, tuple(cells), ords, att, gates, s2.episodes, s2.databases,
                        s2.notes)


# ------------------------------------------------------------------------------------------------------ render
def _f(x: float | None, signed: bool = False) -> str:
    if x is None or not math.isfinite(x):
        return "—"
    x = round(x, 1) + 0.0  # no "-0.0"
    return f"{x:+.1f}" if signed else f"{x:.1f}"


def _sd(x: float) -> str:
    return f"{x:.2f}" if math.isfinite(x) else "—"


def _ci(ci: tuple[float, float] | None) -> str:
    return f" [{_f(ci[0])}, {_f(ci[1])}]" if ci and all(math.isfinite(v) for v in ci) else ""


def _holds(o: Ordering) -> str:
    return "not measured" if o.holds is None else ("yes (interval clear)" if o.clear else "yes") if o.holds else "no"


def render_markdown(cfg: Table2Config, res: Table2Result, s3: Summary, times: dict[int, dict[str, dict]],
                    figures: list[str]) -> str:
    t = cfg.train
    label = {r.key: r.label for r in res.rows}
    lines = ["# Table 2 in miniature", ""]
    if res.preset == "quick":
        lines += ["**Quick preset** (`--quick`): a first look, smaller than the experiment. It reduced: "
                  + "; ".join(f"`{x}`" for x in res.reduced) + ".", ""]
    prompting = {"base": "the base model" + (" (pretrained here)" if t.pretrain.enabled else f" ({t.model.base})"),
                 "sft": "the **SFT model** (prompting_model: sft: the base model cannot act on its own)",
                 "protocol": "a **protocol-only adapter** on the base model (SFT on the budget-blind workflows "
                             + ", ".join(f"`{w}`" for w in (cfg.protocol.workflows if cfg.protocol else ()))
                             + " under " + ", ".join(f"`{c}`" for c in (cfg.protocol.conditions if cfg.protocol
                                                                         else ())) + ")"}[cfg.prompting_model]
    lines += [f"Backbone `{t.model.base}`{' + in-domain pretraining' if t.pretrain.enabled else ''}; benchmark "
              f"`{t.data.benchmark}`, split `{t.data.eval_split}`; {res.episodes} episodes over {res.databases} "
              f"database(s); adapter seeds {list(t.seeds)}; {t.grpo.updates} GRPO update(s) per RL row. The prompting "
              f"rows are {prompting}; trained rows run under `{t.condition}`. The paper's numbers: BIRD-derived dev "
              "set, Qwen-class 4B backbone, three adapters, 120 updates.", "",
              "## Budgeted Success (%), here [95 % database-cluster interval] | paper", ""]
    lv = [c.level for c in res.cells if c.row == res.rows[0].key]
    lines += ["| Method | run as | " + " | ".join(f"{x} here | {x} paper" for x in lv) + " |",
              "|---|---|" + "---|---|" * len(lv)]
    for r in res.rows:
        cs = [c for c in res.cells if c.row == r.key]
        lines.append(f"| {r.label} | `{r.logged}` | " + " | ".join(
            f"{_f(c.value)}{_ci(c.ci)} | {_f(c.paper)}" for c in cs) + " |")
    lines += ["", "FS = Frontier Score (pp; needs XS, S, M and L). Reference of the paired comparisons: "
              f"`{next(r.logged for r in res.rows if r.key == cfg.reference_condition)}`.", "",
              "## Which of the paper's orderings hold here", "",
              "Computed from the results above: the sign of each difference here against the paper's sign "
              "(a difference of exactly 0 does not hold).", "",
              "| comparison | level | paper Δ (pp) | here Δ (pp) [95 % paired interval] | holds here |",
              "|---|---|---|---|---|"]
    for o in res.orderings:
        lines.append(f"| {label[o.higher]} − {label[o.lower]} | {o.level} | {_f(o.paper_delta, True)} | "
                     f"{_f(o.delta, True)}{_ci(o.ci)} | {_holds(o)} |")
    n = [o for o in res.orderings if o.holds is not None]
    lines += ["", f"**{sum(o.holds for o in n)} of {len(n)}** measured orderings hold here "
              f"({sum(o.clear for o in n)} with an interval clear of zero)."]
    if res.attenuation is not None:
        a = res.attenuation
        lines.append(f"Attenuation (BAP-SQL RL − SFT gain at XS minus the gain at L; holds only for a positive "
                     f"gain at XS): paper {_f(a.paper_delta, True)} pp, here {_f(a.delta, True)} pp: {_holds(a)}.")
    lines += ["", f"## Table 3 gate: RL − SFT (reference `{s3.reference}`)", ""]
    for g in res.gates:
        lines += [f"- `{g.method}`: gate **{'passes' if g.passed else 'does not pass'}** ("
                  + "; ".join(f"{st.budget} {st.criterion}: {st.status}" for st in g.steps) + ")"]
    bap = next((r.logged for r in res.rows if r.key == "bap_rl"), None)
    lines += ["", "| BAP-SQL RL − SFT | quality here | quality paper | NI bound here | NI bound paper | "
              "tokens % here | tokens % paper |", "|---|---|---|---|---|---|---|"]
    for level in s3.levels:
        c = s3.comparison(bap, s3.reference, level) if bap and s3.reference else None
        p = PAPER_TABLE3.get(level)
        lines.append(f"| {level} | {_f(c.quality.estimate, True) if c else '—'} | {_f(p[0], True) if p else '—'} | "
                     f"{_f(c.quality.lower_95, True) if c else '—'} | {_f(p[1], True) if p else '—'} | "
                     f"{(_f(c.tokens.estimate, True) + _ci((c.tokens.ci_low, c.tokens.ci_high))) if c else '—'} | "
                     f"{(_f(p[2], True) + _ci((p[3], p[4]))) if p else '—'} |")
    lines += _mechanism_lines(res, s3, t.filter.group_size)
    lines += ["", "## Figures", ""] + [f"![{f}]({f})" for f in figures]
    lines += ["", "## Time per stage (s)", "", "| seed | " + " | ".join(SEED_STAGES) + " |",
              "|---|" + "---|" * len(SEED_STAGES)]
    for seed, st in times.items():
        lines.append(f"| {seed} | " + " | ".join(
            (f"{st[s]['seconds']:.0f}" if st.get(s, {}).get("finished") else "—") for s in SEED_STAGES) + " |")
    lines += ["", "Full reports: [table2/report.md](table2/report.md) (reference: dashboard row), "
              "[gate/report.md](gate/report.md) (reference: SFT row)."]
    if res.notes:
        lines += ["", "## Notes", ""] + [f"- {x}" for x in res.notes]
    return "\n".join(lines) + "\n"


def _mechanism_lines(res: Table2Result, s: Summary, group_size: int) -> list[str]:
    """The mechanism diagnostics (module docstring) as markdown lines."""
    rows = {r.logged: r.label for r in res.rows}
    lines = ["", "## Mechanism diagnostics", "",
             "Evaluation sweep (greedy): share of episodes with at least one policy-visible warning, and of those the "
             "share that rewrote a query.", "",
             "| row | level | episodes | ≥ 1 warning (%) | rewrite given warning (%) |", "|---|---|---|---|---|"]
    lines += [f"| {rows[w.method]} | {w.budget} | {w.episodes} | {_f(w.warned_pct)} | "
              f"{_f(w.rewrite_given_warning_pct)} |" for w in s.warning_flow if w.method in rows]
    lines += ["", f"GRPO training groups ({group_size} samples of one question at one level): the full reward "
              "differs from correctness only in groups whose successes differ in query count or evidence score.", "",
              "| stage | level | groups | mixed | ≥ 2 successes | queries differ (%) | evidence differs (%) | "
              "full reward differs (%) | SD queries | SD evidence |", "|---|---|---|---|---|---|---|---|---|---|"]
    for stage, spreads in res.spread.items():
        lines += [f"| {stage} | {g.budget} | {g.groups} | {g.mixed} | {g.multi} | {_f(g.queries_differ_pct)} | "
                  f"{_f(g.evidence_differ_pct)} | {_f(g.full_differs_pct)} | {_sd(g.queries_sd)} | "
                  f"{_sd(g.evidence_sd)} |" for g in spreads]
    return lines


def write_report(cfg: Table2Config, *, console: Any = None) -> Path:
    """Analyse the seeds' sweeps and write the report folder (module docstring); returns it."""
    from bapsql.analysis.analyze import _jsonable, analyze_runs
    from bapsql.errors import ConfigError

    t = cfg.train
    out = cfg.report_dir
    runs = [t.run_dir(k) / "table2" / "eval" for k in t.seeds]
    missing = [str(r) for r in runs if not r.is_dir()]
    if missing:
        raise ConfigError(f"report: no evaluation sweep in {missing}; run the eval stage first")
    rows = {r.key: r for r in table2_rows(cfg)}
    say = (lambda m: console.print(f"[dim]{m}[/dim]")) if console is not None else (lambda m: None)
    s2 = analyze_runs(runs, out / "table2", reference=rows[cfg.reference_condition].logged,
                      replicates=t.eval.replicates, seed=0, progress=say)
    s3 = analyze_runs(runs, out / "gate", reference=rows["sft"].logged, replicates=t.eval.replicates, seed=0,
                      progress=say)
    figures = [f"table2/{f}" for f in ("frontier.png", "quality_tokens.png") if (out / "table2" / f).is_file()]
    figures += _learning_curves(cfg, out)
    res = dataclasses.replace(table2_result(cfg, s2, s3), spread={
        f"{stage} seed {k}": sp for k in t.seeds for stage in RL_REWARDS
        if (sp := read_group_spread(t.run_dir(k) / stage / "rollouts", updates=t.grpo.updates))})
    times = {k: read_stages(stages_path(cfg, k)) for k in t.seeds}
    (out / "table2.json").write_text(json.dumps(_jsonable(dataclasses.asdict(res) | {"stages": times}), indent=1)
                                     + "\n")
    (out / "table2.md").write_text(render_markdown(cfg, res, s3, times, figures))
    return out


def _learning_curves(cfg: Table2Config, out: Path) -> list[str]:
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        return []
    from bapsql.train.recipe.curves import learning_curves_png, read_history

    written = []
    for k in cfg.train.seeds:
        for stage in ("rl_full", "rl_sql"):
            hist = cfg.train.run_dir(k) / stage / "history.jsonl"
            if hist.is_file() and hist.read_text().strip():
                (out / f"{stage}_seed{k}.png").write_bytes(learning_curves_png(read_history(hist)))
                written.append(f"{stage}_seed{k}.png")
    return written
