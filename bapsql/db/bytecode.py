"""Expected SQLite VM steps of a prepared statement, from its bytecode (``EXPLAIN``) and cardinality hints.

SQLite's ``SQLITE_STMTSTATUS_VM_STEP`` counts every opcode executed. This module takes the program's basic blocks and
treats them as an absorbing Markov chain: every conditional jump gets a probability, the expected visits solve
``(I − Pᵀ) v = e_entry`` and the expected step count is ``Σ_b v_b · len(b)``. Subroutines (``Gosub`` /
``Return``) and coroutines (``InitCoroutine`` / ``Yield``) are solved as their own chains (once per pass) and charged
per call, so call/return pairs stay matched; a coroutine is charged only as far as its consumers reach it (a merge
whose first side is empty never runs the second). The program's structure (ops, opcode classes, cursors, loops,
single-row probes, basic blocks) and the plan-line parsers live in `bapsql.db.program`; `ProgramModel` extends its
`Program` with the jump probabilities and the solve.

Jump probabilities come from the loop structure plus the caller's hints (`LoopHint`, keyed by the address of a
loop's opener or of a single-row probe):
- a loop closed by ``Next``/``Prev`` iterates ``n`` times per entry: ``P(back) = 1 − 1/n``; a search loop (opened by a
  ``Seek*``) leaves through its range check with probability ``1/(n + 1)`` instead; an opener skips an empty loop
  with probability ``max(0, 1 − n)``;
- single-row probes (``SeekRowid``/``NotExists``, unique index seeks) find their row with probability ``min(n, 1)``;
- ``n`` for tables and indexes comes from the plan line the caller matched to the access; for sorters, ephemeral
  tables and coroutines it is the expected number of rows inserted / yielded, found by repeating the solve until
  the step count settles (at most 5 passes);
- comparisons inside a loop body that jump to the loop's ``Next`` are its filters: with pass rate p (the hint's,
  times the pass rates of the probes in the body) and m such jumps, each jumps with probability ``1 − p^(1/m)``;
- ``Once`` fires once, ``DecrJumpZero`` / ``IfNotZero`` follow their LIMIT constant, ``IfEmpty`` the table size, the
  GROUP BY ``Jump`` (and its "first row of the group" ``If``) the hinted group ratio; exits from scans (LIMIT,
  abort flags) are rare; any other conditional jump is a coin flip.
Exact for straight-line code and for loops with exact counts (full scans, sorts); elsewhere an estimate that the
calibration widens. Costs about 1 ms for a 50-op program.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bapsql.db.program import (COMPARES, FILTERS, JUMPS, LOOKUPS, LOOP_NEXT, OPENERS, RANGE_EXIT, CursorInfo, Loop, Op,
                               Program)

MAX_N = 1e12


@dataclass(frozen=True)
class LoopHint:
    """What the cardinality model says about one table access: iterations per entry (``n``; for a rowid lookup the
    probability that the row exists) and the share of those rows that pass the filters evaluated in its body."""

    n: float
    pass_rate: float = 1.0


class ProgramModel(Program):
    """The expected-steps model of one program. ``cursors`` and ``loops`` are exposed so the caller can attach
    `LoopHint`s (``hints[addr_of_opener_or_lookup]``) before calling `expected_steps`."""

    def __init__(self, ops: list[Op]):
        super().__init__(ops)
        self.hints: dict[int, LoopHint] = {}
        self.group_ratios: dict[int, float] = {}  # address of a GROUP BY's three-way Jump -> P(new group)
        self.table_rows: dict[int, float] = {}  # cursor -> rows of the table it reads (for IfEmpty)
        self.default_rows = 100.0

    # -- probabilities ------------------------------------------------------------------------------------------------
    def _loop_n(self, lp: Loop, state: dict) -> float:
        if lp.opener is not None and lp.opener in self.hints:
            return self.hints[lp.opener].n
        if lp.kind in ("sorter", "ephemeral") or self.cursors.get(lp.cursor, CursorInfo("x")).kind in (
                "sorter", "ephemeral", "autoindex"):
            return state["rows"].get(lp.cursor, 1.0)
        if lp.kind == "vtab":
            return 10.0
        return self.default_rows

    def _succ(self, op: Op, state: dict, ctx: tuple) -> list[tuple[int, float]]:
        oc, nxt = op.opcode, op.addr + 1
        if oc in ("Halt",):
            return []
        if oc == "Return":
            if ctx[0] == "sub" and (op.p1 == ctx[2] or op.p3 == 0):
                return []
            return [(nxt, 1.0)] if op.p3 == 1 else []
        if oc == "EndCoroutine":
            return [] if ctx[0] == "co" else [(nxt, 1.0)]
        if oc == "Yield":
            if ctx[0] == "co" and op.p1 == ctx[2]:
                return [(nxt, 1.0)]
            rows = state["yields"].get(op.p1, 1.0)
            p = 1.0 / (rows + 1.0)
            return [(nxt, 1 - p), (op.p2, p)] if op.p2 else [(nxt, 1.0)]
        if oc in ("Goto", "Init"):
            return [(op.p2, 1.0)]
        if oc == "Gosub":
            return [(nxt, 1.0)]
        if oc == "InitCoroutine":
            return [(op.p2 if op.p2 else nxt, 1.0)]
        if oc == "Jump":
            g = self.group_ratios.get(op.addr, 0.5)
            if op.p1 == op.p3:
                return [(op.p1, g), (op.p2, 1 - g)]
            return [(op.p1, 1 / 3), (op.p2, 1 / 3), (op.p3, 1 / 3)]
        if oc not in JUMPS or op.p2 <= 0 or op.p2 >= self.n_ops + 1:
            return [(nxt, 1.0)]
        p = self._p_jump(op, state)
        p = min(max(p, 0.0), 1.0)
        return [(op.p2, p), (nxt, 1 - p)]

    def _p_jump(self, op: Op, state: dict) -> float:
        oc, visits = op.opcode, state["visits"]
        lp = self.innermost(op.addr)
        if oc in LOOP_NEXT and op.p2 <= op.addr:
            loop = self._by_tail.get(op.addr)
            if loop is None:
                return 0.5
            if loop.kind == "search":
                return 1.0
            n = max(self._loop_n(loop, state), 1.0)
            return 1.0 - 1.0 / n
        if oc in OPENERS:
            loop = self._by_opener.get(op.addr)
            if loop is None:
                return 0.0
            if loop.kind == "search":
                return 0.0
            n = self._loop_n(loop, state)
            return max(0.0, 1.0 - n) if n < 1 else 0.0
        if op.addr in self._found_check:
            h = self.hints.get(self._found_check[op.addr])
            return 1.0 - min(1.0, h.n) if h is not None else 0.0
        if oc in RANGE_EXIT and lp is not None and lp.cursor == op.p1:
            return 1.0 / (self._loop_n(lp, state) + 1.0)
        if op.addr in self.lookups:
            if oc not in LOOKUPS:
                return 0.0  # an index seek positions the cursor; its range check says "not found"
            h = self.hints.get(op.addr)
            return 1.0 - min(1.0, h.n) if h is not None else 0.0
        if oc == "IfEmpty":
            n = self.table_rows.get(op.p1)
            return 0.5 if n is None else (1.0 if n == 0 else 0.0)
        if oc == "Once":
            v = visits.get(op.addr, 1.0)
            return 1.0 - 1.0 / max(v, 1.0)
        if oc == "DecrJumpZero":
            lim = self.const_int.get(op.p1, 0)
            return 1.0 / lim if lim > 0 else 0.0
        if oc == "IfNotZero":
            lim = self.const_int.get(op.p1, 0)
            v = max(visits.get(op.addr, 1.0), 1.0)
            return min(1.0, lim / v) if lim > 0 else 0.0
        if oc in ("MustBeInt", "IfNullRow", "HaltIfNull", "IfNotOpen"):
            return 0.0
        if lp is not None and op.p2 > lp.tail:  # leaves the innermost loop
            if lp.kind in ("search", "search_rowid", "search_nocheck") and oc in RANGE_EXIT | COMPARES:
                return 1.0 / (self._loop_n(lp, state) + 1.0)  # the end of the searched key range
            return 0.0 if oc == "IfPos" else 0.02  # LIMIT / abort flags: rare
        if oc == "IfPos":
            return 0.9
        if oc == "If" and lp is not None and lp.kind == "sorter":  # GROUP BY's "not the group's first row" flag
            g = next((r for a, r in self.group_ratios.items() if lp.head <= a <= lp.tail), None)
            if g is not None:
                return 1.0 - g
        if lp is not None and oc in FILTERS and lp.head <= op.p2 <= lp.tail:
            m = state["filters"].get(id(lp), 1)
            pr = self._pass_rate(lp)
            return 1.0 - pr ** (1.0 / max(m, 1))
        return 0.5

    def _pass_rate(self, lp: Loop) -> float:
        pr = 1.0
        if lp.opener is not None and lp.opener in self.hints:
            pr = self.hints[lp.opener].pass_rate
        for a in lp.lookups:
            if a in self.hints:
                pr *= self.hints[a].pass_rate
        return pr

    # -- solving -------------------------------------------------------------------------------------------------------
    def _chain(self, entry: int, ctx: tuple, state: dict) -> dict[int, float]:
        """Expected visits of every op reachable from ``entry`` in context ``ctx`` (main / sub / co), solved on
        basic blocks: ``(I − Pᵀ) v = e_entry``."""
        start = self._block_of[entry]
        if start != entry:  # entering mid-block (never produced by SQLite, but stay correct)
            self._block_end[entry] = self._block_end[start]
            start = entry
        order: list[int] = []
        seen = {start}
        stack = [start]
        succ: dict[int, list[tuple[int, float]]] = {}
        while stack:
            b = stack.pop()
            order.append(b)
            last = self.ops[self._block_end[b]]
            out = [(self._block_of[t], p) for t, p in self._succ(last, state, ctx) if 0 <= t < self.n_ops and p > 0]
            succ[b] = out
            for t, _ in out:
                if t not in seen:
                    seen.add(t)
                    stack.append(t)
        idx = {b: i for i, b in enumerate(order)}
        m = len(order)
        mat = np.eye(m)
        for b, out in succ.items():
            for t, p in out:
                mat[idx[t], idx[b]] -= p
        rhs = np.zeros(m)
        rhs[0] = 1.0
        try:
            v = np.linalg.solve(mat, rhs)
        except np.linalg.LinAlgError:
            v = np.linalg.lstsq(mat, rhs, rcond=None)[0]
        visits: dict[int, float] = {}
        for b in order:
            vb = max(float(v[idx[b]]), 0.0)
            for a in range(b, self._block_end[b] + 1):
                visits[a] = vb
        return visits

    def _calls(self, visits: dict[int, float]) -> list[tuple[int, tuple, float]]:
        """Nested executions started from a context: (entry, context, times). A subroutine runs at each ``Gosub``
        visit; a coroutine once per ``InitCoroutine`` visit, but only as far as its consumers' ``Yield``s are
        reached at all (a merge that stops early never runs its other side)."""
        consumer: dict[int, float] = {}
        for a, v in visits.items():
            op = self.ops[a]
            if op.opcode == "Yield" and op.p2:
                consumer[op.p1] = consumer.get(op.p1, 0.0) + v
        out = []
        inits: dict[int, tuple[int, float]] = {}  # register -> (body entry, most visits of one of its InitCoroutines)
        for a, v in visits.items():
            op = self.ops[a]
            if v <= 0:
                continue
            if op.opcode == "Gosub":
                out.append((op.p2, ("sub", op.p2, op.p1), v))
            elif op.opcode == "InitCoroutine" and op.p3:
                # a CTE coroutine is declared once (jumping over its body) and re-initialized before use: a run
                # per initialization, not per InitCoroutine op
                inits[op.p1] = (op.p3, max(v, inits.get(op.p1, (0, 0.0))[1]))
        for reg, (body, v) in inits.items():
            runs = min(v, consumer.get(reg, 0.0)) if reg in self._consumed else v
            if runs > 0:
                out.append((body, ("co", body, reg), runs))
        return out

    def _run(self, entry: int, ctx: tuple, state: dict, factor: float, totals: dict, memo: dict,
             depth: int = 0) -> float:
        """Steps of one execution of the context starting at ``entry`` (nested calls included); adds factor ×
        visits into ``totals``. Each context's chain is solved once per pass (``memo``)."""
        if ctx not in memo:
            memo[ctx] = self._chain(entry, ctx, state)
        visits = memo[ctx]
        for a, v in visits.items():
            totals[a] = totals.get(a, 0.0) + factor * v
        steps = sum(visits.values())
        if depth <= 8:
            for sub_entry, sub_ctx, times in self._calls(visits):
                steps += times * self._run(sub_entry, sub_ctx, state, factor * times, totals, memo, depth + 1)
        return steps

    def expected_steps(self, passes: int = 5) -> float:
        """Expected VM steps of one full execution (hints must be attached first). Row counts of sorters,
        ephemeral tables and coroutines feed back into the chain: passes repeat until the step count moves by less
        than 0.1% (at most ``passes``)."""
        state: dict = {"visits": {}, "rows": {}, "yields": {}, "filters": {}}
        for lp in self.loops:
            state["filters"][id(lp)] = sum(
                1 for a in range(lp.head, lp.tail) if self.ops[a].opcode in FILTERS
                and lp.head <= self.ops[a].p2 <= lp.tail and self.innermost(a) is lp)
        steps = prev = -1.0
        dynamic = any(op.opcode in ("SorterSort", "Once", "IfNotZero", "InitCoroutine", "OpenEphemeral",
                                    "OpenAutoindex") for op in self.ops)
        for _ in range(passes if dynamic else 1):
            totals: dict[int, float] = {}
            steps = self._run(0, ("main", 0, -1), state, 1.0, totals, {})
            self._update(state, totals)
            if abs(steps - prev) <= 1e-3 * max(steps, 1.0):
                break
            prev = steps
        return steps

    def _update(self, state: dict, totals: dict[int, float]) -> None:
        inserts: dict[int, float] = {}
        fills: dict[int, float] = {}
        yields: dict[int, float] = {}
        co_regs = {op.p1 for op in self.ops if op.opcode == "InitCoroutine" and op.p3}
        for a, v in totals.items():
            op = self.ops[a]
            if op.opcode in ("SorterInsert", "IdxInsert", "Insert"):
                inserts[op.p1] = inserts.get(op.p1, 0.0) + v
            elif op.opcode == "Delete" and self.cursors.get(op.p1, CursorInfo("x")).kind == "ephemeral":
                inserts[op.p1] = inserts.get(op.p1, 0.0) - v
            elif op.opcode in ("OpenEphemeral", "SorterOpen", "OpenAutoindex", "ResetSorter"):
                fills[op.p1] = fills.get(op.p1, 0.0) + v
            elif op.opcode == "Yield" and op.p1 in co_regs and not op.p2:  # a row handed out by the coroutine
                yields[op.p1] = yields.get(op.p1, 0.0) + v
        for c, info in self.cursors.items():
            if info.kind in ("sorter", "ephemeral", "autoindex"):
                inserts.setdefault(c, 0.0)
        for r in co_regs:
            yields.setdefault(r, 0.0)
        runs: dict[int, float] = {}
        for op in self.ops:
            if op.opcode == "InitCoroutine" and op.p3:
                runs[op.p1] = max(runs.get(op.p1, 1e-9), totals.get(op.addr, 0.0))
        state["rows"] = {c: min(max(v, 0.0) / max(fills.get(c, 1.0), 1.0), MAX_N) for c, v in inserts.items()}
        state["yields"] = {r: min(v / runs.get(r, 1.0), MAX_N) for r, v in yields.items()}
        state["visits"] = totals
