"""The structure of a prepared statement's SQLite program, as `bapsql.db.bytecode` (the expected VM-steps model) reads
it, and the ``EXPLAIN QUERY PLAN`` lines the caller matches to it.

- `Op` / `ops_from_rows`: one ``EXPLAIN`` row; the opcode classes (`LOOP_NEXT`, `OPENERS`, `JUMPS`, ...);
- `Program`: the cursors and what they read, the loops closed by a backward ``Next``/``Prev``/``SorterNext``/``VNext``
  (their openers and kinds: scan, search, sorter, ephemeral, vtab), the single-row probes (``SeekRowid``/``NotExists``,
  unique index seeks, with the range check that is their "not found" exit), the ``Integer`` constants (LIMIT
  counters), the GROUP BY jumps and the basic blocks: a new block starts at 0, at every jump target and after every op
  that may branch;
- `parse_plan_line` / `constraints_of`: the table access and the ``(a=? AND b>?)`` constraints of a plan line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

LOOP_NEXT = frozenset({"Next", "Prev", "SorterNext", "VNext"})
OPENERS = {"Rewind": "scan", "Last": "scan", "Sort": "scan", "SorterSort": "sorter", "VFilter": "vtab",
           "SeekGE": "search", "SeekGT": "search", "SeekLE": "search", "SeekLT": "search"}
LOOKUPS = frozenset({"SeekRowid", "NotExists"})
COMPARES = frozenset({"Eq", "Ne", "Lt", "Le", "Gt", "Ge"})
RANGE_EXIT = frozenset({"IdxGT", "IdxGE", "IdxLT", "IdxLE"})
FILTERS = frozenset({"Eq", "Ne", "Lt", "Le", "Gt", "Ge", "If", "IfNot", "IsNull", "NotNull", "Found", "NotFound",
                     "Filter", "IsType", "IfNoHope", "NoConflict", "ElseEq"})
# opcodes whose P2 is a jump target (taken conditionally unless listed in UNCONDITIONAL)
JUMPS = frozenset({"Goto", "Gosub", "Yield", "If", "IfNot", "IsNull", "NotNull", "Eq", "Ne", "Lt", "Le", "Gt", "Ge",
                   "ElseEq", "Once", "IfPos", "IfNotZero", "DecrJumpZero", "IfNotOpen", "InitCoroutine", "Rewind",
                   "Last", "Sort", "SorterSort", "Next", "Prev", "SorterNext", "VNext", "VFilter", "SeekLT", "SeekLE",
                   "SeekGE", "SeekGT", "SeekRowid", "NotExists", "Found", "NotFound", "NoConflict", "IfNoHope",
                   "IdxGT", "IdxGE", "IdxLT", "IdxLE", "RowSetRead", "RowSetTest", "Filter", "IfNullRow", "IsType",
                   "MustBeInt", "HaltIfNull", "IfSmaller", "SequenceTest", "IfEmpty", "IfSizeBetween", "Init",
                   "SorterCompare", "FkIfZero", "Program", "SeekScan"})
UNCONDITIONAL = frozenset({"Goto", "Init", "Gosub", "InitCoroutine"})


@dataclass(frozen=True)
class Op:
    addr: int
    opcode: str
    p1: int
    p2: int
    p3: int
    p4: object
    p5: int


def ops_from_rows(rows) -> list[Op]:
    """`Op`s from apsw ``explain=1`` rows (addr, opcode, p1, p2, p3, p4, p5, comment)."""
    return [Op(int(r[0]), str(r[1]), int(r[2] or 0), int(r[3] or 0), int(r[4] or 0), r[5], int(r[6] or 0))
            for r in rows]


@dataclass
class Loop:
    """A loop closed by a backward ``Next``/``Prev``/``SorterNext``/``VNext`` on ``cursor``."""

    head: int  # first op of the body (target of the back jump)
    tail: int  # address of the Next/Prev op
    cursor: int
    kind: str  # scan | search | sorter | vtab | ephemeral | other
    opener: int | None = None
    lookups: list[int] = field(default_factory=list)  # single-row probes in the body (not in nested loops)


@dataclass(frozen=True)
class CursorInfo:
    kind: str  # table | index | ephemeral | autoindex | sorter | pseudo | vtab
    rootpage: int = 0


class Program:
    """The structure of one program listing: its ``cursors`` (by cursor number), ``loops``, single-row probes
    (``lookups``, by address) and basic blocks."""

    def __init__(self, ops: list[Op]):
        self.ops = ops
        self.n_ops = len(ops)
        self.cursors: dict[int, CursorInfo] = {}
        for op in ops:
            if op.opcode in ("OpenRead", "ReopenIdx"):
                kind = "index" if isinstance(op.p4, str) and op.p4.startswith("k(") else "table"
                self.cursors[op.p1] = CursorInfo(kind, op.p2)
            elif op.opcode == "OpenAutoindex":
                self.cursors[op.p1] = CursorInfo("autoindex")
            elif op.opcode in ("OpenEphemeral", "OpenDup"):
                self.cursors.setdefault(op.p1, CursorInfo("ephemeral"))
            elif op.opcode == "SorterOpen":
                self.cursors[op.p1] = CursorInfo("sorter")
            elif op.opcode == "OpenPseudo":
                self.cursors[op.p1] = CursorInfo("pseudo")
            elif op.opcode == "VOpen":
                self.cursors[op.p1] = CursorInfo("vtab")
        self.loops = self._find_loops()
        self._blocks()
        self.const_int: dict[int, int] = {}
        for op in ops:
            if op.opcode == "Integer":
                self.const_int[op.p2] = op.p1 if op.p2 not in self.const_int else self.const_int[op.p2]

    # -- structure ---------------------------------------------------------------------------------------------------
    def _find_loops(self) -> list[Loop]:
        loops = []
        for op in self.ops:
            if op.opcode in LOOP_NEXT and op.p2 <= op.addr:
                opener = None
                for a in range(op.p2 - 1, -1, -1):
                    o = self.ops[a]
                    if o.p1 == op.p1 and o.opcode in OPENERS and o.p2 > op.addr:
                        opener = a
                        break
                kind = OPENERS.get(self.ops[opener].opcode, "other") if opener is not None else "other"
                ck = self.cursors.get(op.p1, CursorInfo("table")).kind
                if kind == "scan" and ck in ("ephemeral", "autoindex"):
                    kind = "ephemeral"
                if kind == "search" and not any(self.ops[a].opcode in RANGE_EXIT and self.ops[a].p1 == op.p1
                                                for a in range(op.p2, op.addr)):
                    kind = "search_nocheck" if ck not in ("table",) else "search_rowid"
                loops.append(Loop(op.p2, op.addr, op.p1, kind, opener))
        loops.sort(key=lambda lp: (lp.head, -lp.tail))
        self.loops = loops
        self._inner: list[Loop | None] = [None] * self.n_ops
        for lp in sorted(loops, key=lambda x: x.head - x.tail):  # widest first, narrower loops overwrite
            for a in range(lp.head, min(lp.tail + 1, self.n_ops)):
                self._inner[a] = lp
        self._consumed = {op.p1 for op in self.ops if op.opcode == "Yield" and op.p2}  # coroutines with consumers
        self._by_tail = {lp.tail: lp for lp in loops}
        self._by_opener = {lp.opener: lp for lp in loops if lp.opener is not None}
        # single-row probes: rowid seeks, and index seeks that open no loop (unique-key equality); the range check
        # that follows such a seek is its "not found" exit
        self.lookups: set[int] = set()
        self._found_check: dict[int, int] = {}
        for op in self.ops:
            kind = self.cursors.get(op.p1, CursorInfo("x")).kind
            if op.opcode in LOOKUPS and kind == "table":
                self.lookups.add(op.addr)
            elif op.opcode in OPENERS and OPENERS[op.opcode] == "search" and op.addr not in self._by_opener \
                    and kind in ("table", "index", "autoindex"):
                self.lookups.add(op.addr)
                for b in range(op.addr + 1, min(op.addr + 4, self.n_ops)):
                    if self.ops[b].opcode in RANGE_EXIT and self.ops[b].p1 == op.p1:
                        self._found_check[b] = op.addr
                        break
        for a in sorted(self.lookups):
            inner = self.innermost(a)
            if inner is not None and inner.cursor != self.ops[a].p1:
                inner.lookups.append(a)
        return loops

    def loop_opened_at(self, addr: int) -> Loop | None:
        """The loop whose opener (``Rewind``/``Seek*``/``SorterSort``...) is at ``addr``."""
        return self._by_opener.get(addr)

    def innermost(self, addr: int) -> Loop | None:
        """The innermost loop whose body [head, tail] contains ``addr``."""
        return self._inner[addr] if 0 <= addr < self.n_ops else None

    def group_jumps(self) -> list[int]:
        """Addresses of the three-way ``Jump`` after ``Compare`` that starts a new GROUP BY group, in order."""
        return [op.addr for op in self.ops if op.opcode == "Jump" and op.p1 == op.p3 and op.addr > 0
                and self.ops[op.addr - 1].opcode == "Compare"]

    def access_events(self) -> list[tuple[int, str, int]]:
        """(address, 'loop' | 'lookup', cursor) of every table/index/autoindex access, in address order."""
        out = []
        for lp in self.loops:
            if lp.opener is not None and self.cursors.get(lp.cursor, CursorInfo("x")).kind in ("table", "index",
                                                                                                 "autoindex"):
                out.append((lp.opener, "loop", lp.cursor))
        for a in self.lookups:
            out.append((a, "lookup", self.ops[a].p1))
        return sorted(out)

    def _blocks(self) -> None:
        """Basic blocks: a new block starts at 0, at every jump target and after every op that may branch."""
        enders = JUMPS | {"Jump", "Return", "Halt", "EndCoroutine", "Yield"}
        leaders = {0}
        for op in self.ops:
            if op.opcode in enders:
                leaders.add(op.addr + 1)
                if op.opcode in JUMPS and 0 <= op.p2 < self.n_ops:
                    leaders.add(op.p2)
                if op.opcode == "Jump":
                    leaders.update(x for x in (op.p1, op.p2, op.p3) if 0 <= x < self.n_ops)
                if op.opcode == "InitCoroutine" and 0 <= op.p3 < self.n_ops:
                    leaders.add(op.p3)
        starts = sorted(a for a in leaders if a < self.n_ops)
        self._block_end = {}
        for i, a in enumerate(starts):
            self._block_end[a] = (starts[i + 1] if i + 1 < len(starts) else self.n_ops) - 1
        self._block_of = [0] * self.n_ops
        for a in starts:
            for b in range(a, self._block_end[a] + 1):
                self._block_of[b] = a


_EQP = re.compile(r"^\s*(SCAN|SEARCH) (\S+)(.*)$")


def parse_plan_line(line: str) -> tuple[str, str, str] | None:
    """('SCAN' | 'SEARCH', alias, rest) of a plan line that accesses a table, else None."""
    m = _EQP.match(line)
    if not m or m.group(2) == "CONSTANT":
        return None
    return m.group(1), m.group(2), m.group(3)


def constraints_of(rest: str) -> list[tuple[str, str]]:
    """(column, operator) pairs of a SEARCH line's ``(a=? AND b>?)`` suffix."""
    m = re.search(r"\(([^()]*)\)\s*$", rest)
    if not m:
        return []
    out = []
    for part in m.group(1).split(" AND "):
        mm = re.match(r"^\s*(.+?)\s*(=|>=|<=|>|<)\s*\?\s*$", part)
        if mm:
            out.append((mm.group(1), mm.group(2)))
    return out
