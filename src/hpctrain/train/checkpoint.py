"""Checkpoint commit protocol.

A save writes the sidecar (the file's SHA-256 and its place in the order of saves) first, then the whole file
under a temporary name in the same folder (named after its writer's pid and host), fsyncs it, renames it to
`step_XXXXXXXX.pt`, and only then moves the `latest` pointer (also written to a temporary name and renamed). A
file under its final name thus always has its hash beside it. A save of a new best checkpoint first writes
`best.pt` and its sidecar `best.json` the same way: everything a save writes is complete before `latest` names
it, so a kill before the move resumes from the previous checkpoint and does the evaluation and the best save
again, and a kill after it finds them done. Old checkpoints are pruned after the move, by recency, never the one
`latest` names (a kill there leaves one too many until the next save). A loader verifies the hash and falls back
to older checkpoints when one is unreadable or has no sidecar (its bytes cannot be checked: refused, never
loaded unverified), then to best.pt (only with its best.json); when a folder holds checkpoints and none can be
used it fails (RunError) rather than let a run start again from zero over them.
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import logging
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from hpctrain.errors import RunError, UserError
from hpctrain.fsutil import atomic_write_bytes, atomic_write_text, make_folders
from hpctrain.train.exported import is_export, read_export

log = logging.getLogger(__name__)

_STEP_FILE = re.compile(r"^step_(\d{8,})\.pt$")
PREFIXES = ("module.", "_orig_mod.")
FORMAT_VERSION = 1
FULL_STATE_KEYS = ("modules", "optimizers", "counters", "rng", "data")
# Seconds to wait before the 2nd and 3rd read of a checkpoint whose read failed with an I/O error that may be
# transient (a parallel file system's hiccup), or whose bytes did not match their hash (a stale page).
READ_RETRY_DELAYS = (0.5, 2.0)
_PERMANENT_ERRNOS = {errno.ENOENT, errno.ENOTDIR, errno.EISDIR, errno.EACCES, errno.EPERM}


def strip_prefixes(state: dict[str, Any]) -> dict[str, Any]:
    """Accept state dicts saved from DDP (`module.`) or compiled (`_orig_mod.`) networks, in any nesting."""
    out = {}
    for key, value in state.items():
        while key.startswith(PREFIXES):
            key = key.split(".", 1)[1]
        out[key] = value
    return out


class Unreadable(Exception):
    """A checkpoint file that cannot be used; the message says why (for one line naming every file)."""


class NoUsableCheckpoint(RunError):
    """Checkpoints there, none usable: `what` names each file's reason; the message adds training's advice."""

    def __init__(self, what: str) -> None:
        self.what = what
        super().__init__(
            f"{what}; nothing was changed: restore them (e.g. from checkpoint.mirror_to) and run again, or start "
            "afresh with checkpoint.resume=never (the old run is moved aside)"
        )


class CheckpointStore:
    """The checkpoints of one run folder.

    Each sidecar `step_XXXXXXXX.json` records the file's SHA-256 and `seq`, the order in which this run folder's
    checkpoints were written: recency, not the step number, decides which ones are kept and tried first (a run
    resumed from an older checkpoint writes lower step numbers than the newest file on disk).
    """

    def __init__(self, folder: Path, keep_last: int) -> None:
        self.folder = folder
        self.keep_last = keep_last
        self._seq: int | None = None  # of the last save, read from the sidecars at the first save

    def path_for(self, step: int) -> Path:
        return self.folder / f"step_{step:08d}.pt"

    def clean_temporaries(self) -> None:
        """Remove half-written files whose writer is dead (a killed save); a live writer's are left alone."""
        from hpctrain.train.runlock import clean_temporaries  # torch (dist)

        clean_temporaries(self.folder, "checkpoint file from a killed save")

    def save(self, state: dict[str, Any], step: int, best: bool = False) -> Path:
        """Commit `state` as update `step` (and as best.pt): serialize and hash, [best.json + best.pt], the step
        file's sidecar + the step file, then `latest`; then prune. Returns the step file."""
        import torch

        make_folders(self.folder)
        buffer = io.BytesIO()
        torch.save(state, buffer)
        data = buffer.getvalue()
        digest = hashlib.sha256(data).hexdigest()
        if self._seq is None:
            self._seq = max((seq for seq, _step, _path in self._recency()), default=0)
        self._seq += 1
        sidecar = {"step": step, "sha256": digest, "seq": self._seq, "saved": time.time()}
        path = self.path_for(step)
        if best:
            # best.pt belongs to the commit, and comes first: a step file that exists (loadable even before
            # `latest` names it, when `latest` is missing) always has its best.pt complete beside it; a kill
            # before `latest` moves resumes from the previous checkpoint, which evaluates and saves best again.
            self._write_pair(self.folder / "best.pt", data, sidecar)
        self._write_pair(path, data, sidecar)
        # The pointer moves last: until here, `latest` still names the previous good checkpoint.
        atomic_write_text(self.folder / "latest", path.name + "\n")
        # After the commit: a kill here only leaves an old file too many (the next save, or a finished run's
        # next start, prunes it).
        self._prune(keep=path)
        return path

    @staticmethod
    def _write_pair(path: Path, data: bytes, sidecar: dict[str, Any]) -> None:
        """A checkpoint file and its sidecar, the sidecar first: a kill between the two writes leaves a hash
        without its file (ignored), never a file under its final name without its hash (refused on load, so a
        run's only checkpoint would be lost). A file saved again (best.pt, a step saved again at the same
        update) keeps the hashes of the bytes it replaces in `replaces` while its new bytes move in: whichever
        bytes a kill leaves there still verify; the sidecar then names only the new ones."""
        side = path.with_suffix(".json")
        old = _accepted_hashes(path) if path.exists() else []
        atomic_write_text(side, json.dumps({**sidecar, "replaces": old} if old else sidecar))
        atomic_write_bytes(path, data)
        if old:
            atomic_write_text(side, json.dumps(sidecar))

    def prune(self) -> None:
        """Redo the pruning of the last save (a kill may have cut it short), keeping what `latest` names."""
        kept = self.candidates()[:1]
        if kept:
            self._prune(keep=kept[0])

    def _prune(self, keep: Path) -> None:
        """Keep the `keep_last` most recently written step checkpoints (always `keep`, the one just written)."""
        for _seq, _step, path in self._recency()[self.keep_last :]:
            if path != keep:
                path.unlink(missing_ok=True)
                path.with_suffix(".json").unlink(missing_ok=True)
        for side in self.folder.glob("step_*.json"):  # the sidecar of a save killed before its file moved in
            if not side.with_suffix(".pt").exists():
                side.unlink(missing_ok=True)

    def _step_files(self) -> list[tuple[int, Path]]:
        try:
            names = os.listdir(self.folder)
        except FileNotFoundError:
            return []
        except OSError as exc:  # a listing that fails is no empty folder: never start afresh over it
            raise RunError(
                f"cannot list the checkpoints in {self.folder}: {exc.strerror}; try again"
            ) from None
        found = []
        for name in names:
            match = _STEP_FILE.match(name)
            if match:
                found.append((int(match.group(1)), self.folder / name))
        return found

    def _recency(self) -> list[tuple[int, int, Path]]:
        """(seq, step, path) of every step checkpoint, most recently written first (no seq: by step, oldest)."""
        ordered = []
        for step, path in self._step_files():
            try:
                seq = int(json.loads(path.with_suffix(".json").read_text()).get("seq", 0))
            except (OSError, ValueError, TypeError, AttributeError, RecursionError):
                seq = 0
            ordered.append((seq, step, path))
        return sorted(ordered, key=lambda item: (item[0], item[1]), reverse=True)

    def saves(self) -> list[tuple[int, float]]:
        """(update, time saved) of every step checkpoint with its sidecar: what chain.json can be rebuilt from."""
        found = []
        for step, path in self._step_files():
            try:
                saved = json.loads(path.with_suffix(".json").read_text())["saved"]
            except (OSError, ValueError, KeyError, TypeError, RecursionError):
                continue
            if isinstance(saved, (int, float)) and not isinstance(saved, bool) and 0 <= saved <= 1e11:
                found.append((step, float(saved)))  # (NaN and 1e300 fail the test: no time, left out)
        return found

    def candidates(self) -> list[Path]:
        """`latest` first, then every step checkpoint, most recently written first."""
        ordered: list[Path] = []
        pointer = self.folder / "latest"
        try:
            named = pointer.read_bytes()[:256].decode("utf-8", "replace").strip()
        except FileNotFoundError:
            named = None
        except OSError as exc:
            named = None
            log.warning("cannot read %s (%s); trying the step checkpoints", pointer, exc.strerror)
        if named is not None and _STEP_FILE.match(named):
            ordered.append(self.folder / named)
        elif named is not None:  # damaged, or a name outside the folder: never followed
            log.warning("%s names no step checkpoint (%r); trying the step checkpoints", pointer, named[:40])
        for _seq, _step, path in self._recency():
            if path not in ordered:
                ordered.append(path)
        return ordered

    def has_checkpoints(self) -> bool:
        """Whether this folder holds any checkpoint (readable or not): then a resume must not start afresh."""
        return bool(self._step_files()) or any((self.folder / n).exists() for n in ("latest", "best.pt"))

    def load_latest(self) -> tuple[dict[str, Any], Path] | None:
        """The most recent checkpoint that loads, else best.pt if it holds a full training state and its
        best.json (warned).

        None when the folder holds no checkpoint at all. RunError (one line naming every file and why) when it
        holds some and none can be used: the caller must not start afresh over them.
        """
        failures: list[tuple[Path, str]] = []
        for path in self.candidates():
            try:
                state = read_checkpoint(path)
            except Unreadable as exc:
                failures.append((path, str(exc)))
                continue
            for bad, why in failures:
                log.warning("skipping checkpoint %s: %s", bad.name, why)
            return state, path
        best = self.folder / "best.pt"
        if best.exists() and not _accepted_hashes(best):
            # Never trusted without its hash (removed, or a save cut short by an older hpctrain, which wrote the
            # file first); alone, it is no checkpoint of the run (nothing names it: the save is done again).
            if failures:
                failures.append((best, f"has no {_NO_SIDECAR.format(sidecar='best.json')}"))
        elif best.exists():
            try:
                state = read_checkpoint(best)
                if not is_full_state(state):
                    raise Unreadable("holds the weights only, not a full training state")
                log.warning(
                    "no step checkpoint in %s can be read (%s); resuming from best.pt, a full training state at "
                    "update %s: the updates after it are done again",
                    self.folder,
                    _reasons(failures),
                    state["counters"].get("step"),
                )
                return state, best
            except Unreadable as exc:
                failures.append((best, str(exc)))
        if not failures:
            return None
        raise NoUsableCheckpoint(f"no checkpoint in {self.folder} can be used ({_reasons(failures)})")


