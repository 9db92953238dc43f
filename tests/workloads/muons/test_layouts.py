from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hpctrain.workloads.muons.data_verbs import synthetic_events
from hpctrain.workloads.muons.events import layouts


@pytest.mark.parametrize("layout", layouts.LAYOUTS)
def test_round_trip(tmp_path: Path, layout: str) -> None:
    data = synthetic_events(300, 1, 4)
    assert (data.counts == 0).any() and (data.counts > 1).any()
    path = str(tmp_path / ("x.h5" if layout == "hdf5" else "x.parquet"))
    layouts.write_events(path, data, layout, row_group_size=64)
    found, got = layouts.read_all(path)
    assert found == layout
    for name in ("primaries", "muons", "counts", "ids"):
        assert np.array_equal(getattr(got, name), getattr(data, name)), name


def test_hdf5_empty_event_is_one_zero_muon(tmp_path: Path) -> None:
    path = tmp_path / "raw.h5"
    prim = np.array([[1, 0, 1e6, 0.1, 0.94, 0, 1500], [1, 1, 2e6, 0.2, 3.7, 0, 2000]], np.float32)
    muons = np.array([[0, 0, 0, 0, 0, 0], [1, 1, 50.0, 1.0, 2.0, 3.0]], np.float32)
    with h5py.File(path, "w") as fh:
        fh["primaries"], fh["muons"], fh["counts"] = prim, muons, np.array([1, 1], np.int32)
    _, got = layouts.read_all(str(path))
    assert got.counts.tolist() == [0, 1]
    assert got.muons.tolist() == [[50.0, 1.0, 2.0]]  # never a muon of zero energy
    assert got.primaries[:, 0].tolist() == [1e6, 2e6] and got.primaries[:, 3].tolist() == [1500, 2000]


def test_converted_parquet_empty_convention(tmp_path: Path) -> None:
    path = tmp_path / "conv.parquet"
    table = pa.table(
        {
            "primary": [[0, 0, 1e6, 0.1, 0.94, 0, 1500], [0, 1, 2e6, 0.2, 3.7, 0, 2000]],
            "muons": [[[0, 0, 0, 0, 0, 0]], [[0, 1, 70.0, -1.0, 2.0, 3.0], [0, 1, 80.0, 1.0, 1.0, 1.0]]],
        },
        schema=pa.schema([("primary", pa.list_(pa.float32())), ("muons", pa.list_(pa.list_(pa.float32())))]),
    )
    pq.write_table(table, path)
    layout, got = layouts.read_all(str(path))
    assert layout == "parquet-hdf5"
    assert got.counts.tolist() == [0, 2] and got.muons[:, 0].tolist() == [70.0, 80.0]


def test_unknown_layout_and_routing(tmp_path: Path) -> None:
    odd = tmp_path / "odd.parquet"
    pq.write_table(pa.table({"primary": [[1.0, 2.0, 3.0, 4.0, 5.0]], "muons": [[[1.0, 2.0, 3.0]]]}), odd)
    with pytest.raises(layouts.LayoutError, match=r"primary of 5 values.*expected 'primary'"):
        layouts.open_reader(str(odd))
    other = tmp_path / "cols.parquet"
    pq.write_table(pa.table({"a": [1]}), other)
    with pytest.raises(layouts.LayoutError, match="unknown layout with columns"):
        layouts.open_reader(str(other))
    # routed by suffix: an HDF5 file named .parquet goes to pyarrow (which refuses it), never to h5py
    h5 = tmp_path / "really_h5.parquet"
    with h5py.File(h5, "w") as fh:
        fh["counts"] = np.zeros(1, np.int32)
    with pytest.raises(
        layouts.UnreadableFileError, match=r"really_h5\.parquet: .*\(ArrowInvalid: Parquet magic"
    ):
        layouts.open_reader(str(h5))
    # no suffix: the magic bytes decide
    data = synthetic_events(20, 0, 0)
    plain = tmp_path / "nosuffix"
    layouts.write_events(str(plain), data, "parquet")
    assert layouts.open_reader(str(plain)).layout == "parquet"


def test_missing_path_hints_at_mount(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"gone\.parquet.*mounted"):
        layouts.open_reader(str(tmp_path / "nowhere" / "gone.parquet"))


def _hdf5_with_counts(path: Path, counts: np.ndarray, muons: int) -> Path:
    prim = np.ones((len(counts), 7), np.float32)
    rows = np.ones((muons, 6), np.float32)
    with h5py.File(path, "w") as fh:
        fh["primaries"], fh["muons"], fh["counts"] = prim, rows, counts
    return path


@pytest.mark.parametrize(
    ("counts", "muons", "says"),
    [
        # int64 counts whose true sum (4 x 2**62 + 5) overflows: summed modulo 2**64 they are 5, the muons' rows
        (np.array([2**62, 2**62, 2**62, 2**62, 5], np.int64), 5, "outside 0 .. 5"),
        (np.array([2**63 - 1, 2**63 - 1, 2, 5], np.int64), 3, "outside 0 .. 3"),
        # uint64 past int64: cast, it would wrap to a negative (or, paired, to a small) count
        (np.array([2**64 - 1, 1, 5], np.uint64), 5, "outside 0 .. 5"),
        (np.array([3, 3, 2], np.int64), 5, "already sum past 5 muons"),
        (np.array([1.5, 3.5], np.float64), 5, "not a whole number"),
        (np.array([np.nan, 5.0], np.float32), 5, "not a whole number"),
        (np.array([1, 2], np.int32), 5, "sum to 3, not 5 muons"),
        (np.array([1, 2, 2], np.int32), 5, "3 counts for 2 primaries"),
    ],
)
def test_hdf5_counts_that_overflow_or_do_not_add_up_are_refused(
    tmp_path: Path, counts: np.ndarray, muons: int, says: str
) -> None:
    """W4: the check of the counts cannot be fooled by int64 overflow, a cast or a truncation."""
    path = tmp_path / "bad.h5"
    _hdf5_with_counts(path, counts, muons)
    if says.endswith("primaries"):  # one count too many for the primaries written with them
        with h5py.File(path, "r+") as fh:
            del fh["primaries"]
            fh["primaries"] = np.ones((2, 7), np.float32)
    with pytest.raises(layouts.LayoutError) as info:
        layouts.read_all(str(path))
    text = str(info.value)
    assert "\n" not in text and text.startswith(f"{path}: counts do not match") and says in text


def test_hdf5_whole_float_counts_are_read(tmp_path: Path) -> None:
    path = _hdf5_with_counts(tmp_path / "ok.h5", np.array([2.0, 3.0], np.float32), 5)
    _, got = layouts.read_all(str(path))
    assert got.counts.tolist() == [2, 3] and got.counts.dtype == np.int64
