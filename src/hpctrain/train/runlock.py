"""Who owns a run folder: one process (rank 0 of one job) for the whole run, and no other.

`<run_dir>/run.lock` is the lock and its record, JSON `{"pid", "host", "job_id", "started", "heartbeat",
"identity"}`. The holder rewrites it every HEARTBEAT_SECONDS and removes it on a clean exit. A holder is alive
when its pid runs on this host and is still that process (`identity`: the boot and the process's start, so that
a pid reused after a kill names no holder; fsutil.holder_alive), or (on another host) when its heartbeat is younger than STALE_SECONDS; a dead holder's lock is taken
over with a warning. Once it holds the lock, the new holder removes the temporary files that dead writers left
in the run folder (`clean_temporaries`: every file there is written under `fsutil.temp_name`).

Holding it on each kind of file system:
- flock works (local disks, NFSv4, Lustre/GPFS mounted with flock): the holder keeps an exclusive flock on the
  file named run.lock; the kernel drops it however the holder dies (once the processes it forked, DataLoader
  workers, are gone too: a flock held after its holder's pid died on this host is taken over by renaming a new,
  locked file over the name). The record is still checked, because flock can be local to one client (NFS
  `local_lock=flock`, Lustre `localflock`): a fresh heartbeat from another host means held, whatever flock said.
- flock missing (ENOLCK, EOPNOTSUPP, e.g. Lustre without `flock`, NFSv3 without lockd): the file is created with
  O_EXCL and the record alone decides. Taking over a stale record is a rename checked again after a pause, and
  the holder checks at each heartbeat that the record is still its own (a loud error if not).
Each heartbeat is written to a temporary name and renamed (readers on other hosts see a whole, fresh record when
they open it); under flock the new file is locked before it is renamed over the old one, so the name run.lock
always names a locked file.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from hpctrain.errors import UserError
from hpctrain.fsutil import (
    HOST,
    RUN_FOLDER_MODE,
    atomic_path,
    check_own_folders,
    fsync_dir,
    holder_alive,
    make_folders,
    pid_alive,
    process_identity,
    temp_writer,
)
from hpctrain.runtime import dist
from hpctrain.track.chain import ChainLog, is_count, is_stamp

log = logging.getLogger(__name__)

LOCK_NAME = "run.lock"
HEARTBEAT_SECONDS = 15.0  # the shared convention: at least every 30 s
STALE_SECONDS = 120.0  # the shared convention: readers call a run with an older heartbeat dead
# A heartbeat this far ahead of our clock is no proof of life (hosts of one cluster agree within seconds; NTP)
FUTURE_SECONDS = 300.0
TAKEOVER_PAUSE = 1.0  # without flock: a takeover re-reads the record after this long to see who won
_NO_FLOCK = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS, errno.EINVAL}
_HELD_HERE: set[str] = set()  # locks this process holds: a record with our own pid is ours only if listed


def writer_gone(temp: Path) -> bool:
    """Whether the process that wrote this temporary file is dead (see `temp_name`).

    On this host: its pid no longer runs (or is ours: callers clean up before this process writes anything).
    From another host (or with no host in the name, written by an older version): not modified for
    STALE_SECONDS; callers hold the run lock, so its writer was a previous holder.
    """
    pid, host = temp_writer(temp)
    if host == HOST and pid is not None:
        return not pid_alive(pid) or pid == os.getpid()
    try:
        return time.time() - temp.stat().st_mtime > STALE_SECONDS
    except FileNotFoundError:
        return False


def clean_temporaries(folder: Path, what: str) -> None:
    """Remove the temporary files (`.NAME.tmp-*`, see `temp_name`) in `folder` whose writer is dead: writes cut
    short by a kill. A live writer's are left alone. Callers hold the run lock and call this before they write
    anything into `folder`. `what` names the files in the warning."""
    try:
        leftovers = sorted(folder.glob(".*.tmp-*"))
    except OSError:
        return
    for leftover in leftovers:
        if leftover.is_file() and writer_gone(leftover):
            log.warning("removing a half-written %s: %s", what, leftover.name)
            leftover.unlink(missing_ok=True)


def heartbeat_fresh(record: LockRecord, path: Path) -> bool:
    """Whether another host's heartbeat says its holder runs: younger than STALE_SECONDS, and not more than
    FUTURE_SECONDS ahead of our clock. A heartbeat further ahead comes from a clock out of step (or a forged
    record): it would hold the folder until that time, so it counts as stale, with a warning."""
    age = time.time() - record.heartbeat
    if age < -FUTURE_SECONDS:
        log.warning(
            "%s: the heartbeat of %s is %.0f s in the future (its host's clock is out of step?); more than %.0f "
            "s ahead counts as stale",
            path,
            record.host,
            -age,
            FUTURE_SECONDS,
        )
        return False
    return age < STALE_SECONDS


@dataclass
class LockRecord:
    pid: int
    host: str
    job_id: str | None
    started: float
    heartbeat: float
    identity: str | None = None  # fsutil.process_identity of the holder (records of older versions: none)

    @classmethod
    def read(cls, path: Path) -> LockRecord | None:
        """The record in `path`; None when there is none or it is not a whole record (a number out of bounds,
        NaN or of the wrong kind included: a damaged file is no record)."""
        try:
            data = json.loads(path.read_text())
            record = cls(
                data["pid"],
                str(data["host"]),
                data.get("job_id"),
                data["started"],
                data["heartbeat"],
                data.get("identity"),
            )
        except (OSError, ValueError, KeyError, TypeError, RecursionError):
            return None
        sound = (
            is_count(record.pid)
            and is_stamp(record.started)
            and is_stamp(record.heartbeat)
            and isinstance(record.identity, (str, type(None)))
            and isinstance(record.job_id, (str, type(None)))
        )
        return record if sound else None

    def same_holder(self, other: LockRecord | None) -> bool:
        return other is not None and (self.pid, self.host, self.started) == (
            other.pid,
            other.host,
            other.started,
        )

    def describe(self) -> str:
        job = f"job {self.job_id}" if self.job_id else "no job id"
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.started))
        beat = time.time() - self.heartbeat
        return f"pid {self.pid} on host {self.host} ({job}), started {since}, last heartbeat {beat:.0f} s ago"


class RunLock:
    """The exclusive lock of one run folder, held from `acquire()` to `release()` with a heartbeat thread."""

    def __init__(self, run_dir: Path, job_id: str | None = None, restart_count: int = 0) -> None:
        self.path = run_dir / LOCK_NAME
        self.job_id = job_id
        self.restart_count = restart_count
        self.record: LockRecord | None = None  # ours, while held
        self._flock = True  # whether this file system has flock (found out when acquiring)
        self._fd: int | None = None  # the flocked file (None without flock)
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    @property
    def held(self) -> bool:
        return self.record is not None

    def acquire(self) -> None:
        """Take the lock or raise UserError naming its holder (one line)."""
        run_dir = self.path.parent
        folders = ((run_dir, "run folder"), (run_dir / "checkpoints", "checkpoints folder"))
        check_own_folders(*folders)  # before anything is made: a link planted on the way is never followed
        # 0o750 at most whatever the umask, run.out_dir too: a folder others may write is refused at the next start
        make_folders(run_dir, RUN_FOLDER_MODE)
        check_own_folders(*folders)  # and again: made by someone else meanwhile
        for _ in range(100):  # the name moves to a new file at each heartbeat: try again on a moved one
            if self._try_acquire():
                break
        else:
            raise UserError(f"cannot lock {self.path}: it keeps changing under us; try again")
        _HELD_HERE.add(os.path.abspath(self.path))
        # The folder is ours now: what killed writers left in it goes (config.yaml, chain.json, summary.json,
        # metrics.jsonl, run.lock are all written under `temp_name`); before the heartbeat writes its own.
        clean_temporaries(self.path.parent, "file from a killed write")
        self._stop.clear()
        self._beat = threading.Thread(target=self._heartbeat_loop, name="run-lock-heartbeat", daemon=True)
        self._beat.start()

    def release(self) -> None:
        """Stop the heartbeat and remove the lock (only if it is still ours). Safe to call when not held."""
        if self._beat is not None:
            self._stop.set()
            self._beat.join()
            self._beat = None
        if self.record is not None and self.record.same_holder(LockRecord.read(self.path)):
            # Before the flock goes: a waiter then finds no file, or a new one.
            self.path.unlink(missing_ok=True)
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self.record = None
        _HELD_HERE.discard(os.path.abspath(self.path))

    # ---- acquiring -----------------------------------------------------------------------------------------

    def _try_acquire(self) -> bool:
        """True when held; False to try again (the file was replaced meanwhile); UserError when someone holds it."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
            created = True
        except FileExistsError:
            try:
                fd = os.open(self.path, os.O_RDWR)
            except FileNotFoundError:
                return False  # released meanwhile
            created = False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            holder = LockRecord.read(self.path)
            if holder is not None and holder.host == HOST and not self._alive(holder):
                # The holder is dead, but processes it forked (DataLoader workers) keep its flock for a few
                # seconds. They write nothing: lock a new file and move the name to it.
                self._flock = True
                return self._take_over_by_rename(holder)
            raise self._held_error(holder) from None
        except OSError as exc:
            os.close(fd)
            if exc.errno not in _NO_FLOCK:
                raise
            log.info("%s: no flock on this file system; locking by O_EXCL creation and heartbeat", self.path)
            self._flock = False
            if created:  # O_EXCL made it ours: nobody else can have created it too
                return self._write_record()
            return self._acquire_by_record()
        self._flock = True
        if not _names(self.path, fd):
            os.close(fd)
            return False  # locked a file that a heartbeat or a release just replaced
        self._fd = fd
        previous = LockRecord.read(self.path)
        if previous is not None and previous.host != HOST and self._alive(previous):
            # flock local to each client (NFS local_lock, Lustre localflock): the heartbeat says it is held
            self._fd = None
            os.close(fd)
            raise self._held_error(previous)
        self._take_over_from(previous)
        return self._write_record()

    def _acquire_by_record(self) -> bool:
        """Without flock, a lock file we did not create: held while its record says so, else taken over."""
        previous = LockRecord.read(self.path)
        if previous is None:
            time.sleep(TAKEOVER_PAUSE)  # created by O_EXCL a moment ago, its record not yet written?
            previous = LockRecord.read(self.path)
        if previous is not None and self._alive(previous):
            raise self._held_error(previous)
        return self._take_over_by_rename(previous)

    def _take_over_by_rename(self, previous: LockRecord | None) -> bool:
        """Rename our record over a dead holder's; of two takers at once the later rename wins, and the other
        one sees that when it reads the record back after TAKEOVER_PAUSE."""
        current = LockRecord.read(self.path)
        if current is not None and not current.same_holder(previous):
            return False  # someone else took it over meanwhile: judge the new holder
        self._take_over_from(previous)
        self._write_record()
        time.sleep(TAKEOVER_PAUSE)
        winner = LockRecord.read(self.path)
        if self.record is None or not self.record.same_holder(winner):
            self.record = None
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
            raise self._held_error(winner)
        return True

    def _alive(self, record: LockRecord) -> bool:
        """Whether the holder in `record` may still run (the shared convention, plus two cases of our own)."""
        if record.host == HOST:
            if record.pid == os.getpid():  # ours, or our pid reused (containers) after a dead holder
                return os.path.abspath(self.path) in _HELD_HERE
            return holder_alive(record.pid, record.identity, record.started)
        if self.restart_count > 0 and self.job_id is not None and record.job_id == self.job_id:
            return False  # a requeued SLURM job: its previous run on another node has ended
        return heartbeat_fresh(record, self.path)

    def _take_over_from(self, previous: LockRecord | None) -> None:
        if previous is not None:
            log.warning(
                "taking over the lock of %s from a process that is gone (%s)",
                self.path.parent,
                previous.describe(),
            )

    def _held_error(self, record: LockRecord | None) -> UserError:
        holder = record.describe() if record is not None else "another process (its record is unreadable)"
        hint = "wait for it to end, or use another run.name"
        if record is not None and record.host != HOST:
            hint += f" (if it is gone, its lock is stale {STALE_SECONDS:.0f} s after its last heartbeat)"
        return UserError(f"run folder {self.path.parent} is in use by {holder} (lock {self.path}); {hint}")

    # ---- the record and its heartbeat ----------------------------------------------------------------------

    def _write_record(self) -> bool:
        """Our record under a temporary name (locked first, under flock), renamed over run.lock; True."""
        now = time.time()
        started = self.record.started if self.record is not None else now
        record = LockRecord(os.getpid(), HOST, self.job_id, started, now, process_identity(os.getpid()))
        fd = None
        try:
            with atomic_path(self.path) as tmp:
                fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
                if self._flock:  # the lock goes with the file: it is held from the moment run.lock names it
                    # nobody else knows this file: never blocks
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                os.write(fd, (json.dumps(asdict(record)) + "\n").encode())
        except BaseException:
            if fd is not None:
                os.close(fd)
            raise
        if self._fd is not None:
            os.close(self._fd)  # the old file's flock: run.lock now names the new, locked one
        if self._flock:
            self._fd = fd
        else:
            os.close(fd)
        self.record = record
        return True

    def _heartbeat_loop(self) -> None:
        while not self._stop.wait(HEARTBEAT_SECONDS):
            try:
                current = LockRecord.read(self.path)
                if current is None:  # removed by hand, or unreadable for a moment: ours until someone else's
                    log.warning("%s is gone or unreadable; writing it again", self.path)
                elif self.record is None or not self.record.same_holder(current):
                    log.error(
                        "%s is no longer ours: it names %s; two processes may now write this run folder",
                        self.path,
                        current.describe(),
                    )
                    return
                self._write_record()
            except OSError as exc:  # a hiccup of the file system: try again at the next beat
                log.warning("refreshing %s failed: %s", self.path, exc)


