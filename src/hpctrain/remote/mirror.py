"""Copies of outputs elsewhere (checkpoint.mirror_to, tensorboard mirror): a local folder or an fsspec URL, and
whole at every moment, so that a reader of the mirror never sees half a checkpoint."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import fsspec

from hpctrain.errors import UserError
from hpctrain.fsutil import (
    HOST,
    atomic_path,
    atomic_write_text,
    fsync_dir,
    make_folders,
    pid_alive,
    temp_writer,
)
from hpctrain.remote.uris import MissingPathError, is_remote


def mirror(
    local_path: str | os.PathLike[str], dest: str, storage_options: dict[str, Any] | None = None
) -> str:
    """Copy a file or folder to `dest/<name>` (a local folder or an fsspec URL); returns the copy's path.

    A local copy appears atomically: it is written under a temporary name and renamed, so a reader of the
    mirror never sees half a checkpoint. A folder copy replaces an older copy of the same name.
    """
    src = Path(local_path)
    if not src.exists():
        raise MissingPathError(f"mirror: {src} does not exist")
    name = src.name
    if is_remote(dest):
        target = dest.rstrip("/") + "/" + name
        fs, path = fsspec.core.url_to_fs(target, **(storage_options or {}))
        if src.is_dir():
            fs.put(str(src), path, recursive=True)
        else:
            fs.put_file(str(src), path)
        return target
    dest_dir = Path(dest.removeprefix("file://")).expanduser()
    make_folders(dest_dir)
    final = dest_dir / name
    if src.is_dir():
        old = dest_dir / f".{name}.old-{os.getpid()}"
        with atomic_path(final) as tmp:
            shutil.copytree(src, tmp, copy_function=_copy_synced)
            if final.exists():
                # a rename replaces no folder that has files: the previous copy steps aside, by a rename of its
                # own, just before the new one takes its name, and is removed only once the new one stands
                os.replace(final, old)
        if old.exists():
            shutil.rmtree(old) if old.is_dir() else old.unlink()
    else:
        with atomic_path(final) as tmp:
            shutil.copy2(src, tmp)
            if final.is_dir():
                shutil.rmtree(final)
    return str(final)


# A run's own place under a shared destination names the run that holds it (JSON: {"run": name, "run_dir": ...}):
# another run's start is refused there instead of replacing (and pruning) that run's copies.
CLAIM = ".hpctrain-run"


def run_mirror(mirror_to: str, run_name: str) -> str:
    """Where a run's copies go under checkpoint.mirror_to: its own folder `<mirror_to>/<run name>/` (the
    checkpoints in `checkpoints/` under it). A copy removes what its run pruned: runs sharing a mirror_to (a
    sweep's elements, runs of other learning rates) must never share that folder."""
    return mirror_to.rstrip("/") + "/" + run_name


def copy_destinations(cfg: Any) -> list[tuple[str, str]]:
    """(setting, place) of every copy of a run's checkpoints outside its run folder: what no two runs may share
    (a sweep is checked for it before it is queued, a start by the claim in each place)."""
    out = []
    if cfg.checkpoint.dir:
        out.append(("checkpoint.dir", _place(cfg.checkpoint.dir)))
    if cfg.checkpoint.mirror_to:
        out.append(("checkpoint.mirror_to", _place(run_mirror(cfg.checkpoint.mirror_to, cfg.run.name))))
    return out


def _place(dest: str) -> str:
    if is_remote(dest):
        return dest.rstrip("/")
    return os.path.abspath(os.path.expanduser(dest.removeprefix("file://")))


def claim_text(run_name: str, run_dir: Path) -> str:
    return json.dumps({"run": run_name, "run_dir": str(Path(run_dir).resolve()), "host": HOST}) + "\n"


def claimed_by(text: bytes | str | None) -> tuple[str, str] | None:
    """(run name, run folder) a claim names; None for no claim (or one that is no claim: it is rewritten)."""
    try:
        record = json.loads(text) if text else None
        return (str(record["run"]), str(record["run_dir"])) if isinstance(record, dict) else None
    except (ValueError, KeyError, TypeError):
        return None


def claim_local(folder: Path, run_name: str, run_dir: Path, setting: str) -> None:
    """`folder` (a run's own place under a local checkpoint.mirror_to) is the run folder `run_dir`'s: claimed
    when first used; UserError (one line) when another run folder claimed it (two runs of one name under other
    run.out_dir, mirroring into one place)."""
    path = folder / CLAIM
    try:
        owner = claimed_by(path.read_bytes())
    except FileNotFoundError:
        owner = None
    except OSError:  # a file on the way, no permission: the copies fail, say so and are sent again later
        return
    mine = str(Path(run_dir).resolve())
    if owner is not None and owner[1] != mine:
        raise UserError(
            f"{setting}: {folder} holds the copies of the run folder {owner[1]}, not of {mine}: each run needs a "
            f"place of its own (another run.name, or another {setting}); if it is this run moved, remove {path}"
        )
    if owner is None:
        try:
            make_folders(folder)
            atomic_write_text(path, claim_text(run_name, run_dir))
        except OSError:  # as above: the copy itself says why
            pass


def _copy_synced(src: str, dst: str) -> str:
    shutil.copy2(src, dst)
    with open(dst, "rb+") as fh:
        os.fsync(fh.fileno())
    return dst


class FolderMirror:
    """Keeps `dest/<folder name>/` a copy of a local folder that is whole at every moment (checkpoint.mirror_to).

    Each `sync` copies only what changed (local: size and mtime differ, or the bytes of a small file; a URL: what
    this object has not sent yet), each file under a temporary name then renamed; a file whose `.json` companion
    (its hash) changes too loses that companion first, as in the local commit protocol. Then the `last` files
    (the `latest` pointer), so the pointer never names a file the mirror lacks. Only then are files the folder
    no longer has removed. Hidden files (temporaries) are never copied. One sync at a time per destination.
    """

    _SMALL = 1 << 16  # files up to this size are compared by content

    def __init__(self, dest: str, storage_options: dict[str, Any] | None = None) -> None:
        self.dest = dest
        self._storage_options = dict(storage_options or {})
        self._sent: dict[str, tuple[int, int]] = {}  # URL destinations: name -> (size, mtime_ns) sent

    def sync(self, folder: str | os.PathLike[str], last: tuple[str, ...] = ()) -> str:
        """Bring the mirror of `folder` up to date; returns its location."""
        src = Path(folder)
        if not src.is_dir():
            raise MissingPathError(f"mirror: {src} is not a folder")
        files = {
            entry.name: entry.stat()
            for entry in os.scandir(src)
            if entry.is_file() and not entry.name.startswith(".")
        }
        if is_remote(self.dest):
            target = self.dest.rstrip("/") + "/" + src.name
            ops: _MirrorOps = _RemoteMirror(target, self._storage_options, self._sent)
        else:
            target = str(Path(self.dest.removeprefix("file://")).expanduser() / src.name)
            ops = _LocalMirror(Path(target))
        present = ops.names()
        changed = [
            name
            for name in files
            if name not in last and (name not in present or not ops.same(src / name, files[name]))
        ]
        for name in changed:
            companion = str(Path(name).with_suffix(".json"))
            if companion != name and companion in changed and companion in present:
                ops.remove(companion)  # never new data beside its old hash, even for a moment
        for name in sorted(changed, key=lambda n: n.endswith(".json")):  # data, then the hashes
            ops.put(src / name, files[name])
        for name in last:
            if name in files:
                ops.put(src / name, files[name])
        for name in sorted(present - files.keys()):
            ops.remove(name)
        ops.done()
        return target


class _MirrorOps:
    def names(self) -> set[str]:
        raise NotImplementedError

    def same(self, path: Path, stat: os.stat_result) -> bool:
        raise NotImplementedError

    def put(self, path: Path, stat: os.stat_result) -> None:
        raise NotImplementedError

    def remove(self, name: str) -> None:
        raise NotImplementedError

    def done(self) -> None:
        pass


class _LocalMirror(_MirrorOps):
    def __init__(self, root: Path) -> None:
        self.root = root
        make_folders(root)
        for entry in os.scandir(root):  # the temporary of a copy cut short by a kill on this host
            if entry.name.startswith(".") and ".tmp-" in entry.name and entry.is_file(follow_symlinks=False):
                pid, host = temp_writer(Path(entry.path))
                if host == HOST and pid is not None and not pid_alive(pid):
                    Path(entry.path).unlink(missing_ok=True)

    def names(self) -> set[str]:
        return {e.name for e in os.scandir(self.root) if e.is_file() and not e.name.startswith(".")}

    def same(self, path: Path, stat: os.stat_result) -> bool:
        copy = self.root / path.name
        try:
            theirs = copy.stat()
        except FileNotFoundError:
            return False
        if theirs.st_size != stat.st_size:
            return False
        if stat.st_size <= FolderMirror._SMALL:
            return copy.read_bytes() == path.read_bytes()
        return theirs.st_mtime_ns == stat.st_mtime_ns  # copy2 keeps it; a rewrite changes it

    def put(self, path: Path, stat: os.stat_result) -> None:
        with atomic_path(self.root / path.name) as tmp:
            shutil.copy2(path, tmp)

    def remove(self, name: str) -> None:
        (self.root / name).unlink(missing_ok=True)

    def done(self) -> None:
        fsync_dir(self.root)  # the removals


class _RemoteMirror(_MirrorOps):
    def __init__(
        self, target: str, storage_options: dict[str, Any], sent: dict[str, tuple[int, int]]
    ) -> None:
        self.fs, self.root = fsspec.core.url_to_fs(target, **storage_options)
        self.root = self.root.rstrip("/")
        self.fs.makedirs(self.root, exist_ok=True)
        self.sent = sent

    def names(self) -> set[str]:
        found = self.fs.ls(self.root, detail=True)
        names = {str(info["name"]).rstrip("/").rsplit("/", 1)[-1] for info in found if info["type"] == "file"}
        return {n for n in names if not n.startswith(".")}

    def same(self, path: Path, stat: os.stat_result) -> bool:
        return self.sent.get(path.name) == (stat.st_size, stat.st_mtime_ns)

    def put(self, path: Path, stat: os.stat_result) -> None:
        # a remote store has no fsync or directory entry to sync: upload under a hidden name, then move
        tmp = f"{self.root}/.{path.name}.mirror-{os.getpid()}"
        self.fs.put_file(str(path), tmp)
        self.fs.mv(tmp, f"{self.root}/{path.name}")
        self.sent[path.name] = (stat.st_size, stat.st_mtime_ns)

    def remove(self, name: str) -> None:
        self.fs.rm_file(f"{self.root}/{name}")
        self.sent.pop(name, None)
