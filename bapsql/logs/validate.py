"""Validation of trajectory-log rows against the versioned schema (`bapsql.logs.schema`).

`validate_row(table, row, run_name)` is the definition: a complete, checked copy of a row, or `LogRowError` naming
the offending column (unknown column, missing or null non-nullable column, wrong type, integer out of range,
``failure``/``action`` outside its vocabulary, a method/budget that is not a safe path name, a foreign ``run``).
Numpy scalars are accepted and converted, ints are accepted (as floats) in float columns.

`RowPacker` is how the writer applies it fast, accepting and rejecting exactly what `validate_row` does
(property-tested) and raising its errors.
"""

from __future__ import annotations

import numbers
import operator
import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np
import pyarrow as pa

from bapsql.errors import LogRowError
from bapsql.logs.schema import (
    ACTIONS,
    EPISODES_SCHEMA,
    FAILURE_KINDS,
    PARTITION_COLUMNS,
    SERVED_FAILURE_KINDS,
    SCHEMA_VERSION,
    TURNS_SCHEMA,
)

TABLES: dict[str, pa.Schema] = {"episodes": EPISODES_SCHEMA, "turns": TURNS_SCHEMA}
SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+@-]*$")
_VOCABULARIES = {"failure": FAILURE_KINDS + SERVED_FAILURE_KINDS, "action": ACTIONS}
_INT_BOUNDS = {pa.int16(): 2**15, pa.int32(): 2**31, pa.int64(): 2**63}


@dataclass(frozen=True)
class _Column:
    """What `validate_row` checks for one column (precomputed once per schema: validation runs per row)."""

    name: str
    kind: str  # bool | int | float | str | other
    nullable: bool
    type: pa.DataType
    bound: int = 2**63
    vocabulary: tuple[str, ...] | None = None
    partition: bool = False


def _columns(schema: pa.Schema) -> tuple[_Column, ...]:
    out = []
    for f in schema:
        tp = f.type
        kind = ("bool" if pa.types.is_boolean(tp) else "int" if pa.types.is_integer(tp) else
                "float" if pa.types.is_floating(tp) else "str" if pa.types.is_string(tp) else "other")
        out.append(_Column(f.name, kind, f.nullable, tp, _INT_BOUNDS.get(tp, 2**63), _VOCABULARIES.get(f.name),
                           f.name in PARTITION_COLUMNS))
    return tuple(out)


_COLUMNS = {table: _columns(schema) for table, schema in TABLES.items()}
_NAMES = {table: frozenset(schema.names) for table, schema in TABLES.items()}


def _check_value(table: str, col: _Column, value: Any) -> Any:
    """``value`` if it fits ``col`` (ints for integer columns, numbers for floats, ...), else `LogRowError`."""
    if value is None:
        if not col.nullable:
            raise LogRowError(f"{table} row: column {col.name!r} is not nullable but got None")
        return None
    vt, kind = type(value), col.kind
    if kind == "str":
        ok = vt is str or isinstance(value, str)
    elif kind == "float":
        ok = vt is float or (isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_)))
        value = float(value) if ok else value
    elif kind == "int":
        ok = vt is int or (isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_)))
        if ok:
            value = int(value)
            if not -col.bound <= value < col.bound:
                raise LogRowError(f"{table} row: column {col.name!r} value {value} does not fit {col.type}")
    elif kind == "bool":
        ok = vt is bool or isinstance(value, np.bool_)
        value = bool(value) if ok else value
    else:
        ok = True
    if not ok:
        raise LogRowError(f"{table} row: column {col.name!r} expects {col.type}, got {vt.__name__} {value!r:.80}")
    if col.vocabulary is not None and value not in col.vocabulary:
        raise LogRowError(f"{table} row: column {col.name!r} value {value!r} is not one of {list(col.vocabulary)}")
    if col.partition and not SAFE_NAME.match(value):
        raise LogRowError(f"{table} row: column {col.name!r} value {value!r} must be a safe path name "
                          "(letters, digits, _ . + @ -; starting with a letter or digit)")
    return value


_REQUIRED = {table: frozenset(c.name for c in cols if not c.nullable) for table, cols in _COLUMNS.items()}


