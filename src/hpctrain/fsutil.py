"""The one way to write a file safely: a temporary name beside it, fsync, rename, fsync the folder.

Readers (another process, `hpctrain status` on a login node, a run started after a kill) see the old file or the
new one, never half of one. The temporary name says who wrote it (`.NAME.tmp-PID@HOST`), so that whoever later
finds it left behind can tell whether its writer still runs (`train/runlock.py: writer_gone`) before removing it.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

HOST = socket.gethostname()


def temp_name(path: Path) -> Path:
    """`.NAME.tmp-PID@HOST` beside `path`: whoever finds it later can tell whether its writer still runs.

    From a thread other than the main one `.NAME.tmp-PID-THREAD@HOST`: two threads of one process writing the
    same file (two download threads staging one URI listed twice) never share a temporary."""
    writer = str(os.getpid())
    if threading.current_thread() is not threading.main_thread():
        writer += f"-{threading.get_ident()}"
    return path.with_name(f".{path.name}.tmp-{writer}@{HOST}")


def temp_writer(temp: Path) -> tuple[int | None, str]:
    """(pid, host) of the process that wrote a temporary named by `temp_name`; pid None if the name has none."""
    writer = temp.name.rsplit(".tmp-", 1)[-1]
    pid_text, _, host = writer.partition("@")
    pid_text = pid_text.partition("-")[0]
    return (int(pid_text) if pid_text.isdigit() else None), host


def fsync_dir(path: Path) -> None:
    """Make a rename inside `path` durable (the folder's entry, not only the file's data)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# Called with the temporary path once it is written and before it is committed. Tests set it (monkeypatch) to
# open a window in which a file is complete but not yet renamed, and kill the writer there.
before_commit: Callable[[Path, Path], None] | None = None


@contextmanager
def atomic_path(path: Path, fsync: bool = True) -> Iterator[Path]:
    """Yield a temporary path beside `path` for the caller to write (with any library: torch.save, h5py,
    pyarrow, a folder tree); on success fsync it, rename it to `path` and fsync the folder. On any failure the
    temporary is removed: a full disk, a quota or a read-only mount leaves no half file taking the space a retry
    needs. `fsync=False` only for files whose loss on a power cut is harmless (a cache rebuilt on demand, state
    that lives as long as the job). A folder replaces only a missing or empty `path` (rename's rule)."""
    tmp = temp_name(path)
    try:
        yield tmp
        if fsync:
            _fsync_file(tmp)
        if before_commit is not None:
            before_commit(tmp, path)
        os.replace(tmp, path)
    except BaseException:
        if tmp.is_dir() and not tmp.is_symlink():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink(missing_ok=True)
        raise
    if fsync:
        fsync_dir(path.parent)


def _fsync_file(path: Path) -> None:
    if path.is_dir():  # a tree: its files were synced by whoever wrote them (see mirror's copy)
        fsync_dir(path)
        return
    fd = os.open(path, os.O_WRONLY)  # our own file; writable as some filesystems want for fsync
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes, fsync: bool = True) -> None:
    """Write to a temporary name in the same folder, fsync, rename: readers see the old or the new file."""
    with atomic_path(path, fsync=fsync) as tmp:
        tmp.write_bytes(data)


def atomic_write_text(path: Path, text: str, fsync: bool = True) -> None:
    atomic_write_bytes(path, text.encode(), fsync=fsync)


def atomic_write_json(path: Path, obj: Any, indent: int | None = 2, fsync: bool = True) -> None:
    atomic_write_text(path, json.dumps(obj, indent=indent) + "\n", fsync=fsync)


def nearest_existing_folder(path: str | Path) -> Path:
    """Where a missing path stops existing: the usual cause is a volume not mounted on this node, or a typo."""
    parent = Path(path).expanduser().absolute()
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    return parent


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
