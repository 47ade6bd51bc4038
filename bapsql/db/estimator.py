"""The pre-execution estimator: p50/p95 of rows, result tokens and VM steps of a query before it runs.

`Estimator.estimate(sql, vm_step_cap=...)` does, in order:
1. `Sandbox.check` — a refusal or a prepare error becomes an `Estimate` with ``error`` set (never an exception);
2. ``EXPLAIN QUERY PLAN`` (`Sandbox.explain_plan`): scans vs index searches, automatic indexes, temp B-trees,
   correlated subqueries;
3. a ``LIMIT 0`` probe run under the VM-step cap: the statement prepares, binds and reports its output columns but
   admits no rows. A CTE referenced twice is still materialized under LIMIT 0, so the probe's measured VM steps are
   returned (``probe_vm_steps``) for the episode to charge. The columns come from preparing the statement itself (a
   zero-step run), because the wrapper's subquery renames them (duplicates, declared case);
4. `bapsql.db.cardinality` (catalog statistics + sqlglot shape features) for rows, an upper bound and the output
   columns' sample texts; result tokens = tokens(header) + rows × tokens per row, the latter measured with the
   `TokenCounter` on rows rendered by `bapsql.db.rows.render_row` from the catalog's sample values (the same text
   the shield charges); VM steps from `bapsql.db.bytecode` (the statement's bytecode as a Markov chain whose loop
   counts and filter rates come from the plan lines matched to the cardinality model);
5. `Calibration.quantiles` per quantity and shape class → p50 and p95 (rows capped by their hard upper bound; the
   result-token p95 follows the row p95).

Costs: the analysis of a statement is cached per SQL text (the catalog is fixed for a handle); the check, plan and
probe always run, because the probe's steps are a real charge.
"""

from __future__ import annotations

import math
import re
import time
from collections import OrderedDict
from dataclasses import dataclass

from bapsql.db.bytecode import LoopHint, ProgramModel
from bapsql.db.calibration import Calibration, RawEstimate
from bapsql.db.cardinality import Analysis, analyze
from bapsql.db.catalog import Catalog
from bapsql.db.program import constraints_of, ops_from_rows, parse_plan_line
from bapsql.db.rows import render_header, render_row
from bapsql.db.sandbox import Sandbox
from bapsql.db.scope import DEFAULT_WIDTH, Scope
from bapsql.db.selectivity import SEL_RANGE, ColRef
from bapsql.errors import DatabaseBusy, SQLExecutionError, SQLRejected
from bapsql.tokens import TokenCounter

TOKEN_SAMPLE_ROWS = 8
CACHE_SIZE = 512


@dataclass(frozen=True)
class Quantiles:
    p50: float
    p95: float


@dataclass(frozen=True)
class Estimate:
    """What `Estimator.estimate` returns (see the module docstring). ``shape`` is the calibration class used."""

    rows: Quantiles
    result_tokens: Quantiles
    vm_steps: Quantiles
    columns: tuple[str, ...]
    probe_vm_steps: int
    plan: tuple[str, ...]
    features: dict[str, int | bool]
    error: str | None
    shape: str = ""
    seconds: float = 0.0

    def to_json(self) -> dict:
        return {
            "rows": {"p50": self.rows.p50, "p95": self.rows.p95},
            "result_tokens": {"p50": self.result_tokens.p50, "p95": self.result_tokens.p95},
            "vm_steps": {"p50": self.vm_steps.p50, "p95": self.vm_steps.p95},
            "columns": list(self.columns),
            "probe_vm_steps": self.probe_vm_steps,
            "plan": list(self.plan),
            "features": dict(self.features),
            "error": self.error,
            "shape": self.shape,
        }


_ZERO = Quantiles(0.0, 0.0)


def error_estimate(message: str, *, plan: tuple[str, ...] = (), probe_vm_steps: int = 0,
                   columns: tuple[str, ...] = ()) -> Estimate:
    return Estimate(_ZERO, _ZERO, _ZERO, columns, probe_vm_steps, plan, {}, message)


def shape_of(analysis: Analysis) -> str:
    """The calibration class of a statement: exact (row count certain), grouped, join, filter or other."""
    f = analysis.features
    if analysis.card.exact:
        return "exact"
    if f["group_by"]:
        return "grouped"
    if f["joins"] or f["tables"] > 1:
        return "join"
    if f["filters"] or f["limit"] >= 0:
        return "filter"
    return "other"


