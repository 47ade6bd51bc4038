"""Figures: valid PNGs of the expected size, robust to missing cells and undefined intervals."""

from __future__ import annotations

import io
import math

import pytest

from bapsql.analysis.plots import frontier_png, quality_tokens_png

pytest.importorskip("matplotlib")
LEVELS = ("XS", "S", "M", "L")


def _size(png: bytes) -> tuple[int, int]:
    from PIL import Image

    with Image.open(io.BytesIO(png)) as img:
        img.verify()
        return img.size


def test_frontier_png_with_missing_cells_and_intervals():
    success = {("a", lv): 30.0 + i for i, lv in enumerate(LEVELS)} | {("b", "XS"): 20.0, ("b", "S"): math.nan}
    intervals = {("a", "XS"): (28.0, 32.0), ("a", "S"): (math.nan, math.nan)}
    png = frontier_png(["a", "b", "c"], LEVELS, success, intervals)
    assert png.startswith(b"\x89PNG") and _size(png) == (990, 572)


def test_quality_tokens_png():
    success = {("a", lv): 30.0 + i for i, lv in enumerate(LEVELS)}
    tokens = {("a", lv): 1500.0 + 200 * i for i, lv in enumerate(LEVELS)} | {("a", "L"): math.nan}
    png = quality_tokens_png(["a", "empty"], LEVELS, success, tokens)
    assert png.startswith(b"\x89PNG") and _size(png) == (990, 572)
