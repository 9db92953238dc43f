"""Ragged Arrow columns to flat NumPy arrays through list offsets (no per-event Python loop).

A `list<list<float>>` column (events -> rows -> values) becomes `values (sum rows, width)` and
`counts (events,)` read straight from the Arrow offsets; a `list<float>` column of fixed-width rows
becomes `(events, width)`.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa


def _single(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    if isinstance(column, pa.ChunkedArray):
        if column.num_chunks == 1:
            return column.chunk(0)
        return column.combine_chunks() if column.num_chunks else pa.array([], type=column.type)
    return column


# Arrow number types whose buffer NumPy reads as is.
_NUMPY_TYPES = {
    pa.int8(): np.int8,
    pa.int16(): np.int16,
    pa.int32(): np.int32,
    pa.int64(): np.int64,
    pa.uint8(): np.uint8,
    pa.uint16(): np.uint16,
    pa.uint32(): np.uint32,
    pa.uint64(): np.uint64,
    pa.float16(): np.float16,
    pa.float32(): np.float32,
    pa.float64(): np.float64,
}


def numbers(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A column of numbers as NumPy: a read-only view of its buffer when it has no nulls (what
    `to_numpy(zero_copy_only=False)` gives), else that copy. Not through `to_numpy` when a view will do: pyarrow's
    converter imports pandas, if installed, at its first call (~0.35 s of every muon process's start-up)."""
    array = _single(column)
    dtype = _NUMPY_TYPES.get(array.type)
    if dtype is None or array.null_count:
        return array.to_numpy(zero_copy_only=False)
    if len(array) == 0:
        return np.empty(0, dtype=dtype)
    data = array.buffers()[1]
    view = np.frombuffer(data, dtype=dtype, count=len(array), offset=array.offset * np.dtype(dtype).itemsize)
    view.flags.writeable = False  # Arrow's memory, maybe shared: read-only like to_numpy's view
    return view


def list_offsets(array: pa.Array) -> np.ndarray:
    """Offsets (len + 1,) of a list array into its `.values`, as int64 (slicing accounted for)."""
    return np.asarray(numbers(array.offsets), dtype=np.int64)


def _float_values(values: pa.Array, start: int, stop: int) -> np.ndarray:
    if not pa.types.is_floating(values.type) and not pa.types.is_integer(values.type):
        raise ValueError(f"expected numbers in the innermost list, found {values.type}")
    return np.asarray(numbers(values.slice(start, stop - start)), dtype=np.float32)


def fixed_rows(column: pa.Array | pa.ChunkedArray, name: str = "column") -> tuple[np.ndarray, int]:
    """A `list<float>` column whose rows all have the same length -> ((rows, width) float32, width).

    Raises ValueError naming `name` if the rows differ in length."""
    array = _single(column)
    offsets = list_offsets(array)
    widths = np.diff(offsets)
    if len(widths) == 0:
        return np.zeros((0, 0), dtype=np.float32), 0
    width = int(widths[0])
    if not np.all(widths == width):
        bad = int(np.flatnonzero(widths != width)[0])
        raise ValueError(
            f"{name}: rows have different lengths ({width} in row 0, {int(widths[bad])} in row {bad})"
        )
    values = _float_values(array.values, int(offsets[0]), int(offsets[-1]))
    return values.reshape(len(widths), width), width


def nested_rows(
    column: pa.Array | pa.ChunkedArray, width: int | None = None, name: str = "column"
) -> tuple[np.ndarray, np.ndarray]:
    """A `list<list<float>>` column -> (values (sum counts, width) float32, counts (events,) int64).

    Every inner row must have `width` values (or the width of the first row when None)."""
    array = _single(column)
    outer = list_offsets(array)  # (events + 1,) into the rows
    counts = np.diff(outer)
    inner_array = array.values
    # (rows + 1,) into the floats; kept in Arrow's int32 (no int64 copy of the biggest offsets array)
    inner = numbers(inner_array.offsets)[outer[0] : outer[-1] + 1]
    widths = inner[1:] - inner[:-1]
    if len(widths) == 0:
        return np.zeros((0, width or 0), dtype=np.float32), counts
    expected = int(widths[0]) if width is None else width
    if not np.all(widths == expected):
        bad = int(np.flatnonzero(widths != expected)[0])
        raise ValueError(f"{name}: a row has {int(widths[bad])} values where {expected} were expected")
    values = _float_values(inner_array.values, int(inner[0]), int(inner[-1]))
    return values.reshape(len(widths), expected), counts


def arrow_of(values: np.ndarray) -> pa.Array:
    """A flat NumPy array as an Arrow array over its buffer (no nulls). pa.array of a NumPy array would import
    pandas (~0.35 s of every process that writes events, `hpctrain sample` and `data generate`)."""
    data = np.ascontiguousarray(values)
    return pa.Array.from_buffers(pa.from_numpy_dtype(data.dtype), len(data), [None, pa.py_buffer(data)])


