"""Checkpoints on a Pelican/OSDF federation: the token before anything starts, uploads after each commit, and
resuming from the federation (`checkpoint.dir`, `checkpoint.resume: pelican://...`).

The trainer calls four things, each a no-op without a Pelican destination:
    prepare_tokens(cfg)               at start (entry.run): the OIDC login the run needs (data.pelican.auto_token)
    RemoteCheckpoints.submit(folder)  after a commit: upload in the background (newest wins, retried)
    RemoteCheckpoints.finish(budget)  at the end: wait for the last upload, never past the walltime; what failed
    pull_working_copy(cfg, store)     before resuming: an empty working copy gets the remote latest
    local_resume_path(cfg, env, run_dir, given)  checkpoint.resume=pelican://...: staged, then read as a file
"""

from __future__ import annotations

import functools
import getpass
import hashlib
import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpctrain.config.secrets import mask_secrets
from hpctrain.errors import UserError
from hpctrain.fsutil import atomic_write_text, make_folders, private_folder
from hpctrain.remote.mirror import CLAIM, claim_local, claim_text, claimed_by, run_mirror
from hpctrain.remote.oidc import ensure_login
from hpctrain.remote.pelican_write import (
    PelicanWriter,
    RemoteWriteError,
    fetch_checkpoint,
    is_pelican,
    sync_checkpoints,
)
from hpctrain.remote.upload import Uploader, stop_by
from hpctrain.remote.uris import is_remote

if TYPE_CHECKING:
    from hpctrain.runtime.budget import TimeBudget
    from hpctrain.runtime.env import ClusterEnv
    from hpctrain.train.checkpoint import CheckpointStore

log = logging.getLogger(__name__)
_MARGIN = 5.0  # seconds kept after the last upload wait, for the exit itself


def prepare_tokens(cfg: Any) -> None:
    """With data.pelican.auto_token: make sure a cached (or, at a terminal, a new) login covers the run's
    Pelican inputs and outputs; a batch job without one stops here with the login hint (exit 2)."""
    pelican = cfg.data.pelican
    if not pelican.auto_token:
        return
    ensure_login(pelican, *pelican_uris(cfg))


def pelican_uris(cfg: Any) -> tuple[list[str], list[str]]:
    """(URIs the run reads, URIs it writes): inputs and a remote resume; checkpoint and TensorBoard copies."""
    reads = [str(p) for name in type(cfg.data).input_paths for p in _as_list(getattr(cfg.data, name))]
    if is_pelican(cfg.checkpoint.resume):
        reads.append(cfg.checkpoint.resume)
    writes = [
        d
        for d in (cfg.checkpoint.dir, cfg.checkpoint.mirror_to, cfg.logging.tensorboard.mirror_to)
        if is_pelican(d)
    ]
    return reads, writes


def _as_list(value: Any) -> list[Any]:
    return [value] if isinstance(value, str) else list(value or ())


def pelican_destinations(cfg: Any) -> list[str]:
    """Where checkpoints go on the federation: checkpoint.dir itself, and `<run name>/checkpoints/` under a
    pelican:// checkpoint.mirror_to (where the mirror puts them for any other destination too)."""
    out = [str(cfg.checkpoint.dir)] if cfg.checkpoint.dir else []
    if is_pelican(cfg.checkpoint.mirror_to):
        out.append(run_mirror(str(cfg.checkpoint.mirror_to), cfg.run.name) + "/checkpoints")
    return out


def claim_destinations(cfg: Any, run_dir: Path) -> None:
    """At a start, before anything is read or moved (rank 0): the places outside the run folder that its
    copies go to are this run's, or become so. A copy removes what its run pruned, so two runs sharing one
    would replace and delete each other's checkpoints: a local checkpoint.mirror_to folder is claimed by the
    run folder (remote/mirror.py), a pelican:// checkpoint.dir by the run's name (a chain may move between
    clusters: its run folder's path changes, its name does not). Another run's claim is one line, exit 2; a
    federation that does not answer now is a warning. The start only reads the claim (one GET, no upload to
    wait for); the first upload of the process checks it again and writes it before anything else."""
    mirror_to = cfg.checkpoint.mirror_to
    if mirror_to and not is_remote(mirror_to):
        folder = Path(run_mirror(mirror_to, cfg.run.name).removeprefix("file://")).expanduser()
        claim_local(folder, cfg.run.name, run_dir, "checkpoint.mirror_to")
    if cfg.checkpoint.dir:
        writer = PelicanWriter(cfg.checkpoint.dir, cfg.data.pelican)
        try:
            claim_remote(writer, cfg.run.name, run_dir, write=False)  # one GET; the first upload writes it
        except RemoteWriteError as exc:
            log.warning(
                "checkpoint.dir=%s: cannot check whose checkpoints it holds now (%s)", writer.uri, exc
            )


def claim_remote(writer: PelicanWriter, run_name: str, run_dir: Path, write: bool = True) -> None:
    """The folder `writer` writes to holds run `run_name`'s checkpoints (its claim), or nothing yet (claimed
    now, with `write`); UserError when another run's."""
    for attempt in (0, 1):
        owner = claimed_by(writer.read(CLAIM))
        if owner is not None and owner[0] != run_name:
            raise UserError(
                f"checkpoint.dir={writer.uri} holds the checkpoints of run {owner[0]!r} (its {CLAIM}), not of "
                f"{run_name!r}: each run needs a checkpoint.dir of its own (a sweep's too: use "
                "checkpoint.mirror_to, which keeps each run in <mirror_to>/<run name>/)"
            )
        if owner is not None or not write or attempt:
            return
        # claimed now, then read back: of two runs claiming at once, the later write wins and the other sees it
        writer.put(None, CLAIM, data=claim_text(run_name, run_dir).encode())


