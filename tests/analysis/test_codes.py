"""Columnar primitives (bapsql/analysis/codes.py): factorize, vocabularies, joint codes, widening counts, group sums."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as hst
from hypothesis.extra.numpy import arrays

from bapsql.analysis.codes import IntCodes, Vocabulary, WideningCounts, equals, factorize, group_sums


@given(arrays(np.int64, hst.integers(0, 60), elements=hst.one_of(hst.integers(-5, 40),
                                                                  hst.integers(-2**62, 2**62))))
def test_factorize_is_unique_with_inverse(keys):
    uniq, inverse = factorize(keys)
    want, want_inverse = np.unique(keys, return_inverse=True)
    assert list(uniq) == list(want) and list(inverse) == list(want_inverse.reshape(-1))


@given(hst.lists(hst.lists(hst.sampled_from(["a", "b", "c", "d", "e", ""]), max_size=12), min_size=1, max_size=5),
       hst.booleans())
@settings(max_examples=60, deadline=None)
def test_vocabulary_codes_are_first_appearance_order_for_plain_and_dictionary_input(batches, growing):
    """Dictionaries that extend the previous one (as a Parquet column chunk's batches do) or start afresh."""
    plain, encoded = Vocabulary(), Vocabulary()
    seen: list[str] = []
    for values in batches:
        array = pa.array(values, pa.string())
        if growing:  # a dictionary holding every value so far, in first-appearance order
            seen += [v for v in values if v not in seen]
            dictionary = pa.array(seen, pa.string())
            encoded_array = pa.DictionaryArray.from_arrays(pa.array([seen.index(v) for v in values], pa.int32()),
                                                           dictionary)
        else:
            encoded_array = array.dictionary_encode()
        a, b = plain.codes(array), encoded.codes(encoded_array)
        assert list(a) == list(b)
        assert [plain.values[c] for c in a] == values
    assert plain.values == encoded.values


def test_counts_widen_only_as_their_values_need():
    c = WideningCounts()
    c.add(np.array([0, 2]), np.array([1, 200]), size=3)
    assert c.values.dtype == np.uint8 and list(c.values) == [1, 0, 200]
    c.add(np.array([2]), np.array([100]), size=3)
    assert c.values.dtype == np.uint16 and c.values[2] == 300
    c.add(np.array([1, 4]), np.array([70_000, 1]), size=5)
    assert c.values.dtype == np.uint32 and list(c.values[:5]) == [1, 70_000, 300, 0, 1]
    c.add(np.array([0]), np.array([-5]), size=5)
    assert c.values.dtype == np.int64 and c.values[0] == -4


@given(hst.lists(hst.tuples(hst.integers(0, 5), hst.integers(0, 300), hst.integers(0, 3)), min_size=1, max_size=40),
       hst.integers(1, 7))
def test_joint_codes_are_stable_across_batches(rows, size):
    """A tuple keeps its code whatever batch it comes in; codes are dense; the batch's distinct tuples come back."""
    codes, first = IntCodes(), {}
    for lo in range(0, len(rows), size):
        part = np.asarray(rows[lo: lo + size], dtype=np.int64)
        got, distinct, inverse = codes.joint([part[:, 0], part[:, 1], part[:, 2]], (8, 16, 8))
        assert list(distinct[inverse]) == list(got)
        for row, code in zip(map(tuple, part.tolist()), got.tolist()):
            assert first.setdefault(row, code) == code
    assert sorted(first.values()) == list(range(len(first)))


def test_group_sums_count_bools_and_weigh_numbers():
    inverse = np.array([0, 1, 1, 2, 2, 2])
    sums = group_sums(inverse, 3, [None, np.array([True, False, True, True, True, False]), np.arange(6.0)])
    assert sums.tolist() == [[1, 1, 0], [2, 1, 3], [3, 2, 12]]
    assert group_sums(np.zeros(3, np.int64), 1, [None, np.array([1, 0, 1], bool), np.ones(3)]).tolist() == [[3, 2, 3]]


def test_equals_reads_plain_and_dictionary_strings_with_nulls():
    plain = pa.array(["a", None, "b", "a"])
    assert equals(plain, "a").tolist() == [True, False, False, True]
    assert equals(plain.dictionary_encode(), "a").tolist() == [True, False, False, True]