def _names(path: Path, fd: int) -> bool:
    """Whether `path` still names the open file `fd`."""
    try:
        named = os.stat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (mine.st_dev, mine.st_ino)


# Files of a run besides its checkpoints/ folder that belong to that run alone.
# Files and folders of a run's history (trackers included: an offline W&B run of the old run is not the new one's).
RUN_FILES = (
    "metrics.jsonl",
    "chain.json",
    "summary.json",
    "wandb.json",
    "wandb",
    "bad_files.txt",
    "resume_applied.json",
    "training.log",
)


def previous_run_files(run_dir: Path) -> list[Path]:
    """What a previous run left in `run_dir`: a non-empty checkpoints/ folder and its metrics, chain, summary."""
    found = [run_dir / name for name in RUN_FILES if (run_dir / name).exists()]
    checkpoints = run_dir / "checkpoints"
    if checkpoints.is_dir() and any(checkpoints.iterdir()):
        found.append(checkpoints)
    return found


# Written by a start itself before it decides how to resume (the data index notes bad input files first).
WRITTEN_AT_START = ("bad_files.txt",)


def earlier_history(run_dir: Path) -> list[Path]:
    """The previous run's files that this start cannot have written yet: evidence of a run to keep."""
    return [path for path in previous_run_files(run_dir) if path.name not in WRITTEN_AT_START]


