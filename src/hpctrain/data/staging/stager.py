"""The Stager: stages remote input files to node-local scratch just ahead of use, and deletes them after.

Each remote file moves through the states of `FileState`; local rank 0 drives them (a dispatcher thread and up
to `parallel` download threads, all under one condition variable), the other local ranks only wait for final
names and publish what they still need (`peers.NodePeers`). A file appears under its final name only when
complete (`fsutil.atomic_path`: temporary name in the same folder, size check against the remote size, fsync,
rename), so a complete final file left by a killed job is reused after a requeue.
"""

from __future__ import annotations

import enum
import hashlib
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from fsspec.callbacks import Callback

from hpctrain.config.remote import PelicanConfig, StagingConfig
from hpctrain.data.staging.errors import BadFileError, StagingError
from hpctrain.data.staging.peers import NodePeers
from hpctrain.data.staging.scratch import local_name, remove_dead_partials, remove_entry, staging_root
from hpctrain.fsutil import atomic_path
from hpctrain.remote.failures import TransferError, classify_failure, is_folder
from hpctrain.remote.files import RemoteFiles
from hpctrain.remote.uris import FolderError, is_remote
from hpctrain.runtime.budget import check_stop

log = logging.getLogger("hpctrain.staging")


class FileState(enum.Enum):
    """Where one entry of the list is. PENDING -> FETCHING -> READY -> DELETED (released by every local rank,
    or evicted for room; back to PENDING if asked for again); FETCHING -> PENDING (deferred: no room yet, or
    closing); FETCHING -> BAD (the reader gets the error). LOCAL: a local path, never staged."""

    LOCAL = "local"
    PENDING = "pending"
    FETCHING = "fetching"
    READY = "ready"
    DELETED = "deleted"
    BAD = "bad"


