from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from hpctrain.data.ragged import (
    BLOCK_ROWS,
    fixed_list,
    fixed_rows,
    gather_ragged,
    list_of_lists,
    nested_rows,
    take_ragged,
    take_rows,
)


def _events() -> tuple[np.ndarray, np.ndarray]:
    counts = np.array([2, 0, 3, 1, 0], dtype=np.int64)
    values = np.arange(counts.sum() * 3, dtype=np.float32).reshape(-1, 3)
    return values, counts


def test_nested_round_trip_and_slices() -> None:
    values, counts = _events()
    array = list_of_lists(values, counts)
    got, got_counts = nested_rows(array, 3)
    assert np.array_equal(got, values) and np.array_equal(got_counts, counts)
    # a slice keeps its own offsets: events 2..4 hold rows 2..5
    sliced, sliced_counts = nested_rows(array.slice(2, 2), 3)
    assert np.array_equal(sliced_counts, [3, 1]) and np.array_equal(sliced, values[2:6])
    # several chunks
    chunked = pa.chunked_array([array.slice(0, 2), array.slice(2, 3)])
    got, got_counts = nested_rows(chunked, 3)
    assert np.array_equal(got, values) and np.array_equal(got_counts, counts)


def test_width_mismatch_names_column() -> None:
    array = pa.array([[[1.0, 2.0, 3.0]], [[1.0, 2.0]]], type=pa.list_(pa.list_(pa.float32())))
    with pytest.raises(ValueError, match="muons: a row has 2 values where 3"):
        nested_rows(array, 3, "muons")
    with pytest.raises(ValueError, match="primary: rows have different lengths"):
        fixed_rows(pa.array([[1.0, 2.0], [1.0]]), "primary")


def test_fixed_rows_and_gather() -> None:
    rows = np.arange(12, dtype=np.float32).reshape(4, 3)
    got, width = fixed_rows(fixed_list(rows))
    assert width == 3 and np.array_equal(got, rows)
    values, counts = _events()
    offsets = np.concatenate([[0], np.cumsum(counts)])
    idx, sel_counts = gather_ragged(offsets, np.array([3, 0, 1, 2]))
    assert np.array_equal(sel_counts, [1, 2, 0, 3])
    assert np.array_equal(values[idx], np.concatenate([values[5:6], values[0:2], values[2:5]]))


def test_take_ragged_equals_the_row_gather() -> None:
    """Big events copied as blocks, small ones gathered by row: the same rows in the same order as a per-row
    gather, for any mix of sizes around the block threshold (empty events included)."""
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(0, 40))
        counts = rng.integers(0, 3 * BLOCK_ROWS, size=n)
        counts[rng.random(n) < 0.3] = 0
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        values = rng.random((int(offsets[-1]), 3), dtype=np.float32)
        index = rng.permutation(n)[: int(rng.integers(0, n + 1))]
        expected = take_rows(values, gather_ragged(offsets, index)[0])
        out = np.full_like(expected, -1.0)
        take_ragged(values, offsets, index, out, np.empty(7, dtype=np.int64))
        assert np.array_equal(out, expected)


def test_numbers_are_buffer_views_that_respect_slices_and_nulls() -> None:
    from hpctrain.data.ragged import numbers

    array = pa.array(np.arange(10, dtype=np.float32))
    part = numbers(array.slice(3, 4))
    assert part.dtype == np.float32 and part.tolist() == [3.0, 4.0, 5.0, 6.0]
    assert not part.flags.writeable  # a view of Arrow's buffer, as to_numpy's zero copy
    chunked = pa.chunked_array([pa.array([1, 2], pa.int32()), pa.array([3], pa.int32())])
    assert numbers(chunked).tolist() == [1, 2, 3]
    assert numbers(pa.array([], pa.int64())).shape == (0,)
    with_null = numbers(pa.array([1.0, None, 3.0]))  # nulls: pyarrow's own copy (NaN for the null)
    assert with_null[0] == 1.0 and np.isnan(with_null[1])
    lists = pa.array([[1.0], [2.0, 3.0], []]).slice(1)
    assert numbers(lists.offsets).tolist() == [1, 3, 3]  # the offsets of a slice start where it starts