def list_of_lists(values: np.ndarray, counts: np.ndarray) -> pa.ListArray:
    """The inverse of `nested_rows`: (rows, width) values and per-event counts -> list<list<float32>>."""
    values = np.ascontiguousarray(values, dtype=np.float32)
    rows, width = values.shape
    inner_offsets = (
        np.arange(0, rows * width + 1, width, dtype=np.int32) if width else np.zeros(rows + 1, np.int32)
    )
    inner = pa.ListArray.from_arrays(arrow_of(inner_offsets), arrow_of(values.reshape(-1)))
    outer_offsets = np.zeros(len(counts) + 1, dtype=np.int32)
    np.cumsum(counts, out=outer_offsets[1:])
    return pa.ListArray.from_arrays(arrow_of(outer_offsets), inner)


def fixed_list(values: np.ndarray) -> pa.ListArray:
    """(rows, width) values -> list<float32> with one list per row."""
    values = np.ascontiguousarray(values, dtype=np.float32)
    rows, width = values.shape
    offsets = np.arange(0, rows * width + 1, width, dtype=np.int32) if width else np.zeros(rows + 1, np.int32)
    return pa.ListArray.from_arrays(arrow_of(offsets), arrow_of(values.reshape(-1)))


def gather_ragged(
    offsets: np.ndarray, index: np.ndarray, scratch: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Row indices of the events `index` in a ragged array with `offsets` (events + 1,), and their counts.

    `values[rows]` is then the concatenation of the selected events' rows, in the order of `index`. With an
    int64 `scratch` at least as long as the result, the rows are written into its start (a view is returned):
    reusing it spares fresh pages for every call."""
    index = np.asarray(index, dtype=np.int64)
    starts = offsets[index]
    counts = offsets[index + 1] - starts
    nonempty = counts > 0
    s, c = starts[nonempty], counts[nonempty]
    total = int(c.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64), counts
    # One cumulative sum of steps: +1 within an event, a jump to the next event's start at its first row
    # (a single pass over the output; arange + repeat + add would make three).
    rows = np.empty(total, dtype=np.int64) if scratch is None or len(scratch) < total else scratch[:total]
    rows.fill(1)
    rows[0] = s[0]
    first = np.cumsum(c[:-1])  # output row where each later event starts
    rows[first] = s[1:] - (s[:-1] + c[:-1] - 1)
    return np.cumsum(rows, out=rows), counts


BINARY_LIMIT = 2**31  # bytes an Arrow binary array's int32 offsets reach; beyond: large_binary (int64)


def take_ragged(
    values: np.ndarray, offsets: np.ndarray, index: np.ndarray, out: np.ndarray | None = None
) -> np.ndarray:
    """`values` rows of the events `index` concatenated in that order: (sum counts, width), written into `out`
    when given, else a new writable array.

    values (rows, width) C-contiguous with `offsets` (events + 1,) into it. Each event's rows are one block of
    bytes, so the events are seen as an Arrow binary array (zero copy) and gathered by Arrow's `take`: one
    memcpy per event in C++. Muon events are mostly big blocks (~20% of the events hold ~97% of the muons):
    a per-row index for every row would cost two passes over an int64 array as long as the output before the
    copy itself, and a Python loop over the big events ~0.6 us each; this is ~3.5x faster than either on the
    synthetic muon files (~4x the plain copy of the same bytes, ~2x with `out`)."""
    values = np.ascontiguousarray(values)
    index = np.asarray(index, dtype=np.int64)
    width = values.shape[1] if values.ndim == 2 else 1
    row_bytes = width * values.dtype.itemsize
    rows = int((offsets[index + 1] - offsets[index]).sum()) if len(index) else 0
    shape = (rows, width) if values.ndim == 2 else (rows,)
    if rows == 0 or row_bytes == 0:
        return out if out is not None else np.empty(shape, dtype=values.dtype)
    byte_offsets = np.asarray(offsets, dtype=np.int64) * row_bytes
    large = int(byte_offsets[-1]) >= BINARY_LIMIT
    kind, offset_type = (pa.large_binary(), np.int64) if large else (pa.binary(), np.int32)
    blocks = pa.Array.from_buffers(
        kind,
        len(offsets) - 1,
        [None, pa.py_buffer(byte_offsets.astype(offset_type, copy=False)), pa.py_buffer(values)],
    )
    # the index as Arrow sees it: from its buffer (pa.array of a NumPy array would import pandas, ~0.35 s)
    order = pa.Array.from_buffers(pa.int64(), len(index), [None, pa.py_buffer(np.ascontiguousarray(index))])
    taken = blocks.take(order).buffers()[2]  # the blocks back to back, in the order of `index`
    got = np.frombuffer(taken, dtype=values.dtype, count=rows * width).reshape(shape)
    if out is None:
        return got  # Arrow's writable buffer, kept alive by the array
    out[...] = got
    return out


def take_rows(values: np.ndarray, rows: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """`values[rows]` for a 2-D C-contiguous `values` (rows, width), optionally written into `out`.

    Each row is moved as one opaque item (a structured view), several times faster than NumPy's
    row-wise fancy indexing of a 2-D array. `rows` must be valid indices (not checked)."""
    values = np.ascontiguousarray(values)
    n, width = values.shape
    if out is None:
        out = np.empty((len(rows), width), dtype=values.dtype)
    if len(rows) == 0 or width == 0:
        return out
    item = np.dtype((np.void, width * values.dtype.itemsize))
    # mode="clip": with mode="raise" NumPy would gather into a temporary buffer first
    np.take(values.view(item).reshape(n), rows, out=out.view(item).reshape(len(rows)), mode="clip")
    return out