def validate_row(table: str, row: Mapping[str, Any], run_name: str | None = None) -> dict[str, Any]:
    """A complete, checked copy of ``row`` for ``table`` ("episodes" or "turns"), or `LogRowError` naming the
    offending column. Fills ``schema_version`` and (when ``run_name`` is given) ``run``; absent nullable columns are
    None."""
    names = _NAMES[table]
    if not names.issuperset(row):
        unknown = [k for k in row if k not in names]
        raise LogRowError(f"{table} row: unknown column(s) {sorted(unknown)}; the {table} schema v{SCHEMA_VERSION} "
                          f"has {TABLES[table].names}")
    if "schema_version" not in row or (run_name is not None and "run" not in row):
        row = {"schema_version": SCHEMA_VERSION, **({"run": run_name} if run_name is not None else {}), **row}
    if run_name is not None and row["run"] != run_name:
        raise LogRowError(f"{table} row: column 'run' is {row['run']!r} but this writer writes run {run_name!r}")
    if not row.keys() >= _REQUIRED[table]:
        missing = [c.name for c in _COLUMNS[table] if not c.nullable and c.name not in row]
        raise LogRowError(f"{table} row: missing non-nullable column(s) {missing}")
    return {col.name: _check_value(table, col, row.get(col.name)) for col in _COLUMNS[table]}


class RowPacker:
    """Validates rows of one table as `validate_row` does and packs each into a value tuple in schema order.

    Fast path, a handful of C-level calls per row instead of one Python check per column: read the values with
    ``map(row.get, ...)``, take their exact types, and look that type signature up among the signatures already
    proven valid (every value exactly the builtin type of its column, or None where the column is nullable). A known
    signature leaves the range of its integer values (``bit_length`` at most 15/31/63 for int16/32/64), the
    vocabulary and the ``run`` name to check. Anything else (a new signature, numpy scalars, an int in a float
    column, an int at or past a bound, a bad value) goes through `validate_row`, which converts it or raises its
    `LogRowError`.
    """

    _FAST = {"bool": bool, "int": int, "float": float, "str": str}

    def __init__(self, table: str, run_name: str):
        cols = _COLUMNS[table]
        self.table, self.run_name, self._cols = table, run_name, cols
        self.names = tuple(c.name for c in cols)
        self._names = _NAMES[table]
        self._defaults = tuple(SCHEMA_VERSION if c.name == "schema_version" else run_name if c.name == "run" else None
                               for c in cols)
        self._run = self.names.index("run")
        self._allowed = tuple(frozenset({self._FAST.get(c.kind, object)} | ({type(None)} if c.nullable else set()))
                              for c in cols)
        # per proven signature: (getter of its non-null integer values, their largest allowed bit lengths)
        self._good: dict[tuple[type, ...], tuple[Callable[[tuple], tuple], tuple[int, ...]]] = {}
        (self._vocab_at, self._vocab), = [(i, frozenset(c.vocabulary)) for i, c in enumerate(cols) if c.vocabulary]
        self.method_at, self.budget_at = (self.names.index(n) for n in PARTITION_COLUMNS)
        self._partitions: set[tuple[str, str, str]] = set()  # partitions whose names passed the safe-path check

    def _learn(self, sig: tuple[type, ...]) -> tuple[Callable[[tuple], tuple], tuple[int, ...]] | None:
        if not all(t in allowed for t, allowed in zip(sig, self._allowed)):
            return None
        at = [i for i, (c, t) in enumerate(zip(self._cols, sig)) if c.kind == "int" and t is int]
        getter = (operator.itemgetter(*at) if len(at) > 1
                  else (lambda values, at=tuple(at): tuple(values[i] for i in at)))
        self._good[sig] = fast = (getter, tuple(self._cols[i].bound.bit_length() - 1 for i in at))
        return fast

    def pack(self, row: Mapping[str, Any]) -> tuple[tuple[str, str, str], tuple]:
        """(partition key ``(table, method, budget)``, the validated values of ``row`` in schema order), or
        `LogRowError` (see `validate_row`)."""
        values = None
        if self._names.issuperset(row):
            values = tuple(map(row.get, self.names, self._defaults))
            sig = tuple(map(type, values))
            fast = self._good.get(sig) or self._learn(sig)
            if not (fast is not None and values[self._run] == self.run_name and values[self._vocab_at] in self._vocab
                    and all(map(operator.le, map(int.bit_length, fast[0](values)), fast[1]))):
                values = None
        if values is None:
            values = tuple(validate_row(self.table, row, self.run_name).values())
        key = (self.table, values[self.method_at], values[self.budget_at])
        if key not in self._partitions:  # its names become a path: checked once per partition
            if not all(map(SAFE_NAME.match, key[1:])):
                validate_row(self.table, row, self.run_name)  # raises the safe-path-name error
            self._partitions.add(key)
        return key, values
