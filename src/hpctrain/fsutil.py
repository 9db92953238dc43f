"""The one way to write a file safely: a temporary name beside it, fsync, rename, fsync the folder.

Readers (another process, `hpctrain status` on a login node, a run started after a kill) see the old file or the
new one, never half of one. The temporary name says who wrote it (`.NAME.tmp-PID@HOST`), so that whoever later
finds it left behind can tell whether its writer still runs (`train/runlock.py: writer_gone`) before removing it.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import pwd
import shutil
import socket
import stat
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

from hpctrain.errors import UserError

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
    if tmp.is_symlink():  # planted under our predictable name: writing it would follow the link
        tmp.unlink()
    try:
        yield tmp
        if fsync:
            _fsync_file(tmp)
        if before_commit is not None:
            before_commit(tmp, path)
        os.replace(tmp, path)
    except BaseException as exc:
        if isinstance(exc, OSError) and exc.filename is None:
            exc.filename = str(path)  # a failed write() names no file: say which one was being written
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


def open_append(path: Path) -> TextIO:
    """`path` opened to append text, created if missing; a symbolic link there is refused, never followed (one
    line, exit 2): a link planted in a run folder must not make us append to a file it points at."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError:
        if path.is_symlink():
            raise UserError(
                f"{path} is a symbolic link (to {os.readlink(path)}); hpctrain never writes through one: "
                "remove the link (and check who made it)"
            ) from None
        raise
    return os.fdopen(fd, "a", encoding="utf-8")


def not_yours(path: Path, what: str = "folder") -> str | None:
    """Why we must not write into the existing folder `path` (None if we may, or if it does not exist): a folder
    of another user, one that others may write (who could plant links or files in it), or a path through a
    symbolic link that someone else made (a link planted in a shared folder, named like the run: following it
    would write wherever it points). A link of our own to a folder of ours is fine (a run folder kept on
    scratch); the staging code refuses links itself."""
    planted = foreign_link(path)
    if planted:
        return f"{what} {path}: {planted}; hpctrain never follows one"
    try:
        st = path.stat()
    except OSError:  # missing, or under a file: whoever creates it says why it cannot be
        return None
    if not stat.S_ISDIR(st.st_mode):
        return f"{what} {path} is not a folder"
    if st.st_uid != os.getuid():
        return f"{what} {path} belongs to {_user(st.st_uid)}, not to you"
    if st.st_mode & 0o022:
        return (
            f"{what} {path} is writable by {'group and others' if st.st_mode & 0o002 else 'its group'} "
            f"(mode {stat.filemode(st.st_mode)}): others could plant files or links in it; `chmod go-w {path}`"
        )
    return None


def foreign_link(path: Path) -> str | None:
    """A symbolic link on the way to `path` (`path` itself included) that another user may have planted: made by
    someone other than us or root, in a folder that group or others may write (a shared run.out_dir, /tmp), as
    `path/to is a symbolic link made by user X (to TARGET)`; None when there is none. A link in a folder only its
    owner writes (a project's link made by its owner, root's /scratch -> /lustre/scratch) is as trusted as that
    folder and followed."""
    here = Path(Path(os.path.abspath(path)).parts[0])
    for part in Path(os.path.abspath(path)).parts[1:]:
        folder, here = here, here / part
        try:
            st = here.lstat()
        except OSError:
            return None  # missing from here on: nothing below it can be a link yet
        if stat.S_ISLNK(st.st_mode) and st.st_uid not in (0, os.getuid()) and _shared(folder):
            try:
                target = os.readlink(here)
            except OSError:
                target = "?"
            return f"{here} is a symbolic link made by {_user(st.st_uid)} (to {target})"
    return None


def _shared(folder: Path) -> bool:
    """Whether users besides its owner may add entries to `folder` (its group or others may write it)."""
    try:
        return bool(folder.stat().st_mode & 0o022)
    except OSError:
        return True


def _user(uid: int) -> str:
    try:
        return f"user {pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def check_own_folders(*folders: tuple[Path, str]) -> None:
    """UserError (one line, exit 2) for the first of `(path, what)` that `not_yours` refuses."""
    for path, what in folders:
        problem = not_yours(path, what)
        if problem:
            raise UserError(f"{problem}; refusing to use it (choose another run.out_dir or run.name)")


# Folders hpctrain creates: a run's (run.out_dir, the run folder, checkpoints/, TensorBoard's and W&B's) may be
# read by the group, never written by it; what gets unpickled or run (the compile cache, submitit's jobs) or holds
# a job's secrets is the user's alone. A stricter umask narrows either; a looser one never widens it.
RUN_FOLDER_MODE = 0o750
PRIVATE_MODE = 0o700


def make_folders(path: Path, mode: int = RUN_FOLDER_MODE) -> Path:
    """`path` and every missing folder above it, each created with `mode` (at most: the umask may narrow it,
    never widen it; `Path.mkdir(parents=True)` makes the parents with the umask's mode, 0777 under umask 000).
    Folders that exist are left as they are: their checks are the caller's (`not_yours`)."""
    path = Path(path)
    missing = []
    here = Path(os.path.abspath(path))
    while not os.path.lexists(here) and here != here.parent:
        missing.append(here)
        here = here.parent
    for folder in reversed(missing):
        # made meanwhile by another process (a rank, an array task): its checks are the caller's
        with contextlib.suppress(FileExistsError):
            os.mkdir(folder, mode)
    return path


