"""The local muon files a user names on the command line: a file, a folder (every file below it, hidden ones
left out) or a glob; one line and exit 2 when nothing matches."""

from __future__ import annotations

import glob
import os

from hpctrain.errors import UserError
from hpctrain.workloads.muons.events import layouts


def local_files(path: str) -> list[str]:
    """The files `path` names, sorted."""
    if any(ch in path for ch in "*?["):
        found = sorted(p for p in glob.glob(path) if os.path.isfile(p))
    elif os.path.isdir(path):
        found = sorted(
            os.path.join(root, n) for root, _, names in os.walk(path) for n in names if not n.startswith(".")
        )
    else:
        try:
            layouts.check_local(path)
        except FileNotFoundError as err:
            raise UserError(str(err)) from None
        found = [path]
    if not found:
        raise UserError(f"{path}: no file matches")
    return found
