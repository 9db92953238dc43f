"""expand_paths: what `data.paths` names, as one sorted list of files (local paths and remote URIs)."""

from __future__ import annotations

import glob as globlib
import os
from typing import Any

from hpctrain.config.remote import PelicanConfig
from hpctrain.fsutil import nearest_existing_folder
from hpctrain.remote.files import RemoteFiles
from hpctrain.remote.uris import MissingPathError, has_magic, is_remote, magic_prefix


def expand_paths(
    paths: list[str],
    pelican: PelicanConfig | None = None,
    storage_options: dict[str, Any] | None = None,
) -> list[str]:
    """Sorted, de-duplicated files named by local paths/globs/folders and remote URIs/globs.

    Remote URIs without a wildcard are kept as given (checked when staged); a remote URI ending in "/" means
    every file under it. Raises MissingPathError naming a path that matches nothing.
    """
    if isinstance(paths, str):
        raise ValueError("data.paths must be a list of paths, not a string")
    remote = None
    out: set[str] = set()
    for path in paths:
        path = str(path)
        if is_remote(path):
            remote = remote or RemoteFiles(pelican, storage_options)
            out.update(remote.expand(path))
        else:
            out.update(_expand_local(path))
    return sorted(out)


def _expand_local(path: str) -> list[str]:
    path = os.path.expanduser(path.removeprefix("file://"))
    if has_magic(path):
        found = [p for p in globlib.glob(path, recursive=True) if os.path.isfile(p)]
        if not found:
            if not os.path.exists(os.path.dirname(magic_prefix(path)) or "."):
                raise _missing_local(path)
            raise MissingPathError(f"{path}: no file matches this pattern (check the folder and the pattern)")
        return [os.path.abspath(p) for p in found]
    if os.path.isdir(path):
        found = [
            os.path.join(root, name)
            for root, dirs, names in os.walk(path)
            for name in names
            if not name.startswith(".")
        ]
        if not found:
            raise MissingPathError(f"{path}: the folder is empty (hidden files are ignored)")
        return [os.path.abspath(p) for p in found]
    if not os.path.exists(path):
        raise _missing_local(path)
    return [os.path.abspath(path)]


def _missing_local(path: str) -> MissingPathError:
    return MissingPathError(
        f"{path}: no such file or directory (nearest existing folder: {nearest_existing_folder(path)}); if the "
        f"data lives on a shared or scratch volume, check that it is mounted on this node"
    )