def set_aside_previous_run(run_dir: Path) -> Path | None:
    """Move a previous run's files into `run_dir/old-<time>/` (the caller holds the run lock); None if none.

    Each file is renamed (atomic, same file system) into the new folder, checkpoints/ last, and config.yaml is
    copied along; everything stays inside the run folder, so an interruption loses nothing.
    """
    found = previous_run_files(run_dir)
    if not found:
        return None
    stamp = time.strftime("%Y%m%d-%H%M%S")
    aside = run_dir / f"old-{stamp}"
    for n in range(2, 1000):
        try:
            aside.mkdir(mode=RUN_FOLDER_MODE)
            break
        except FileExistsError:
            aside = run_dir / f"old-{stamp}-{n}"
    config = run_dir / "config.yaml"
    if config.is_file():
        (aside / "config.yaml").write_bytes(config.read_bytes())
    for path in found:  # checkpoints/ last: a move cut short leaves the old run resumable where it was
        os.replace(path, aside / path.name)
    fsync_dir(run_dir)
    return aside


def lock_run_folder(
    lock: RunLock | None, run_dir: Path, saves: Callable[[], list[tuple[int, float]]]
) -> ChainLog | None:
    """Every rank: rank 0 (`lock` given) locks the run folder before anything writes into it, then reads its
    chain.json again (no other process writes it now; a damaged one is kept aside against the `saves` of the
    store); every rank learns the outcome, a refusal as the same one line. Rank 0's chain, None elsewhere."""
    problem, chain = None, None
    if lock is not None:
        try:
            lock.acquire()
            chain = ChainLog(run_dir)
            chain.keep_aside_if_damaged(saves())
        except UserError as exc:
            problem = str(exc)
        except OSError as exc:
            problem = f"cannot lock the run folder {run_dir} ({exc}); check run.out_dir"
    agreed = dist.broadcast_object(problem)
    if agreed is not None:
        raise UserError(str(agreed))
    return chain
