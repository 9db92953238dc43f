"""What a muon file is before any of it is read: its format (suffix, else magic bytes), the layout names, and
the one-line errors of a file that is missing, unreadable or of an unknown layout.

Errors a user's data can cause are `UserError`s of one line naming the file: `LayoutError` (a readable file of
an unknown layout), `UnreadableFileError` (missing, unreadable, truncated or corrupt: whatever pyarrow or h5py
raised, reduced to its first line). The readers and writers (layouts.py) raise them and re-export them.
"""

from __future__ import annotations

import os
from pathlib import Path

from hpctrain.errors import UserError
from hpctrain.fsutil import nearest_existing_folder

LAYOUTS = ("parquet", "parquet-legacy", "parquet-hdf5", "hdf5")
PARQUET_SUFFIXES = (".parquet", ".pq", ".parq")
HDF5_SUFFIXES = (".h5", ".hdf5", ".hdf", ".he5")
HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"


class LayoutError(UserError):
    """A file whose layout is not one of LAYOUTS."""


class UnreadableFileError(UserError):
    """A file that cannot be read: missing, no permission, truncated or corrupt (`reason`: one line)."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path, self.reason = path, reason


def one_line(err: BaseException, limit: int = 300) -> str:
    """`Type: first line of the message`, at most `limit` characters (library errors can be long)."""
    text = str(err).strip().splitlines()
    detail = f"{type(err).__name__}: {text[0] if text else ''}".rstrip(": ")
    return detail if len(detail) <= limit else detail[: limit - 3] + "..."


def unreadable(path: str, err: BaseException, what: str = "cannot be read") -> UnreadableFileError:
    """The one-line error for a failure of pyarrow/h5py/the OS on `path`."""
    if isinstance(err, UnreadableFileError):
        return err
    # the libraries wrap OS errors in their own types: ask the file system what is wrong
    if isinstance(err, PermissionError) or (os.path.isfile(path) and not os.access(path, os.R_OK)):
        return UnreadableFileError(path, f"{what}: permission denied; check the file's permissions")
    if isinstance(err, FileNotFoundError) or not os.path.lexists(path):
        return UnreadableFileError(path, f"{what}: the file disappeared (moved or deleted while in use)")
    if isinstance(err, IsADirectoryError) or os.path.isdir(path):
        return UnreadableFileError(path, f"{what}: it is a folder, not a file")
    try:
        empty = os.path.getsize(path) == 0
    except OSError:
        empty = False
    if empty:
        return UnreadableFileError(path, f"{what}: the file is empty (0 bytes; an interrupted copy?)")
    return UnreadableFileError(path, f"{what}, truncated or corrupt ({one_line(err)})")


def file_format(path: str) -> str:
    """'parquet' or 'hdf5', from the suffix or else the magic bytes."""
    lower = path.lower()
    if lower.endswith(PARQUET_SUFFIXES):
        return "parquet"
    if lower.endswith(HDF5_SUFFIXES):
        return "hdf5"
    try:
        with open(path, "rb") as fh:
            head = fh.read(8)
    except OSError as err:
        raise unreadable(path, err) from None
    if head[:4] == b"PAR1":
        return "parquet"
    if head == HDF5_MAGIC:
        return "hdf5"
    raise LayoutError(f"{path}: neither Parquet nor HDF5 (suffix {Path(path).suffix!r}, unknown magic bytes)")


class MissingFileError(UnreadableFileError, FileNotFoundError):
    """A local file that does not exist."""

    def __init__(self, path: str, reason: str) -> None:
        UnreadableFileError.__init__(self, path, reason)


def check_local(path: str) -> None:
    """A clear error for a missing local file, hinting at an unmounted volume."""
    if not os.path.exists(path):
        raise MissingFileError(
            path,
            f"no such file (nearest existing folder: {nearest_existing_folder(path)}); if the data lives on a shared or "
            f"scratch volume, check that it is mounted on this node",
        )