def _reasons(failures: list[tuple[Path, str]], shown: int = 4) -> str:
    parts = [f"{path.name}: {why}" for path, why in failures[:shown]]
    if len(failures) > shown:
        parts.append(f"and {len(failures) - shown} more")
    return "; ".join(parts) if parts else "none found"


def is_full_state(state: dict[str, Any]) -> bool:
    """Whether a checkpoint can resume a training (not only initialise weights)."""
    return all(key in state for key in FULL_STATE_KEYS)


_NO_SIDECAR = "{sidecar} with its SHA-256 (removed, or a save cut short): its bytes cannot be checked"


def follow_pointer(path: Path) -> Path:
    """The step file a `latest` pointer file names (checked like any checkpoint file); any other path as is."""
    if path.name != "latest" or not path.is_file():
        return path
    try:
        named = path.read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise Unreadable(f"the pointer {path} cannot be read ({exc})") from None
    if not _STEP_FILE.match(named):
        raise Unreadable(f"the pointer {path} names no step checkpoint ({named[:40]!r})")
    log.info("%s names %s: resuming from that file", path, named)
    return path.parent / named


def _accepted_hashes(path: Path) -> list[str]:
    """The SHA-256 values the sidecar accepts for `path`: its own, and while a save replaces the file, those of
    the bytes it replaces. Empty when there is no sidecar or it cannot be read (cut or damaged), and for a .json
    file (a sidecar named by mistake is its own "sidecar": its hash would be said not to match itself)."""
    if path.suffix == ".json":
        return []
    try:
        sidecar = json.loads(path.with_suffix(".json").read_text())
        hashes = [sidecar["sha256"], *sidecar.get("replaces", [])]
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return []
    return [str(h) for h in hashes]


