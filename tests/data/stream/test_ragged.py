from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from hpctrain.data.stream import ragged
from hpctrain.data.stream.ragged import (
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
    """Events gathered as blocks of bytes: the same rows in the same order as a per-row gather, for any mix of
    sizes (empty events, repeated and missing events included), into `out` or into a new writable array."""
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(0, 40))
        counts = rng.integers(0, 100, size=n)
        counts[rng.random(n) < 0.3] = 0
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        width = int(rng.integers(1, 5))
        values = rng.random((int(offsets[-1]), width), dtype=np.float32)
        index = rng.integers(0, n, size=int(rng.integers(0, 2 * n + 1))) if n else np.zeros(0, np.int64)
        expected = take_rows(values, gather_ragged(offsets, index)[0])
        out = np.full_like(expected, -1.0)
        assert take_ragged(values, offsets, index, out) is out
        assert np.array_equal(out, expected)
        got = take_ragged(values, offsets, index)
        assert got.shape == expected.shape and np.array_equal(got, expected)
        if len(got):
            got[0, 0] = 7.0  # writable, and not a view of `values`
            assert got[0, 0] == 7.0 and not np.shares_memory(got, values)


@pytest.mark.parametrize("limit", [2**31, 0])
def test_take_ragged_of_int64_rows_and_a_sliced_source(limit: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Any row type (ids are int64 pairs) and values that start mid-buffer (a view); limit 0: the int64
    offsets of sources past 2 GiB."""
    monkeypatch.setattr(ragged, "BINARY_LIMIT", limit)
    values = np.arange(40, dtype=np.int64).reshape(20, 2)[4:]
    offsets = np.array([0, 3, 3, 10, 16])
    got = take_ragged(values, offsets, np.array([3, 0, 2]))
    assert np.array_equal(got, np.concatenate([values[10:16], values[0:3], values[3:10]]))


def test_numbers_are_buffer_views_that_respect_slices_and_nulls() -> None:
    from hpctrain.data.stream.ragged import numbers

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
