"""Moved to `hpctrain.remote` (uris, auth, files, expand, failures, mirror), below both data/ and track/.

Kept only so that code written against the old place (workloads/muons/stream.py and staged.py, rewritten on
another branch at the same time) still imports; remove once nothing imports `hpctrain.data.remote`.
"""

from hpctrain.remote.auth import resolve_token, scrub
from hpctrain.remote.expand import expand_paths
from hpctrain.remote.failures import TransferError, classify_failure, is_folder
from hpctrain.remote.files import RemoteFiles
from hpctrain.remote.mirror import FolderMirror, mirror
from hpctrain.remote.uris import FolderError, MissingPathError, has_magic, is_remote

__all__ = [
    "FolderError",
    "FolderMirror",
    "MissingPathError",
    "RemoteFiles",
    "TransferError",
    "classify_failure",
    "expand_paths",
    "has_magic",
    "is_folder",
    "is_remote",
    "mirror",
    "resolve_token",
    "scrub",
]
