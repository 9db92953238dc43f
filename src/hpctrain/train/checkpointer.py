"""Saving: the trainer's parts as a snapshot through the checkpoint store's commit protocol (checkpoint.py), then
the copies elsewhere (a pelican:// checkpoint.dir or mirror_to in the background, remote_ckpt.py; any other
mirror_to by FolderMirror in a thread)."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from hpctrain.config.dump import config_hash
from hpctrain.config.schema import ConfigBase
from hpctrain.errors import RunError
from hpctrain.remote.mirror import FolderMirror, run_mirror
from hpctrain.runtime import dist
from hpctrain.train.checkpoint import CheckpointStore
from hpctrain.train.parts import Parts, snapshot
from hpctrain.train.remote_ckpt import RemoteCheckpoints

if TYPE_CHECKING:
    from hpctrain.runtime.budget import TimeBudget
    from hpctrain.track.base import Trackers

log = logging.getLogger(__name__)


class Checkpointer:
    """Saves the parts registered with it (once, when they exist; a part replaced later, as rank 0's trackers
    at the start of tracking, is registered again under its name): every save and resume sees the same dict."""

    def __init__(self, cfg: ConfigBase, store: CheckpointStore, is_main: bool) -> None:
        self.cfg, self.store, self.is_main = cfg, store, is_main
        self.parts: Parts = {}  # name in the snapshot -> the live object (state_dict / load_state_dict)
        self.last_saved_step: int | None = None  # set by a resume too
        # Every hop's config changes so far (kept in each snapshot) and this hop's, set by the resume
        # (resume.Resumed): {"accepted": {key: [old, new]}, "allowed": ...}.
        self.config_changes: list[dict[str, Any]] = []
        self.changes: dict[str, dict[str, list[Any]]] = {"accepted": {}, "allowed": {}}
        self.remote = RemoteCheckpoints(cfg)  # pelican:// checkpoint.dir / mirror_to uploads
        self._mirror: threading.Thread | None = None
        self._mirror_copier: FolderMirror | None = None  # one per run: it remembers what a remote has
        # why the last mirror copy failed (None: it arrived, or none ran)
        self._mirror_error: str | None = None

    def hop_identity(self) -> dict[str, Any]:
        """What chain.json and the hop's first metrics record say about this hop's configuration."""
        return {
            "config_hash": config_hash(self.cfg),
            "accepted_changes": self.changes["accepted"],
            "allowed_changes": self.changes["allowed"],
        }

    def register(self, **parts: Any) -> None:
        """Parts by the names the snapshot keeps them under; None (an optional part this run lacks) is none."""
        self.parts.update({name: part for name, part in parts.items() if part is not None})

    def save(self, step: int, best: bool = False) -> float:
        """Every rank: build the snapshot (a collective inside); rank 0 commits it; all wait for the commit.
        Returns the seconds it took (the budget's save estimate)."""
        start = time.perf_counter()
        state = snapshot(self.parts, self.cfg, self.config_changes)
        trackers = cast("Trackers", self.parts["trackers"])
        if self.is_main:
            # The previous mirror copy reads files this save replaces and prunes: let it finish first.
            self.close()
            # Before the commit: what was logged up to this update is on disk once `latest` names it (a run
            # resumed from it logs only the updates after it).
            trackers.flush()
            try:
                path = self.store.save(state, step, best=best)
            except (
                OSError
            ) as exc:  # a full disk, a quota, a read-only folder: nothing of the last commit is lost
                kept = f"update {self.last_saved_step}" if self.last_saved_step is not None else "nothing yet"
                raise RunError(
                    f"cannot write the checkpoint of update {step} into {self.store.folder}: "
                    f"{exc.strerror or exc}; the last complete checkpoint ({kept}) is kept: free space (or fix "
                    "the folder's permissions, or set run.out_dir elsewhere) and run the same command again"
                ) from None
            # pelican:// checkpoint.dir / mirror_to: in the background, the newest wins (else nothing)
            self.remote.submit(path.parent)
            mirror_to = self.cfg.checkpoint.mirror_to
            if mirror_to and not self.remote.takes(mirror_to):  # into the run's own <mirror_to>/<run name>/
                self._mirror_in_background(path.parent, run_mirror(mirror_to, self.cfg.run.name or ""))
        self.last_saved_step = step
        dist.barrier()
        return time.perf_counter() - start

    def _mirror_in_background(self, folder: Path, dest: str) -> None:
        """Copy in a thread: the training goes on meanwhile (the next save waits for it, see save)."""
        if self._mirror_copier is None:
            self._mirror_copier = FolderMirror(dest)
        copier = self._mirror_copier

        def copy() -> None:
            try:
                copier.sync(folder, last=("latest",))
                self._mirror_error = None
            except Exception as exc:  # a failed mirror loses nothing local: warn and go on
                self._mirror_error = f"{type(exc).__name__}: {exc}"
                log.warning("mirroring checkpoints to %s failed: %s", dest, exc)

        self._mirror = threading.Thread(target=copy, name="checkpoint-mirror", daemon=False)
        self._mirror.start()

    def close(self) -> None:
        """Wait for a mirror copy under way."""
        if self._mirror is not None:
            self._mirror.join()
            self._mirror = None

    def settle(self, budget: TimeBudget | None) -> dict[str, str]:
        """At the end of a hop, before its outcome is written: wait for the copies of the last save (the mirror
        copy; the uploads, never past the walltime) and return {destination: why it is not up to date} for each
        copy that failed (empty: every copy arrived, or there is none). Rank 0."""
        self.close()
        failed = self.remote.finish(budget)
        mirror_to = self.cfg.checkpoint.mirror_to
        if mirror_to and not self.remote.takes(mirror_to) and self._mirror_error is not None:
            failed[str(mirror_to)] = self._mirror_error
        return failed