def _read_bytes(path: Path, named: bool) -> tuple[bytes, bool]:
    """The file's bytes, matching its sidecar hash, and whether they were checked; transient I/O errors and
    mismatches are read again. Without a sidecar: Unreadable, or for a file the user `named`, the bytes
    unchecked (the caller warns once they prove a checkpoint: a file that is none gets its error alone)."""
    delays = [*READ_RETRY_DELAYS, None]
    for attempt, delay in enumerate(delays):
        accepted = _accepted_hashes(path)
        if not accepted and path.exists() and not named:  # checked before reading: a file may be gigabytes
            raise Unreadable("has no " + _NO_SIDECAR.format(sidecar=path.with_suffix(".json").name))
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise Unreadable("missing") from None
        except OSError as exc:
            if exc.errno in _PERMANENT_ERRNOS or delay is None:
                raise Unreadable(f"cannot be read ({exc.strerror or exc})") from None
            log.warning("reading %s failed (%s); trying again in %.1f s", path, exc.strerror or exc, delay)
            time.sleep(delay)
            continue
        if not accepted:
            return data, False
        if hashlib.sha256(data).hexdigest() in accepted:
            return data, True
        if attempt > 0 or delay is None:  # a mismatch is read once more only: a corrupt file stays corrupt
            raise Unreadable(f"its SHA-256 does not match {path.with_suffix('.json').name}")
        time.sleep(delay)
    raise AssertionError("unreachable")