class Stager:
    """Stages `uris` (in reading order) to node-local scratch; local paths pass through untouched."""

    def __init__(
        self,
        uris: list[str],
        cfg: StagingConfig | None = None,
        *,
        local_rank: int = 0,
        local_world_size: int = 1,
        job_id: str | None = None,
        pelican: PelicanConfig | None = None,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        if not 0 <= local_rank < local_world_size:
            raise ValueError(f"local_rank {local_rank} is not in [0, local_world_size={local_world_size})")
        self.cfg = cfg or StagingConfig()
        self.uris = [str(u) for u in uris]
        self.local_rank, self.local_world_size = local_rank, local_world_size
        self.wait_seconds = 0.0
        self.stats = {"downloaded": 0, "downloaded_bytes": 0, "reused": 0, "retries": 0, "evicted": 0}
        self._remote = [is_remote(u) for u in self.uris]
        self._names = [local_name(u) for u in self.uris]
        self._files = (
            RemoteFiles(pelican, storage_options, timeout=self.cfg.timeout) if any(self._remote) else None
        )
        self.root = staging_root(self.cfg, job_id) if any(self._remote) else Path(".")
        tag = hashlib.sha1("\n".join(self.uris).encode()).hexdigest()[:12]
        self._peers = NodePeers(self.root / "ctl", tag, local_rank, local_world_size)
        n = len(self.uris)
        self._state = [FileState.PENDING if r else FileState.LOCAL for r in self._remote]
        self._size: list[int | None] = [None] * n
        self._admitted: set[int] = set()  # downloads under way that passed their own budget check
        self._errors: dict[int, BaseException] = {}
        self._requested: set[int] = set()
        self._max_req = -1
        self._demanded: set[int] = set()
        self._cond = threading.Condition()
        self._closing = False
        self._fatal: BaseException | None = None
        self._active = 0
        self._warned_budget = False
        self._thread: threading.Thread | None = None
        if not any(self._remote):
            return
        self._peers.open()
        self._publish()
        if local_rank == 0:
            remove_dead_partials(self.root)
            for marker in self._peers.markers():  # a killed job's, for this list
                remove_entry(marker)
            self._thread = threading.Thread(target=self._run, name="hpctrain-stager", daemon=True)
            self._thread.start()
            log.info("staging %d remote files to %s (ahead=%d)", sum(self._remote), self.root, self.cfg.ahead)

    def __repr__(self) -> str:
        return f"Stager({len(self.uris)} files, root={self.root}, local_rank={self.local_rank})"

    def __enter__(self) -> Stager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def path(self, i: int) -> Path:
        """Where file i is (or will be) staged; the input path itself for a local file."""
        if not self._remote[i]:
            return Path(self.uris[i].removeprefix("file://"))
        return self.root / self._names[i]

    # -- public API: every local rank ------------------------------------------------------------------------
    def get(self, i: int) -> Path:
        """Block until file i is local and return its path; raises BadFileError if it cannot be staged."""
        if not self._remote[i]:
            local = self.path(i)
            if not local.exists():
                raise BadFileError(self.uris[i], "no such local file")
            return local
        start = time.monotonic()
        try:
            return self._get_rank0(i) if self.local_rank == 0 else self._get_waiting(i)
        finally:
            self.wait_seconds += time.monotonic() - start

    def release(self, i: int) -> None:
        """This rank is done with file i: it may be deleted once every local rank is done with it."""
        if not self._remote[i]:
            return
        with self._cond:
            self._requested.discard(i)
            if self.local_rank == 0:
                self._evict(self._node_view(), force=False)
                self._cond.notify_all()
        if self.local_rank != 0:
            self._publish()

    def close(self) -> None:
        """Stop staging. Rank 0 keeps serving until the other local ranks closed (bounded by wait_timeout)."""
        if self._thread is None:
            if any(self._remote) and not self._closing:
                self._closing = True
                self._publish(closed=True)
            return
        deadline = time.monotonic() + self.cfg.wait_timeout
        while self.local_world_size > 1 and time.monotonic() < deadline and self._thread.is_alive():
            if self._peers.all_closed():
                break
            time.sleep(0.05)
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join()
        self._thread = None
        with self._cond:
            self._evict(self._node_view(), force=False)
        self._publish(closed=True)

    # -- rank 0 ----------------------------------------------------------------------------------------------
    def _get_rank0(self, i: int) -> Path:
        with self._cond:
            self._requested.add(i)
            self._max_req = max(self._max_req, i)
            if self._state[i] == FileState.DELETED:
                self._state[i] = FileState.PENDING
            self._demanded.add(i)
            self._cond.notify_all()
            try:
                while self._state[i] in (FileState.PENDING, FileState.FETCHING):
                    if self._fatal is not None or self._thread is None:
                        raise StagingError(f"staging stopped: {self._fatal_message()}") from self._fatal
                    check_stop()  # a stop (signal, deadline) must not wait for a slow download
                    self._cond.wait(0.5)
            finally:
                self._demanded.discard(i)
            if i in self._errors:
                raise self._errors[i]
            return self.path(i)

    def _run(self) -> None:
        """Dispatch files to up to `parallel` download threads, in reading order, within the budget."""
        pool = ThreadPoolExecutor(self.cfg.parallel, thread_name_prefix="hpctrain-stage")
        try:
            while True:
                with self._cond:
                    if self._closing or self._fatal is not None:
                        return
                    view = floor, max_want, demanded = self._node_view()
                    self._evict(view, force=False)
                    j = self._next(floor, max_want, demanded) if self._active < self.cfg.parallel else None
                    if j is None:
                        self._cond.wait(0.05 if self.local_world_size > 1 else 0.5)
                        continue
                    self._state[j] = FileState.FETCHING
                    self._active += 1
                pool.submit(self._stage, j, j in demanded)
        except BaseException as err:
            self._fail(err)
        finally:
            pool.shutdown(wait=True)

    def _fail(self, err: BaseException) -> None:
        """A bug, or scratch failing: stop, and wake every waiting reader (other ranks via a marker)."""
        with self._cond:
            self._fatal = err
            self._cond.notify_all()
        log.error("staging failed: %s", self._fatal_message())
        try:
            self._peers.mark_fatal(self._fatal_message())
        except OSError as exc:  # scratch failing is often why we stop: the waiting ranks then time out
            log.warning("cannot tell the other local ranks that staging stopped: %s", exc)

    def _fatal_message(self) -> str:
        if self._fatal is None:
            return "closed"
        text = (
            str(self._fatal)
            if isinstance(self._fatal, StagingError)
            else f"{type(self._fatal).__name__}: {self._fatal}"
        )
        return self._files.scrub(text) if self._files else text

    def _next(self, floor: float, max_want: int, demanded: set[int]) -> int | None:
        for j in sorted(demanded):
            if self._state[j] in (FileState.PENDING, FileState.DELETED):
                return j
        for j in range(
            max(0, int(min(floor, len(self.uris)))), min(len(self.uris), max_want + self.cfg.ahead + 1)
        ):
            if self._state[j] == FileState.PENDING:
                # in order: a later, smaller file must not overtake one that waits for room
                return j if self._fits(j, False) else None
        return None

    def _fits(self, j: int, demanded: bool) -> bool:
        """Room for file j in the budget, evicting released files if needed (caller holds the lock)."""
        # A download under way that has not passed its own check (its size unknown, or known from a try
        # deferred for room) would count as 0 bytes here, or lose the room to this later file if this one
        # checked first: wait until it has (it notifies). Both seen on a loaded machine: two prefetches both
        # fit; a file deferred again for the one after it, then needed over the budget. (_unchecked is only
        # ever true with max_bytes set.)
        if not demanded and any(self._unchecked(k) for k in range(len(self.uris)) if k != j):
            return False

        def used() -> dict[str, int]:  # staged or being staged, other than j
            states = (FileState.READY, FileState.FETCHING)
            return {
                self._names[k]: self._size[k] or 0
                for k in range(len(self.uris))
                if self._state[k] in states and k != j
            }

        def ok(held: dict[str, int]) -> bool:
            files = len(held) + 1 <= (self.cfg.max_files or 1 << 62)
            return files and sum(held.values()) + (self._size[j] or 0) <= (self.cfg.max_bytes or 1 << 62)

        if ok(used()):
            return True
        self._evict(self._node_view(), force=True)
        held = used()
        if ok(held) or not held:
            return True
        if demanded and not self._warned_budget:
            self._warned_budget = True
            log.warning("staging budget (max_files/max_bytes) too small: fetching a needed file over it")
        return demanded

    def _evict(self, view: tuple[float, int, set[int]], force: bool) -> None:
        """Delete staged files below every rank's floor (delete_after_use, or `force` to make room), unless the
        same file comes again within the prefetch window (a URI listed twice, e.g. the next epoch's start) and
        every file before that entry is staged or has its room: kept earlier, it would hold room that a file
        read sooner needs (that one was then fetched over the budget). One that comes again only later is
        fetched again then, so that it does not sit in the budget."""
        if not (self.cfg.delete_after_use or force):
            return
        floor, max_want, _ = view
        n = len(self.uris)
        low = int(min(floor, n))
        window: dict[str, int] = {}  # name -> its first entry in the window
        for j in range(low, min(n, max_want + self.cfg.ahead + 1)):
            window.setdefault(self._names[j], j)
        for k in range(low):
            if self._state[k] != FileState.READY:
                continue
            later = window.get(self._names[k])
            if later is not None and self._has_room_before(low, later):
                # the file now belongs to its later entry (counted in the budget from now on)
                if self._state[later] in (FileState.PENDING, FileState.DELETED):
                    self._state[later], self._size[later] = FileState.READY, self._size[k]
                    self.stats["reused"] += 1
                self._state[k] = FileState.DELETED
                continue
            self.path(k).unlink(missing_ok=True)
            self._state[k] = FileState.DELETED
            self.stats["evicted"] += 1

    def _has_room_before(self, low: int, later: int) -> bool:
        """Every entry in [low, later) is staged, bad, local, or downloading with its room (caller holds the
        lock): a file kept for entry `later` then takes no room a file read before it still needs."""
        waiting = (FileState.PENDING, FileState.DELETED)
        return not any(self._state[k] in waiting or self._unchecked(k) for k in range(low, later))

    def _unchecked(self, k: int) -> bool:
        """Entry k is downloading but has not passed its byte-budget check yet (caller holds the lock)."""
        return (
            self.cfg.max_bytes is not None
            and self._state[k] == FileState.FETCHING
            and k not in self._admitted
        )

    def _node_view(self) -> tuple[float, int, set[int]]:
        """(lowest index any local rank may still read, highest index asked for, indices someone waits on)."""
        floor: float = min([*self._requested, self._max_req + 1])
        max_want, demanded = max(self._max_req, 0), set(self._demanded)
        for view in self._peers.views():
            floor = min(floor, view.floor)
            max_want = max(max_want, view.max_req)
            if view.waiting is not None:
                demanded.add(int(view.waiting))
        return floor, max_want, demanded

    def _stage(self, j: int, demanded: bool) -> None:
        """One download thread's job: stage file j and record the outcome."""
        state, size, reused = FileState.PENDING, 0, False
        try:
            size, reused = self._fetch(j, demanded)
            state = FileState.READY
            log.debug("staged %s (%d bytes%s)", self.uris[j], size, ", reused" if reused else "")
        except BadFileError as err:
            self._peers.mark_bad(self._names[j], err.reason)
            log.warning("cannot stage %s", err)
            state = FileState.BAD
            self._errors[j] = err
        except FolderError as err:  # a mistake in the list, not a bad file: its reader raises it (UserError)
            self._peers.mark_folder(self._names[j], err.uri)
            state = FileState.BAD
            self._errors[j] = err
        except _Deferred:
            pass  # no room yet, or closing: back to pending
        except BaseException as err:
            self._fail(err)
        finally:
            with self._cond:
                self._state[j] = state
                self._admitted.discard(j)
                if state == FileState.READY:
                    self._size[j] = size
                    self.stats["reused" if reused else "downloaded"] += 1
                    self.stats["downloaded_bytes"] += 0 if reused else size
                self._active -= 1
                self._cond.notify_all()

    def _fetch(self, j: int, demanded: bool) -> tuple[int, bool]:
        """Stage file j (or reuse a complete copy): (size, reused). Retries transient failures."""
        assert self._files is not None
        uri = self.uris[j]
        fs, path = self._files.resolve(uri)
        if uri.endswith("/"):
            raise FolderError(uri)  # pelicanfs would make a folder at the temporary name for it
        attempt = 0
        while True:
            try:
                return self._attempt(j, fs, path, demanded)
            except (_Deferred, StagingError):
                raise
            except Exception as err:
                if is_folder(fs, path):  # a folder answers 403/404/405, a listing or a short transfer
                    raise FolderError(uri) from None
                kind, reason = classify_failure(err, fs, path, self._files.scrub)
                if kind == "fatal":
                    raise StagingError(f"{uri}: {reason}") from None
                if kind == "bad":
                    raise BadFileError(uri, reason) from None
                attempt += 1
                if attempt > self.cfg.retries:
                    raise BadFileError(uri, f"gave up after {attempt} attempts: {reason}") from None
                self.stats["retries"] += 1
                delay = min(self.cfg.backoff_cap, self.cfg.backoff_base * 2 ** (attempt - 1))
                log.warning("staging %s: %s; retry %d in %.2f s", uri, reason, attempt, delay)
                with self._cond:
                    if self._cond.wait_for(lambda: self._closing, delay):
                        raise BadFileError(uri, "staging closed during retries") from None

    def _attempt(self, j: int, fs: Any, path: str, demanded: bool) -> tuple[int, bool]:
        """One try: download to a temporary name (streamed by the filesystem), check the size, fsync, rename.
        A failed try leaves nothing: a half file, or the folder pelicanfs makes for a collection, goes."""
        final, size = self.path(j), None
        if self.cfg.max_bytes is not None or final.exists():
            # the size first: to keep the byte budget, or to check a file left by an earlier job
            size = int(fs.size(path))
            with self._cond:
                self._size[j] = size
                self._cond.notify_all()  # a prefetch may wait for this check (see _fits)
                if not self._fits(j, demanded):
                    raise _Deferred()
                self._admitted.add(j)
            if final.exists() and final.stat().st_size == size:
                return size, True
        progress = _Progress(lambda: self._closing)
        with atomic_path(final) as tmp:  # readers (the other local ranks) see the file only complete
            fs.get_file(path, str(tmp), callback=progress)
            got = tmp.stat().st_size
            expected = size if size is not None else progress.size
            expected = int(expected if expected is not None else fs.size(path))
            if got != expected:
                raise TransferError(f"got {got} bytes, expected {expected}")
            if got == 0 and is_folder(fs, path):  # a folder's HEAD may announce 0 bytes
                raise FolderError(self.uris[j])
        return got, False

    # -- other local ranks -----------------------------------------------------------------------------------
    def _get_waiting(self, i: int) -> Path:
        self._requested.add(i)
        self._max_req = max(self._max_req, i)
        self._publish(waiting=i)
        final = self.path(i)
        deadline, pause = time.monotonic() + self.cfg.wait_timeout, 0.005
        try:
            while not final.exists():
                self._peers.raise_if_marked(self._names[i], self.uris[i])
                check_stop()
                if time.monotonic() > deadline:
                    raise StagingError(
                        f"local rank {self.local_rank} waited {self.cfg.wait_timeout:.0f} s for local rank 0 "
                        f"to stage {self.uris[i]}; does local rank 0 run a Stager over the same file list?"
                    )
                time.sleep(pause)
                pause = min(pause * 2, 0.1)
        finally:
            self._publish()
        return final

    def _publish(self, waiting: int | None = None, closed: bool = False) -> None:
        """Tell local rank 0 what this rank may still read (nothing to tell on local rank 0 itself)."""
        self._peers.publish(min([*self._requested, self._max_req + 1]), self._max_req, waiting, closed)


class _Deferred(Exception):
    """No room in the scratch budget yet for a file nobody waits for, or closing."""


class _Progress(Callback):
    """Learns the size a transfer announces; stops the transfer when the stager closes."""

    def __init__(self, stop: Callable[[], bool]) -> None:
        super().__init__()
        self.size: int | None = None
        self._stop = stop

    def set_size(self, size: int | None) -> None:
        self.size = size

    def relative_update(self, inc: int = 1) -> None:
        if self._stop():
            raise _Deferred()
