"""The synthetic truths by version, and the version a data file records.

`hpctrain data generate --truth v2` writes the version into the file (Parquet key-value metadata, an HDF5
attribute, both under TRUTH_KEY); a file without it was written before there were versions: v1.
"""

from __future__ import annotations

import logging
from types import ModuleType

from hpctrain.errors import UserError
from hpctrain.workloads.muons.truth import v1 as truth
from hpctrain.workloads.muons.truth import v2 as truth_v2

log = logging.getLogger("hpctrain.muons")

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


def training_version(paths: list[str]) -> tuple[str, str]:
    """(version, where it came from) for a model trained on `paths`: the version its local training files
    record (a model trained on v2 is judged against v2, not against the truth it never saw); DEFAULT, saying
    why, when no training file can be read here (remote URIs, files moved away). Files that record different
    versions are one line, exit 2: the caller must choose with --truth."""
    from hpctrain.workloads.muons.events.files import local_files

    found: dict[str, str] = {}  # version -> one file that records it
    for path in paths:
        if "://" in path and not path.startswith("file://"):
            continue  # a remote file is not opened for one metadata key
        try:
            for name in local_files(path.removeprefix("file://")):
                found.setdefault(file_version(name), name)
        except (UserError, OSError, ValueError) as err:
            log.debug("truth version of %s not read: %s", path, err)
    if len(found) > 1:
        mixed = ", ".join(f"{v} ({name})" for v, name in sorted(found.items()))
        raise UserError(
            f"the training files record different truth versions: {mixed}; choose one with --truth"
        )
    if found:
        (version,) = found
        return version, "the training files' truth"
    return DEFAULT, "assumed: no training file readable here records one"
