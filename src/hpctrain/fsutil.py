"""The one way to write a file safely: a temporary name beside it, fsync, rename, fsync the folder.

Readers (another process, `hpctrain status` on a login node, a run started after a kill) see the old file or the
new one, never half of one. The temporary name says who wrote it (`.NAME.tmp-PID@HOST`), so that whoever later
finds it left behind can tell whether its writer still runs (`train/runlock.py: writer_gone`) before removing it.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

HOST = socket.gethostname()


def temp_name(path: Path) -> Path:
    """`.NAME.tmp-PID@HOST` beside `path`: whoever finds it later can tell whether its writer still runs."""
    return path.with_name(f".{path.name}.tmp-{os.getpid()}@{HOST}")


def fsync_dir(path: Path) -> None:
    """Make a rename inside `path` durable (the folder's entry, not only the file's data)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write to a temporary name in the same folder, fsync, rename: readers see the old or the new file."""
    tmp = temp_name(path)
    try:
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            pause = os.environ.get("_HPCTRAIN_FAULT_SAVE_PAUSE")
            if pause and path.suffix == ".pt":
                # Fault-injection hook for tests: a window in which the file is written but not committed.
                time.sleep(float(pause))
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except OSError:
        # A full disk, a quota, a read-only mount: leave no half file taking the space a retry needs.
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid runs on this host (a zombie counts as alive until reaped)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True
