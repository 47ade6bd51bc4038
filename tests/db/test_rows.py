"""Tests of bapsql.db.rows: the canonical result text and its charging contract."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bapsql.db.rows import (
    SEPARATOR,
    cell_text,
    render_header,
    render_row,
    render_table,
    result_bytes,
    result_tokens,
)
from bapsql.tokens import RegexTokenCounter

cells = st.one_of(
    st.none(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=30),
    st.binary(max_size=40),
)


@pytest.mark.parametrize(
    "value, text",
    [
        (None, "NULL"),
        (0, "0"),
        (-42, "-42"),
        (2.5, "2.5"),
        (3.0, "3.0"),
        (0.0, "0.0"),
        (3.14159265, "3.141593"),
        (1234567.891234567, "1234567.891235"),
        (-0.1234567, "-0.123457"),
        (0.000123456, "0.000123456"),
        (1.2345e-8, "1.2345e-08"),
        (1e20, "1e+20"),
        (float("nan"), "nan"),
        (float("-inf"), "-inf"),
        ("plain", "plain"),
        ("", '""'),
        ("a|b", "a\\|b"),
        ("line1\nline2\ttab\r", "line1\\nline2\\ttab\\r"),
        ("back\\slash", "back\\\\slash"),
        (b"\x00\x01\x02", "<blob 3 bytes>"),
        ("héllo wörld", "héllo wörld"),
    ],
)
def test_cell_text(value, text):
    assert cell_text(value) == text


def test_render_table_layout():
    table = render_table(("id", "name"), [(1, "ann"), (2, None)])
    assert table == "id | name\n1 | ann\n2 | NULL"
    assert render_table(("x",), []) == "x"


@given(st.lists(cells, min_size=1, max_size=6))
def test_a_row_is_one_line_with_one_separator_per_gap(row):
    line = render_row(row)
    assert "\n" not in line and "\r" not in line
    assert line.count(SEPARATOR) == len(row) - 1


@given(st.floats(allow_nan=False, allow_infinity=False, min_value=-1e14, max_value=1e14))
def test_floats_round_trip_within_six_decimals_or_digits(x):
    back = float(cell_text(x))
    assert math.isclose(back, x, rel_tol=1e-5, abs_tol=5e-7)
    assert "." in cell_text(x) or "e" in cell_text(x)  # a REAL never looks like an INTEGER


@given(st.lists(st.lists(cells, min_size=2, max_size=2), max_size=8))
def test_charging_contract(rows):
    counter = RegexTokenCounter()
    cols = ("a", "b")
    expected_tokens = (
        counter.count(render_header(cols)) + sum(counter.count(render_row(r)) for r in rows) if rows else 0
    )
    assert result_tokens(cols, rows, counter) == expected_tokens
    assert result_bytes(cols, rows) == (len(render_table(cols, rows).encode("utf-8")) if rows else 0)