def read_checkpoint(path: Path, named: bool = False) -> dict[str, Any]:
    """A checkpoint's state, verified against its sidecar hash. Raises Unreadable(why) when it cannot be used,
    UserError when it was written by a newer hpctrain (falling back to an older one would silently rewind).
    A checkpoint without its sidecar is Unreadable, except a file the user `named` (checkpoint.resume=FILE,
    `hpctrain sample FILE`): copied alone on purpose, it is loaded with a warning that it cannot be checked."""
    data, checked = _read_bytes(path, named)
    # torch.save writes a zip archive: for anything else torch's own error is cryptic (a bare number)
    if not data.startswith(b"PK\x03\x04"):
        raise Unreadable("not a checkpoint: not the zip archive torch.save writes")
    from hpctrain.train.tensor_file import Refused, load_tensors  # torch

    try:
        state = load_tensors(data)
    except Refused as exc:
        raise Unreadable(str(exc)) from None
    except Exception as exc:  # any other format error means: not usable
        # its first sentence: a cut file's text goes on with miniz's advice, cut mid-sentence at 200 characters
        first = str(exc).splitlines()[0].split(". ")[0][:200] if str(exc).strip() else type(exc).__name__
        raise Unreadable(f"unreadable ({first})") from None
    if not isinstance(state, dict) or "modules" not in state:
        raise Unreadable("not an hpctrain checkpoint")
    if not checked:
        log.warning(
            "%s has no %s: its SHA-256 cannot be checked; loading it as named",
            path,
            path.with_suffix(".json").name,
        )
    version = state.get("format", FORMAT_VERSION)
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise UserError(
            f"checkpoint {path} has format {version!r}, newer than this hpctrain reads ({FORMAT_VERSION}): "
            "update hpctrain, or start afresh with another run.name or checkpoint.resume=never"
        )
    return state


def load_verified(path: Path, named: bool = True) -> dict[str, Any]:
    """Read a checkpoint file the user named, checking its sidecar hash when there is one (warned when there is
    none; refused then unless `named`: a file of a run folder, which has its sidecar); a bad one is one line
    saying why (NotLocated)."""
    try:
        return read_checkpoint(path, named=named)
    except Unreadable as exc:
        raise NotLocated(
            "unusable", f"{path}: not a readable hpctrain checkpoint ({exc})", why=str(exc)
        ) from None


_WHICH = re.compile(r"^(?:latest|best|step_0*(\d+))$")


@dataclass(frozen=True)
class Located:
    """A checkpoint `locate` found and read: its state (verified), its file (an export: its folder), and the run
    folder it belongs to (None: a file copied alone, a folder without checkpoints/, an export)."""

    state: dict[str, Any]
    file: Path
    run_dir: Path | None


class NotLocated(UserError):
    """No usable checkpoint where `locate` was sent; its text is the line `hpctrain sample|evaluate|export` and
    `hpctrain.load` show. `reason` (missing: no such path, or no `name` in `folder` holding `held`; empty: a
    folder without checkpoints; unusable: `why`; which: a `which` that does not fit the path) lets a caller
    that named the path differently (checkpoint.resume) say it in its own words."""

    def __init__(
        self,
        reason: Literal["missing", "empty", "unusable", "which"],
        line: str,
        name: str = "",
        folder: Path | None = None,
        held: str = "",
        why: str = "",
    ) -> None:
        super().__init__(line)
        self.reason, self.name, self.folder, self.held, self.why = reason, name, folder, held, why