def private_folder(path: Path, what: str, hint: str) -> Path:
    """`path` as a folder only we may enter: created 0700 (with the missing folders above it), or, when it
    exists, ours, reached through no link of another user, and neither it nor anything in it writable by others
    or theirs; a looser mode of our own (0755) is narrowed to 0700 once its contents passed that look. Otherwise
    UserError naming `what`, why, and `hint` (what to do). For what gets unpickled or run (torch.compile's
    caches, submitit's job pickles): a file another user could plant there would run as us."""
    path = Path(path)
    if foreign_link(path) is None and not os.path.lexists(path):
        make_folders(path, PRIVATE_MODE)
    problem = foreign_link(path)
    if problem is None:
        try:
            st = path.stat()
        except OSError as exc:
            raise UserError(f"{what}: {path} cannot be made: {exc.strerror or exc}; {hint}") from None
        problem = _not_private(path, st)
        if problem is None and not stat.S_ISDIR(st.st_mode):
            raise UserError(f"{what}: {path} is not a folder; {hint}")
        if problem is None and st.st_mode & 0o077:
            # entered by others until now (0755): only what they could not have planted stays in use
            problem = next(filter(None, (_not_private(p, p.lstat()) for p in _tree(path))), None)
            if problem is None:
                os.chmod(path, stat.S_IMODE(st.st_mode) & ~0o077)
    if problem:
        raise UserError(f"{what}: {problem}; refusing to use it: {hint}")
    return path


def _not_private(path: Path, st: os.stat_result) -> str | None:
    if st.st_uid != os.getuid():
        return f"{path} belongs to {_user(st.st_uid)}, not to you"
    if st.st_mode & 0o022 and not stat.S_ISLNK(st.st_mode):
        who = "group and others" if st.st_mode & 0o002 else "its group"
        return f"{path} is writable by {who} (mode {stat.filemode(st.st_mode)}): a file planted there would run as you"
    return None


def _tree(path: Path) -> Iterator[Path]:
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            yield Path(root) / name


def refuse_replacing(paths: list[Path], out: str | Path) -> None:
    """UserError (one line, exit 2) when any of `paths`, the files a verb is about to write into `--out`, is
    there already: data are never replaced silently (`--overwrite` says to)."""
    there = [p for p in paths if os.path.lexists(p)]
    if there:
        shown = ", ".join(
            str(Path(p).relative_to(out)) if Path(p).is_relative_to(out) else str(p) for p in there[:3]
        )
        more = f" and {len(there) - 3} more" if len(there) > 3 else ""
        raise UserError(
            f"--out {out} already holds {len(there)} of the files this would write ({shown}{more}): nothing was "
            "written; choose another --out, or add --overwrite to replace them"
        )


# A write the user's disk or quota refused: theirs to fix (free space, another folder), not a bug to trace.
_NO_ROOM = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS}


@contextmanager
def no_room_is_user_error() -> Iterator[None]:
    """Turn a write refused for room (full disk, quota, file size limit, read-only mount) into one line naming
    the file and the reason (exit 2). The temporaries `atomic_path` writes are named by the file they make."""
    try:
        yield
    except OSError as exc:
        if exc.errno not in _NO_ROOM:
            raise
        name = str(exc.filename or "a file")
        where = Path(name)
        if ".tmp-" in where.name and where.name.startswith("."):
            where = where.with_name(where.name[1:].rsplit(".tmp-", 1)[0])
        raise UserError(
            f"cannot write {where}: {exc.strerror or os.strerror(exc.errno or 0)}; free space (or quota) there, or "
            "choose another run.out_dir, and run the same command again (the last committed checkpoint stays)"
        ) from None


def nearest_existing_folder(path: str | Path) -> Path:
    """Where a missing path stops existing: the usual cause is a volume not mounted on this node, or a typo."""
    parent = Path(path).expanduser().absolute()
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    return parent


def process_identity(pid: int) -> str | None:
    """What tells this process from a later one given the same pid: `<boot id>:<start in clock ticks after
    boot>` (Linux /proc; None elsewhere, or when the process is gone). Exact, and blind to wall clock steps."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        ticks = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None
    return f"{boot}:{ticks}"


def process_started(pid: int) -> float | None:
    """When the process `pid` started, in epoch seconds (Linux /proc, to about 10 ms; None elsewhere)."""
    try:
        ticks = float(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))


# A record's `started` is written after its process started; a process that started later than this is another.
_START_SLACK = 2.0


def holder_alive(pid: int, identity: str | None = None, started: float | None = None) -> bool:
    """Whether the process a lock record names still runs on this host: its pid runs AND is still that process.
    A pid is reused once its process is gone (a finished run's stale lock then names a stranger): with the
    record's `identity` (process_identity, written by the holder) it must match exactly; without one (an older
    record), a process that started after the record's `started` time is not the holder."""
    if not pid_alive(pid):
        return False
    if identity:
        now = process_identity(pid)
        return now is None or now == identity
    if started is not None:
        began = process_started(pid)
        return began is None or began <= started + _START_SLACK
    return True


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid runs on this host (a zombie counts as alive until reaped)."""
    if not 0 < pid < 2**31:  # no such pid (a damaged record)
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True