def plan_features(plan: tuple[str, ...]) -> dict[str, int | bool]:
    """Counts read off the EXPLAIN QUERY PLAN lines: full scans and index searches of tables, automatic indexes,
    temp B-trees (ORDER BY / GROUP BY / DISTINCT), correlated subqueries, materialized / co-routine subqueries."""
    lines = [ln.strip() for ln in plan]
    return {
        "plan_scans": sum(1 for ln in lines if ln.startswith("SCAN ") and not ln.startswith("SCAN CONSTANT")),
        "plan_searches": sum(1 for ln in lines if ln.startswith("SEARCH ")),
        "plan_covering_index": any("COVERING INDEX" in ln for ln in lines),
        "plan_automatic_index": any("AUTOMATIC" in ln for ln in lines),
        "plan_temp_btrees": sum(1 for ln in lines if ln.startswith("USE TEMP B-TREE")),
        "plan_correlated_subqueries": sum(1 for ln in lines if ln.startswith("CORRELATED ")),
        "plan_materialized": sum(1 for ln in lines if ln.startswith(("MATERIALIZE", "CO-ROUTINE"))),
    }


def _code_end(sql: str) -> int:
    """Index just past the last character of ``sql`` that is code: not whitespace, a ``;`` or a comment."""
    i, n, end = 0, len(sql), 0
    while i < n:
        ch = sql[i]
        if sql.startswith("--", i):
            j = sql.find("\n", i)
            i = n if j < 0 else j + 1
        elif sql.startswith("/*", i):
            j = sql.find("*/", i + 2)
            i = n if j < 0 else j + 2
        elif ch in "'\"`[":
            close = "]" if ch == "[" else ch
            j = i + 1
            while True:
                j = sql.find(close, j)
                if j < 0 or close == "]" or not sql.startswith(close * 2, j):
                    break
                j += 2
            i = n if j < 0 else j + 1
            end = i
        elif ch.isspace() or ch == ";":
            i += 1
        else:
            i += 1
            end = i
    return end


def probe_sql(sql: str) -> str:
    """The LIMIT 0 wrapper of ``sql``: a subquery the outer LIMIT 0 stops before any row (trailing ``;`` and
    comments are dropped; newlines keep a ``--`` comment inside from swallowing the wrapper)."""
    return f"SELECT * FROM (\n{sql[:_code_end(sql)]}\n) LIMIT 0"