def locate(path: str | Path, which: str = "latest", exports: bool = True) -> Located:
    """The checkpoint `which` (latest | best | step_N) of a run folder or its checkpoints folder (latest: the
    one a resume would pick), or the file `path` names (a `latest` pointer: the file it names), or an export
    folder (train/exported.py; latest only). What resume (checkpoint.resume=best|step_N|<path>), `hpctrain
    sample|evaluate|export` and `hpctrain.load` read. A run folder's files (step_*.pt, best.pt) are loaded only
    verified against their sidecar; a file copied alone, with a warning. Every failure is NotLocated (one line)
    but a checkpoint newer than this hpctrain (UserError). `exports=False`: an export folder is no checkpoint
    (checkpoint.resume: every rank reads the file rank 0 chose)."""
    match = _WHICH.match(which)
    if match is None:
        raise NotLocated("which", f"which={which!r}: choose latest, best or step_N (e.g. step_200)")
    name = "best.pt" if which == "best" else f"step_{int(match.group(1)):08d}.pt" if match.group(1) else ""
    target = Path(path).expanduser()
    if target.is_dir() and is_export(target):
        if not exports:
            why = "an export folder (its networks' weights alone), not a checkpoint to resume from"
            raise NotLocated("unusable", f"{path}: {why}", why=why)
        if which != "latest":
            raise NotLocated(
                "which", f"{path}: an export holds one update; which={which} needs the run folder"
            )
        return Located(read_export(target), target, None)
    if not target.is_dir():
        if which == "latest" and target.is_file():
            return _read_file(target)
        kind = "a checkpoint file" if target.is_file() else "no such run folder"
        line = f"{path}: {kind}; which={which} needs the run folder"
        if which == "latest":
            line = f"{path}: no such run folder or checkpoint file"
        raise NotLocated("missing", line, name=name, folder=target)
    folder = target / "checkpoints" if (target / "checkpoints").is_dir() else target
    run_dir = folder.parent if folder.name == "checkpoints" else None
    if which != "latest":
        file = folder / name
        if not file.is_file():
            steps = sorted(int(p.stem[5:]) for p in folder.glob("step_*.pt") if p.stem[5:].isdigit())
            held = ", ".join(
                [f"step_{step}" for step in steps] + (["best"] if (folder / "best.pt").exists() else [])
            )
            line = f"{path}: no {file.name} in {folder} (it holds: {held or 'nothing'})"
            raise NotLocated("missing", line, name=file.name, folder=folder, held=held)
        return _read_file(file)
    try:
        loaded = CheckpointStore(folder, keep_last=1).load_latest()
    except NoUsableCheckpoint as exc:  # what training says, less its advice (checkpoint.resume is not here)
        raise NotLocated("unusable", exc.what, why=exc.what) from None
    except RunError as exc:  # the folder cannot be listed
        raise NotLocated("unusable", str(exc), why=str(exc)) from None
    if loaded is None:
        raise NotLocated(
            "empty", f"{path}: no readable checkpoint (expected <run folder>/checkpoints/step_*.pt)"
        )
    return Located(loaded[0], loaded[1], run_dir)


def _read_file(file: Path) -> Located:
    """A checkpoint file (a `latest` pointer: the file it names): a run folder's own only verified (its sidecar
    is beside it), any other with a warning."""
    try:
        pointer, file = file, follow_pointer(file)
    except Unreadable as exc:
        raise NotLocated(
            "unusable", f"{file}: not a readable hpctrain checkpoint ({exc})", why=str(exc)
        ) from None
    if file != pointer and not file.exists():  # it was "cannot be used: missing"
        why = f"the pointer {pointer} names {file.name}, which is not there"
        raise NotLocated("unusable", f"{pointer}: {why}", why=why)
    run_dir = file.parent.parent if file.parent.name == "checkpoints" else None
    return Located(load_verified(file, named=run_dir is None or not is_run_checkpoint(file)), file, run_dir)


def is_run_checkpoint(path: Path) -> bool:
    """Whether `path` is named as a save of a run names its files (step_XXXXXXXX.pt, best.pt)."""
    return bool(_STEP_FILE.match(path.name)) or path.name == "best.pt"
