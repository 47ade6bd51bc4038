"""Columnar primitives of the running aggregates (`bapsql.analysis.accumulate`): codes, group sums, growable counts.

- `Vocabulary`: strings ↔ dense int codes in first-appearance order, looked up a whole Arrow array at a time (a
  pyarrow hash lookup); a dictionary-encoded array is decoded once per dictionary, and a dictionary that extends the
  previous one (consecutive batches of a Parquet column chunk) only for its new tail;
- `IntCodes`: int64 keys (or tuples of small ints packed into one) ↔ dense codes, through a sorted index;
- `factorize`: `np.unique(..., return_inverse=True)` without a sort when the keys span a small range;
- `group_sums`: per-group sums of weight columns taken one at a time (bool columns counted, not weighted);
- `WideningCounts`: a growable count vector in the narrowest unsigned type its values need; `GrowingRows`: a
  growable ``(rows, C)`` int64 table.
Shapes: ``N`` rows of a batch, ``U`` distinct keys of a batch, ``C`` channels.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

_WIDTHS = (np.uint8, np.uint16, np.uint32, np.int64)


def column(batch: pa.RecordBatch, name: str) -> pa.Array:
    return batch.column(batch.schema.get_field_index(name))


def numbers(array: pa.Array) -> np.ndarray:
    """A numeric or boolean array → float64 ``(N,)`` with NaN where null."""
    return array.cast(pa.float64()).to_numpy(zero_copy_only=False)


def equals(array: pa.Array, value: str) -> np.ndarray:
    """bool ``(N,)``: where a string (or dictionary) array equals ``value`` (null: False)."""
    if pa.types.is_dictionary(array.type):
        hits = pc.equal(array.dictionary.cast(pa.string()), value).fill_null(False).to_numpy(zero_copy_only=False)
        return np.append(hits, False)[array.indices.fill_null(-1).to_numpy(zero_copy_only=False)]
    return pc.equal(array.cast(pa.string()), value).fill_null(False).to_numpy(zero_copy_only=False)


def _strings(array: pa.Array) -> pa.Array:
    """A string-like array without nulls (null → ""), plain or dictionary-encoded with string values."""
    if pa.types.is_dictionary(array.type):
        if array.null_count or not pa.types.is_string(array.type.value_type):
            array = array.cast(pa.string())
        else:
            return array
    elif not pa.types.is_string(array.type):
        array = array.cast(pa.string())
    return array.fill_null("") if array.null_count else array


class Vocabulary:
    """Strings ↔ dense int codes in order of first appearance; `codes` looks a whole array up at once."""

    def __init__(self) -> None:
        self.values: list[str] = []
        self._set = pa.array([], pa.string())
        self._last: tuple[pa.Array, np.ndarray] | None = None  # the last dictionary looked up, and its codes

    def codes(self, array: pa.Array) -> np.ndarray:
        """int64 codes ``(N,)`` of a string (or dictionary) array; nulls read as ""; new strings get new codes.
        A dictionary that extends the previous one (consecutive batches of a Parquet column chunk) is looked up
        from where that one ended."""
        array = _strings(array)
        if pa.types.is_dictionary(array.type):
            return self._dictionary_codes(array.dictionary)[array.indices.to_numpy(zero_copy_only=False)]
        return self._lookup(array)

    def _dictionary_codes(self, dictionary: pa.Array) -> np.ndarray:
        if self._last is not None:
            last, codes = self._last
            if len(dictionary) >= len(last) and dictionary.slice(0, len(last)).equals(last):
                if len(dictionary) > len(last):
                    codes = np.concatenate([codes, self._lookup(dictionary.slice(len(last)))])
                self._last = (dictionary, codes)
                return codes
        codes = self._lookup(dictionary)
        self._last = (dictionary, codes)
        return codes

    def _lookup(self, array: pa.Array) -> np.ndarray:
        found = pc.index_in(array, value_set=self._set)
        if found.null_count:
            new = pc.unique(array.filter(found.is_null()))
            self.values += new.to_pylist()
            self._set = pa.concat_arrays([self._set, new])
            found = pc.index_in(array, value_set=self._set)
        return found.to_numpy(zero_copy_only=False).astype(np.int64)


def factorize(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(keys, return_inverse=True)`` for int64 ``keys (N,)``: the sorted distinct keys ``(U,)`` and each
    key's index among them ``(N,)`` — through a lookup table, without sorting, when the keys span a small range."""
    if keys.size == 0:
        return keys[:0], keys[:0]
    lo = int(keys.min())
    span = int(keys.max()) - lo + 1
    if span > max(4 * keys.size, 1 << 16):
        uniq, inverse = np.unique(keys, return_inverse=True)
        return uniq, inverse.reshape(-1)
    local = keys - lo
    seen = np.zeros(span, bool)
    seen[local] = True
    uniq = np.flatnonzero(seen)
    table = np.zeros(span, np.int64)
    table[uniq] = np.arange(uniq.size)
    return uniq + lo, table[local]


