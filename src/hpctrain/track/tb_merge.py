"""`hpctrain tb merge`: one TensorBoard log folder of selected runs, as symlinks or copies."""

from __future__ import annotations

import fnmatch
import os
import re
import shutil
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from hpctrain.fsutil import atomic_path

_STAMP = re.compile(r"(\d{8}-\d{6})")
_EVENTS = "events.out.tfevents.*"


@dataclass
class TbRun:
    path: Path  # the folder holding event files
    name: str  # its path relative to the source root (the name under --dst)
    started: datetime


def parse_since(text: str) -> datetime:
    try:
        return datetime.strptime(text, "%Y%m%d-%H%M%S")
    except ValueError:
        raise ValueError(f"--since={text!r}: use YYYYmmdd-HHMMSS, e.g. 20260105-105330") from None


def _started(folder: Path, name: str) -> datetime:
    """The timestamp in the run's name (the default run names are timestamps), else the folder's mtime."""
    stamps = _STAMP.findall(name)
    if stamps:
        try:
            return datetime.strptime(stamps[-1], "%Y%m%d-%H%M%S")
        except ValueError:
            pass
    return datetime.fromtimestamp(folder.stat().st_mtime)


def find_runs(src_root: Path) -> list[TbRun]:
    """Every folder under src_root that directly holds TensorBoard event files."""
    src_root = Path(src_root)
    if not src_root.is_dir():
        raise ValueError(f"--src-root={src_root}: not a folder")
    folders = sorted({p.parent for p in src_root.rglob(_EVENTS) if p.is_file()})
    runs = []
    for folder in folders:
        rel = folder.relative_to(src_root).as_posix()
        name = src_root.resolve().name if rel == "." else rel
        runs.append(TbRun(folder, name, _started(folder, name)))
    return runs


def select(
    runs: list[TbRun], since: str | None = None, match: str | None = None, glob: str | None = None
) -> list[TbRun]:
    """Runs started at or after `since`, whose name matches the regex `match` (search) and the glob `glob`."""
    after = parse_since(since) if since else None
    try:
        pattern = re.compile(match) if match else None
    except re.error as exc:
        raise ValueError(f"--match={match!r}: not a regular expression ({exc})") from None
    chosen = []
    for run in runs:
        if after is not None and run.started < after:
            continue
        if pattern is not None and not pattern.search(run.name):
            continue
        if glob is not None and not fnmatch.fnmatchcase(run.name, glob):
            continue
        chosen.append(run)
    return chosen


def _place(run: TbRun, target: Path, mode: str) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.is_symlink() or target.is_file():
        target.unlink()
    elif target.is_dir() and mode == "symlink":
        shutil.rmtree(target)
    if mode == "symlink":
        os.symlink(run.path.resolve(), target, target_is_directory=True)
    else:
        # Copy new and grown event files; TensorBoard appends to them, so a later merge refreshes the copy.
        target.mkdir(parents=True, exist_ok=True)
        for src in run.path.iterdir():
            if not src.is_file():
                continue
            dst = target / src.name
            if not dst.exists() or dst.stat().st_size != src.stat().st_size:
                # unsynced: a copy lost to a power cut is made again by the next merge
                with atomic_path(dst, fsync=False) as tmp:
                    shutil.copy2(src, tmp)


def merge(
    dst: Path,
    src_root: Path,
    mode: str = "symlink",
    since: str | None = None,
    match: str | None = None,
    glob: str | None = None,
) -> list[TbRun]:
    """Link or copy the selected runs of src_root into dst (named by their path under src_root)."""
    if mode not in ("symlink", "copy"):
        raise ValueError(f"--mode={mode!r}: choose symlink or copy")
    dst, src_root = Path(dst), Path(src_root)
    runs = select(find_runs(src_root), since, match, glob)
    if dst.resolve() == src_root.resolve() or src_root.resolve() in dst.resolve().parents:
        raise ValueError(f"--dst={dst} is inside --src-root={src_root}: the merge would include itself")
    dst.mkdir(parents=True, exist_ok=True)
    for run in runs:
        _place(run, dst / run.name, mode)
    (dst / ".merged").write_text(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {len(runs)} runs from {src_root}\n")
    return runs
