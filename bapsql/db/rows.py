"""The one canonical text serialization of query results.

The same text is charged as result tokens by the shield and shown to the policy by the environment, so what the
policy pays for is exactly what it sees. A result renders as lines joined by ``"\\n"``: a header line with the
column names, then one line per row, cells separated by ``" | "``.

Charging contract (used by the shield and by anyone who re-charges a result, e.g. restoring evidence):
- result tokens = ``counter.count(header)`` + Σ ``counter.count(row_line)``, each line counted on its own (the
  newlines between lines are not charged); the header is charged only when at least one row is admitted;
- bytes = ``len(render_table(columns, rows).encode("utf-8"))`` (UTF-8 bytes of the shown text, newlines included).
`result_tokens` and `result_bytes` compute both.

Cells (`cell_text`): NULL → ``NULL``; integers as is; floats with at most 6 decimals from 1 up (``2.5``, ``3.0``,
``3.141593``), 6 significant digits below 1 (``0.333333``), exponent form below 1e-5 or from 1e15; text with
``\\``, newlines, tabs and ``|`` escaped so a cell never breaks the table (the empty string shows as ``""``);
blobs as ``<blob N bytes>``.
"""

from __future__ import annotations

import math
from typing import Iterable, Sequence

from bapsql.tokens import TokenCounter

SEPARATOR = " | "
_ESCAPES = str.maketrans({"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t", "|": "\\|"})


def _float_text(x: float) -> str:
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if 1 <= abs(x) < 1e15:
        text = f"{x:.6f}".rstrip("0")  # at most 6 decimals
        return text + "0" if text.endswith(".") else text
    if x == 0:
        return "0.0"
    return f"{x:.6g}"  # below 1: 6 significant digits (fixed down to 1e-5, then exponent); huge: exponent


def cell_text(value: object) -> str:
    """The canonical text of one cell (see the module docstring)."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _float_text(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return f"<blob {len(value)} bytes>"
    text = str(value)
    return text.translate(_ESCAPES) if text else '""'


def render_header(columns: Sequence[str]) -> str:
    """The header line: column names (escaped like text cells) joined by ``" | "``."""
    return SEPARATOR.join(cell_text(str(c)) for c in columns)


def render_row(row: Sequence[object]) -> str:
    """One row line: cell texts joined by ``" | "``."""
    return SEPARATOR.join(cell_text(v) for v in row)


def render_table(columns: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """Header line then one line per row, joined by newlines (no trailing newline)."""
    return "\n".join([render_header(columns), *(render_row(r) for r in rows)])


def result_tokens(columns: Sequence[str], rows: Sequence[Sequence[object]], counter: TokenCounter) -> int:
    """Result tokens charged for showing ``rows``: header + each row line, counted separately; 0 for no rows."""
    if not rows:
        return 0
    return counter.count(render_header(columns)) + sum(counter.count(render_row(r)) for r in rows)


def result_bytes(columns: Sequence[str], rows: Sequence[Sequence[object]]) -> int:
    """UTF-8 bytes of the shown table (header, rows and the newlines between them); 0 for no rows."""
    if not rows:
        return 0
    return len(render_table(columns, rows).encode("utf-8"))