class Estimator:
    """Pre-execution estimates for one database (see the module docstring)."""

    def __init__(self, sandbox: Sandbox, catalog: Catalog, calibration: Calibration, token_counter: TokenCounter):
        self.sandbox = sandbox
        self.catalog = catalog
        self.calibration = calibration
        self.token_counter = token_counter
        self._cache: OrderedDict[str, RawEstimate] = OrderedDict()

    # -- public ------------------------------------------------------------------------------------------------------
    def estimate(self, sql: str, *, vm_step_cap: int) -> Estimate:
        """Estimate ``sql``; never raises for bad SQL (``error`` says why and the quantiles are 0)."""
        t0 = time.perf_counter()
        if not isinstance(sql, str):
            return error_estimate(f"the SQL must be a string, got {type(sql).__name__}")
        try:
            self.sandbox.check(sql)
            plan = self.sandbox.explain_plan(sql)
        except (SQLRejected, SQLExecutionError, DatabaseBusy) as exc:
            return error_estimate(str(exc))
        columns, probe_steps, interrupted, err = self._probe(sql, vm_step_cap)
        if err is not None:
            return error_estimate(err, plan=plan, probe_vm_steps=probe_steps, columns=columns)
        raw = self._cache.get(sql)
        if raw is None:
            raw = self.raw_estimate(sql, plan, columns)
            self._cache[sql] = raw
            if len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(sql)
        features = dict(raw.features)
        features["probe_interrupted"] = interrupted
        return self._calibrated(raw, columns, probe_steps, plan, features, interrupted, vm_step_cap, t0)

    def raw_estimate_cached(self, sql: str) -> RawEstimate | None:
        """The uncalibrated estimate of ``sql`` from the last `estimate` call on it (None if not cached)."""
        return self._cache.get(sql)

    def close(self) -> None:
        """Nothing to release: every statement runs on the caller's sandbox (kept for the handle's close())."""
        self._cache.clear()

    # -- steps -------------------------------------------------------------------------------------------------------
    def _probe(self, sql: str, cap: int) -> tuple[tuple[str, ...], int, bool, str | None]:
        """(columns, probe VM steps, interrupted, error) of the LIMIT 0 probe under ``cap``. A subquery renames its
        columns (duplicates become ``x:1``, a column's declared case is lost), so the names come from preparing the
        statement itself (a zero-step run)."""
        rs = None
        try:
            with self.sandbox.stream(sql, vm_step_cap=0) as rs0:
                columns = tuple(rs0.columns)
            with self.sandbox.stream(probe_sql(sql), vm_step_cap=max(int(cap), 0)) as rs:
                for _ in rs:
                    pass
            return columns, int(rs.vm_steps), bool(rs.interrupted), None
        except (SQLRejected, SQLExecutionError, DatabaseBusy) as exc:  # a failure while running still spent its steps
            return (), int(rs.vm_steps) if rs is not None else 0, False, str(exc)

    def program(self, sql: str) -> list:
        """The statement's bytecode listing (``EXPLAIN`` on the sandbox's connection, checked, never run: inside an
        episode's snapshot it takes no lock of its own, so it cannot wait on a writer that waits on the snapshot)."""
        return ops_from_rows(self.sandbox.program(sql))

    def raw_estimate(self, sql: str, plan: tuple[str, ...], columns: tuple[str, ...]) -> RawEstimate:
        """Uncalibrated estimates of a statement that passed the check (deterministic for a given catalog)."""
        analysis = analyze(sql, self.catalog)
        card = analysis.card
        cols = card.cols if len(card.cols) == len(columns) else [ColRef(c, 1.0, DEFAULT_WIDTH) for c in columns]
        header = float(self.token_counter.count(render_header(columns))) if columns else 0.0
        row_tokens = self._row_tokens(cols)
        try:
            steps = self._vm_steps(sql, plan, analysis)
        except Exception as exc:  # noqa: BLE001 — the estimate must never raise; the fallback is recorded
            analysis.notes.append(f"bytecode model failed: {type(exc).__name__}: {exc}")
            steps = 10.0 * sum(t.rows for t in self.catalog.tables) + 20.0
        features = dict(analysis.features)
        features.update(plan_features(plan))
        features["notes"] = len(analysis.notes)
        return RawEstimate(card.rows, card.ub, card.exact, header, row_tokens, steps, shape_of(analysis), features)

    def _row_tokens(self, cols: list[ColRef]) -> float:
        """Mean tokens of one rendered row, from up to `TOKEN_SAMPLE_ROWS` rows built from the columns' samples."""
        if not cols:
            return 0.0
        total = 0
        for i in range(TOKEN_SAMPLE_ROWS):
            row = tuple(c.samples[i % len(c.samples)] if c.samples else "0" * max(int(round(c.width)), 1)
                        for c in cols)
            total += self.token_counter.count(render_row(row))
        return total / TOKEN_SAMPLE_ROWS

    def _vm_steps(self, sql: str, plan: tuple[str, ...], analysis: Analysis) -> float:
        model = ProgramModel(self.program(sql))
        attach_hints(model, plan, analysis, self.catalog)
        return model.expected_steps()

    def _calibrated(self, raw: RawEstimate, columns, probe_steps, plan, features, interrupted, cap, t0) -> Estimate:
        q = self.calibration.quantiles(raw)
        (r50, r95), (t50, t95), (v50, v95) = q["rows"], q["result_tokens"], q["vm_steps"]
        if interrupted:  # the probe alone reached the cap: the statement certainly needs more
            v50, v95 = max(v50, float(cap) + 1), max(v95, float(cap) + 1)
        return Estimate(
            rows=Quantiles(r50, r95),
            result_tokens=Quantiles(t50, t95),
            vm_steps=Quantiles(v50, v95),
            columns=tuple(columns),
            probe_vm_steps=int(probe_steps),
            plan=tuple(plan),
            features=features,
            error=None,
            shape=raw.shape,
            seconds=time.perf_counter() - t0,
        )


# ----------------------------------------------------------------------------------------------------------------------
# plan lines → loop hints


def _find_alias(analysis: Analysis, alias: str, table: str | None, used: set) -> tuple[Scope, str] | None:
    cands = [(s, a) for s in analysis.scopes for a, r in s.rels.items() if a == alias
             and (table is None or r.table is None or r.table.name.lower() == table)]
    for s, a in cands:
        if (id(s), a) not in used:
            return s, a
    return cands[0] if cands else None


def _constraint_sel(scope: Scope, alias: str, cons: list[tuple[str, str]]) -> float:
    rel = scope.rels[alias]
    used: set[int] = set()
    sel = 1.0
    for col, op in cons:
        name = col.lower()
        if name in ("rowid", "_rowid_", "oid") and rel.table is not None:
            ipk = [c.name.lower() for c in rel.table.columns if c.pk == 1 and c.type.upper() == "INTEGER"]
            name = ipk[0] if ipk else name
        kind = "eq" if op == "=" else "range"
        best = None
        for i, c in enumerate(scope.conjuncts):
            if i not in used and (alias, name) in c.cols and c.kind == kind:
                if best is None or c.sel < scope.conjuncts[best].sel:
                    best = i
        if best is not None:
            used.add(best)
            c = scope.conjuncts[best]
            sel *= c.probe_sel if c.probe_sel is not None else c.sel
        else:
            ref = rel.cols.get(name)
            sel *= (1.0 / max(ref.distinct if ref else 10.0, 1.0)) if kind == "eq" else SEL_RANGE
    return sel