class RemoteCheckpoints:
    """Rank 0's uploads of the checkpoint folder to the federation (no destination: does nothing)."""

    def __init__(self, cfg: Any) -> None:
        self.dests = list(dict.fromkeys(pelican_destinations(cfg)))
        self.pelican = cfg.data.pelican
        self.claimed_dir = str(cfg.checkpoint.dir) if cfg.checkpoint.dir else None  # the one with a claim
        self.run_name = cfg.run.name or ""
        self.run_dir = cfg.run.dir if cfg.run.name else Path(".")
        self._claim_checked: set[str] = set()
        self._uploaders: dict[str, Uploader] = {}
        self._sent: dict[str, dict[str, tuple[int, int]]] = {d: {} for d in self.dests}

    def takes(self, dest: str | None) -> bool:
        """Whether `dest` (checkpoint.mirror_to) is uploaded here rather than by the plain mirror."""
        return is_pelican(dest)

    def submit(self, folder: Path) -> None:
        for dest in self.dests:
            if dest not in self._uploaders:
                self._uploaders[dest] = Uploader(f"checkpoints to {dest}")
            writer = PelicanWriter(dest, self.pelican)
            self._uploaders[dest].submit(functools.partial(self._sync, dest, folder, writer))

    def _sync(self, dest: str, folder: Path, writer: PelicanWriter) -> None:
        """One upload job: the checkpoint.dir's claim checked first (once per process; the start checked it
        unless the federation did not answer), then the sync, which removes the step files the run pruned."""
        if dest == self.claimed_dir and dest not in self._claim_checked:
            try:
                claim_remote(writer, self.run_name, self.run_dir)
            except UserError as exc:
                refused = RemoteWriteError(str(exc))
                refused.permanent = True
                raise refused from None
            self._claim_checked.add(dest)
        sync_checkpoints(folder, writer, self._sent[dest])

    def finish(self, budget: TimeBudget | None) -> dict[str, str]:
        """Wait for the last uploads, but never past the deadline (minus a margin for the exit); returns
        {destination: why its copy is not up to date} for each that failed or was cut short (empty: all
        arrived). A wait is said first, with how long it may take."""
        remaining = budget.remaining() if budget is not None else None
        timeout = None if remaining is None else max(0.0, remaining - _MARGIN)
        stop_by(None if timeout is None else time.monotonic() + timeout)  # TensorBoard's close too
        failed = {}
        for dest, uploader in self._uploaders.items():
            if uploader.busy():
                limit = "until it ends" if timeout is None else f"at most {timeout:.0f} s"
                log.info("waiting for the upload of the checkpoints to %s (%s)", dest, limit)
            if uploader.close(timeout):
                log.info("checkpoints uploaded to %s", dest)
            else:
                failed[dest] = uploader.error or "not uploaded"
        self._uploaders.clear()
        return failed


def pull_working_copy(cfg: Any, store: CheckpointStore) -> None:
    """An empty local working copy of a remote checkpoint.dir gets the remote latest (and its sidecar)."""
    dest = cfg.checkpoint.dir
    if not dest or cfg.checkpoint.resume_form.kind == "never" or store.has_checkpoints():
        return  # never: a new run, whose first upload replaces the remote `latest`
    try:
        got = fetch_checkpoint(dest, store.folder, cfg.data.pelican, log.info)
    except RemoteWriteError as exc:
        raise UserError(f"checkpoint.dir={dest}: cannot read the remote checkpoints: {exc}") from None
    if got is not None:
        atomic_write_text(store.folder / "latest", got.name + "\n")  # the pointer last, as in a commit


def local_resume_path(cfg: Any, env: ClusterEnv, run_dir: Path, given: str) -> str:
    """checkpoint.resume as a local path: a pelican:// file or folder is staged first, to scratch on one node;
    with several nodes into `<run folder>/resume-staged/` (the other ranks read the file rank 0 chose, and a
    node's scratch is its own)."""
    if not is_pelican(given):
        return given
    digest = hashlib.sha256(mask_secrets(given).encode()).hexdigest()[:12]  # a renewed token: the same file
    if env.world_size > env.local_world_size:
        dest = make_folders(run_dir / "resume-staged" / digest)
    else:
        scratch = cfg.data.staging.dir or os.environ.get("SLURM_TMPDIR") or os.environ.get("TMPDIR") or "/tmp"
        # a shared /tmp: someone else could have made the folder first, or a link there (data/staging's rule)
        dest = private_folder(
            Path(scratch) / f"hpctrain-{getpass.getuser()}" / f"resume-{digest}",
            "checkpoint.resume's staging folder",
            "set data.staging.dir to a folder of your own",
        )
    try:
        got = fetch_checkpoint(given, dest, cfg.data.pelican, log.info)
    except RemoteWriteError as exc:
        raise UserError(f"checkpoint.resume={given}: {exc}") from None
    if got is None:
        raise UserError(f"checkpoint.resume={given}: no `latest` checkpoint in this remote folder")
    return str(got)
