"""Checkpoint commit protocol.

A save writes the whole file under a temporary name in the same folder, fsyncs it, renames it to
`step_XXXXXXXX.pt`, writes a sidecar with its SHA-256, and only then moves the `latest` pointer (also written to a
temporary name and renamed). Old checkpoints are pruned after that, never the one `latest` names. A loader
verifies the hash and falls back to older checkpoints when one is unreadable.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import re
import time
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)

_STEP_FILE = re.compile(r"^step_(\d{8,})\.pt$")
PREFIXES = ("module.", "_orig_mod.")
FORMAT_VERSION = 1


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write to a temporary name in the same folder, fsync, rename: readers see the old or the new file."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as handle:
        handle.write(data)
        handle.flush()
        pause = os.environ.get("_HPCTRAIN_FAULT_SAVE_PAUSE")
        if pause and path.suffix == ".pt":
            # Fault-injection hook for tests: a window in which the file is written but not committed.
            time.sleep(float(pause))
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def strip_prefixes(state: dict[str, Any]) -> dict[str, Any]:
    """Accept state dicts saved from DDP (`module.`) or compiled (`_orig_mod.`) networks, in any nesting."""
    out = {}
    for key, value in state.items():
        while key.startswith(PREFIXES):
            key = key.split(".", 1)[1]
        out[key] = value
    return out


def unwrap(module: torch.nn.Module) -> torch.nn.Module:
    """The plain network under DDP and torch.compile wrappers."""
    while True:
        inner = getattr(module, "module", None) or getattr(module, "_orig_mod", None)
        if isinstance(inner, torch.nn.Module):
            module = inner
        else:
            return module


class CheckpointStore:
    """The checkpoints of one run folder."""

    def __init__(self, folder: Path, keep_last: int) -> None:
        self.folder = folder
        self.keep_last = keep_last

    def path_for(self, step: int) -> Path:
        return self.folder / f"step_{step:08d}.pt"

    def clean_temporaries(self) -> None:
        """Remove half-written files a killed save left behind (they never became `latest`)."""
        if self.folder.is_dir():
            for leftover in self.folder.glob(".*.tmp-*"):
                log.warning("removing a half-written checkpoint file from a killed save: %s", leftover.name)
                leftover.unlink(missing_ok=True)

    def save(self, state: dict[str, Any], step: int, best: bool = False) -> Path:
        self.folder.mkdir(parents=True, exist_ok=True)
        buffer = io.BytesIO()
        torch.save(state, buffer)
        data = buffer.getvalue()
        digest = hashlib.sha256(data).hexdigest()
        path = self.path_for(step)
        # Saving a step again: drop the old hash first, so a kill between the two writes never leaves new
        # data beside an old hash (a good checkpoint that would fail verification).
        path.with_suffix(".json").unlink(missing_ok=True)
        atomic_write_bytes(path, data)
        atomic_write_text(path.with_suffix(".json"), json.dumps({"step": step, "sha256": digest}))
        # The pointer moves last: until here, `latest` still names the previous good checkpoint.
        atomic_write_text(self.folder / "latest", path.name + "\n")
        if best:
            (self.folder / "best.json").unlink(missing_ok=True)
            atomic_write_bytes(self.folder / "best.pt", data)
            atomic_write_text(self.folder / "best.json", json.dumps({"step": step, "sha256": digest}))
        self._prune(keep=path)
        return path

    def _prune(self, keep: Path) -> None:
        steps = sorted(self._step_files(), reverse=True)
        for _step, path in steps[self.keep_last :]:
            if path != keep:
                path.unlink(missing_ok=True)
                path.with_suffix(".json").unlink(missing_ok=True)

    def _step_files(self) -> list[tuple[int, Path]]:
        if not self.folder.is_dir():
            return []
        found = []
        for path in self.folder.iterdir():
            match = _STEP_FILE.match(path.name)
            if match:
                found.append((int(match.group(1)), path))
        return found

    def candidates(self) -> list[Path]:
        """`latest` first, then every step checkpoint, newest first."""
        ordered: list[Path] = []
        pointer = self.folder / "latest"
        if pointer.is_file():
            named = self.folder / pointer.read_text().strip()
            ordered.append(named)
        for _step, path in sorted(self._step_files(), reverse=True):
            if path not in ordered:
                ordered.append(path)
        return ordered

    def load_latest(self) -> tuple[dict[str, Any], Path] | None:
        for path in self.candidates():
            state = load_verified(path)
            if state is not None:
                return state, path
        return None


def load_verified(path: Path) -> dict[str, Any] | None:
    """Read a checkpoint, checking its sidecar hash when there is one; None (with a warning) if it is bad."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        log.warning("skipping checkpoint %s: %s", path, exc)
        return None
    sidecar = path.with_suffix(".json")
    if sidecar.is_file():
        try:
            expected = json.loads(sidecar.read_text())["sha256"]
        except (ValueError, KeyError):
            expected = None
        if expected and hashlib.sha256(data).hexdigest() != expected:
            log.warning("skipping checkpoint %s: its SHA-256 does not match %s", path.name, sidecar.name)
            return None
    try:
        state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:  # any unpickling/format error means: not usable, try the previous one
        log.warning("skipping checkpoint %s: unreadable (%s)", path.name, str(exc).splitlines()[0][:200])
        return None
    if not isinstance(state, dict) or "modules" not in state:
        log.warning("skipping checkpoint %s: not an hpctrain checkpoint", path.name)
        return None
    return state
