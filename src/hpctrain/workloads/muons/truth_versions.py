"""The synthetic truths by version, and the version a data file records.

`hpctrain data generate --truth v2` writes the version into the file (Parquet key-value metadata, an HDF5
attribute, both under TRUTH_KEY); a file without it was written before there were versions: v1.
"""

from __future__ import annotations

from types import ModuleType

from hpctrain.errors import UserError
from hpctrain.workloads.muons import truth, truth_v2

TRUTH_KEY = "hpctrain.truth_version"
DEFAULT = "v1"
TRUTHS: dict[str, ModuleType] = {"v1": truth, "v2": truth_v2}


def get(version: str) -> ModuleType:
    """The truth module of `version` (each has sample_primaries, sample_bundles, sample)."""
    try:
        return TRUTHS[version]
    except KeyError:
        raise UserError(f"unknown truth version {version!r}; choose from {', '.join(TRUTHS)}") from None


def file_version(path: str) -> str:
    """The truth version recorded in a local muon file; DEFAULT (v1) when the file records none."""
    if path.endswith((".h5", ".hdf5")):
        import h5py

        with h5py.File(path, "r") as fh:
            value = fh.attrs.get(TRUTH_KEY)
        return str(value.decode() if isinstance(value, bytes) else value) if value is not None else DEFAULT
    import pyarrow.parquet as pq

    meta = pq.read_schema(path).metadata or {}
    raw = meta.get(TRUTH_KEY.encode())
    return raw.decode() if raw is not None else DEFAULT