def attach_hints(model: ProgramModel, plan: tuple[str, ...], analysis: Analysis, catalog: Catalog) -> None:
    """Match each table access of ``model`` to a plan line (in order, by table) and attach `LoopHint`s."""
    events = model.access_events()
    tables: dict[int, str | None] = {}
    indexes: dict[int, str | None] = {}
    verbs: dict[int, str] = {}
    for addr, _kind, cur in events:
        info = model.cursors.get(cur)
        hit = catalog.by_rootpage(info.rootpage) if info is not None and info.rootpage else None
        tables[addr] = hit[0].lower() if hit else None
        indexes[addr] = hit[1].lower() if hit and hit[1] else None
        verbs[addr] = "SCAN" if model.ops[addr].opcode in ("Rewind", "Last", "Sort", "VFilter") else "SEARCH"
    matched: dict[int, tuple[Scope, str]] = {}
    used_alias: set = set()
    taken: set[int] = set()
    for line in plan:
        parsed = parse_plan_line(line.strip())
        if parsed is None:
            continue
        verb, alias, rest = parsed
        alias = alias.lower()
        auto = "AUTOMATIC" in rest
        m_ix = re.search(r"USING (?:COVERING )?INDEX (\S+)", rest)
        index = m_ix.group(1).lower() if m_ix and not auto else None
        cons = constraints_of(rest) if verb == "SEARCH" else []
        # SQLite says SEARCH for any loop of a MIN()/MAX() query (WHERE_ORDERBY_MIN/MAX), even a plain Rewind scan:
        # a SEARCH line with no key constraint may be either access
        verb_ok = {verb} if verb == "SCAN" or cons else {"SCAN", "SEARCH"}
        for addr, kind, cur in events:
            if addr in taken or verbs[addr] not in verb_ok or auto != (model.cursors[cur].kind == "autoindex"):
                continue
            if index is not None and indexes[addr] != index:
                continue
            hit = _find_alias(analysis, alias, tables[addr], used_alias)
            if hit is None:
                continue
            scope, a = hit
            rel = scope.rels[a]
            if not auto and rel.table is not None and tables[addr] != rel.table.name.lower():
                continue
            taken.add(addr)
            used_alias.add((id(scope), a))
            matched[addr] = (scope, a)
            n = rel.rows * _constraint_sel(scope, a, cons) if cons else rel.rows
            if kind == "lookup":
                n = min(1.0, n)
            model.hints[addr] = LoopHint(n=n, pass_rate=1.0)
            break
    # pass rates: rows surviving this level / (rows entering × n)
    for addr, (scope, a) in matched.items():
        prefix = set()
        for other, (s2, a2) in matched.items():
            if s2 is not scope or other == addr:
                continue
            lp = model.loop_opened_at(other)
            if lp is not None and lp.head <= addr <= lp.tail:
                prefix.add(a2)
            elif lp is None and other < addr:
                inner = model.innermost(other)
                if inner is None or inner.head <= addr <= inner.tail:
                    prefix.add(a2)
        before = scope.rows_of(frozenset(prefix))
        after = scope.rows_of(frozenset(prefix | {a}))
        h = model.hints[addr]
        denom = before * max(h.n, 1e-12)
        rate = after / denom if denom > 0 else 1.0
        model.hints[addr] = LoopHint(n=h.n, pass_rate=min(max(rate, 0.0), 1.0))
    # accesses no plan line claimed (e.g. the scan that fills an automatic index): whole table, no filter
    for addr, kind, cur in events:
        if addr not in model.hints:
            t = catalog.table(tables[addr]) if tables[addr] else None
            n = float(t.rows) if t is not None else model.default_rows
            model.hints[addr] = LoopHint(n=min(n, 1.0) if kind == "lookup" else n, pass_rate=1.0)
    for cur, info in model.cursors.items():
        hit = catalog.by_rootpage(info.rootpage) if info.rootpage else None
        t = catalog.table(hit[0]) if hit else None
        if t is not None:
            model.table_rows[cur] = float(t.rows)
    ratios = analysis.group_ratios or [0.5]
    for i, addr in enumerate(model.group_jumps()):
        model.group_ratios[addr] = min(max(ratios[min(i, len(ratios) - 1)], 0.0), 1.0)
    model.default_rows = max(analysis.card.rows, 1.0) if math.isfinite(analysis.card.rows) else 100.0