class IntCodes:
    """Distinct int64 keys ↔ dense codes in order of first appearance (a sorted key index, searched at once)."""

    def __init__(self) -> None:
        self.keys = np.zeros(0, np.int64)  # in code order
        self._sorted = np.zeros(0, np.int64)
        self._order = np.zeros(0, np.int64)  # codes of _sorted

    def lookup(self, uniq: np.ndarray) -> np.ndarray:
        """Codes ``(U,)`` of sorted distinct keys ``(U,)``; unseen keys get new codes."""
        pos = np.searchsorted(self._sorted, uniq)
        known = pos < self._sorted.size
        known[known] = self._sorted[pos[known]] == uniq[known]
        codes = np.empty(uniq.size, np.int64)
        codes[known] = self._order[pos[known]]
        new = uniq[~known]
        if new.size:
            codes[~known] = np.arange(self.keys.size, self.keys.size + new.size)
            self.keys = np.concatenate([self.keys, new])
            self._sorted = np.insert(self._sorted, pos[~known], new)
            self._order = np.insert(self._order, pos[~known], codes[~known])
        return codes

    def codes(self, keys: np.ndarray) -> np.ndarray:
        """Codes ``(N,)`` of int64 keys ``(N,)``."""
        uniq, inverse = factorize(keys)
        return self.lookup(uniq)[inverse]

    def joint(self, parts: Sequence[np.ndarray], bits: Sequence[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Codes of tuples of non-negative int ``parts`` (each ``(N,)``), keyed by the parts packed into ``bits``
        bits each: ``(codes (N,), codes of the batch's distinct tuples (U,), each row's tuple index (N,))``."""
        highs = [int(p.max()) + 1 for p in parts]
        dense = np.zeros(parts[0].size, np.int64)
        for p, high in zip(parts, highs):
            dense = dense * high + p
        uniq, inverse = factorize(dense)
        key = np.zeros(uniq.size, np.int64)
        rest, unpacked = uniq, []
        for high in reversed(highs):
            rest, part = np.divmod(rest, high)
            unpacked.append(part)
        for part, width in zip(reversed(unpacked), bits):
            key = (key << width) | part
        codes = self.lookup(key)  # packing keeps the dense order, so the keys are sorted
        return codes[inverse], codes, inverse


class WideningCounts:
    """A growable non-negative int vector in the narrowest of `_WIDTHS` that holds its values (int64 once any
    value is negative). ``add(positions, values)`` needs distinct positions."""

    def __init__(self) -> None:
        self.values = np.zeros(0, np.uint8)

    def add(self, positions: np.ndarray, values: np.ndarray, size: int) -> None:
        if size > self.values.size:
            grown = np.zeros(max(size, self.values.size + self.values.size // 2), self.values.dtype)
            grown[: self.values.size] = self.values
            self.values = grown
        new = self.values[positions].astype(np.int64) + values.astype(np.int64)
        if new.size and (new.max() > np.iinfo(self.values.dtype).max or new.min() < 0):
            width = np.int64 if new.min() < 0 else next(w for w in _WIDTHS if new.max() <= np.iinfo(w).max)
            self.values = self.values.astype(width)
        self.values[positions] = new


class GrowingRows:
    """A growable ``(rows, C)`` int64 table; ``add(rows, sums)`` adds ``(U, C)`` sums at distinct rows."""

    def __init__(self, channels: int) -> None:
        self.table = np.zeros((0, channels), np.int64)

    def add(self, rows: np.ndarray, sums: np.ndarray, size: int) -> None:
        if size > self.table.shape[0]:
            grown = np.zeros((max(size, 2 * self.table.shape[0]), self.table.shape[1]), np.int64)
            grown[: self.table.shape[0]] = self.table
            self.table = grown
        self.table[rows] += np.rint(sums).astype(np.int64)


def group_sums(inverse: np.ndarray, groups: int, columns: Iterable[np.ndarray | None]) -> np.ndarray:
    """Per-group sums: group index ``(N,)`` and weight columns ``(N,)`` (bool, numeric, or None for 1) → float64
    ``(groups, C)``; columns may come from a generator, so that one at a time is in memory."""
    def sums(values: np.ndarray | None) -> np.ndarray:
        if values is None:
            return np.bincount(inverse, minlength=groups).astype(np.float64)
        if groups == 1:
            return np.array([np.count_nonzero(values) if values.dtype == bool else values.sum()], np.float64)
        if values.dtype == bool:
            return np.bincount(inverse[values], minlength=groups).astype(np.float64)
        return np.bincount(inverse, weights=values, minlength=groups)

    return np.stack([sums(v) for v in columns], axis=1)
