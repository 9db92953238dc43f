"""`hpctrain tb merge`: one TensorBoard log folder of selected runs, as symlinks or copies."""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shutil
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from hpctrain.fsutil import atomic_path, atomic_write_text, foreign_link, make_folders

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


def _through_link(root: Path, folder: Path) -> bool:
    """Whether `folder` (under `root`) is reached through a symbolic link: a run there lives outside the tree."""
    rel = folder.relative_to(root).parts
    return any((root.joinpath(*rel[: i + 1])).is_symlink() for i in range(len(rel)))


def find_runs(src_root: Path) -> list[TbRun]:
    """Every folder under src_root that directly holds TensorBoard event files."""
    src_root = Path(src_root)
    if not src_root.is_dir():
        raise ValueError(f"--src-root={src_root}: not a folder")
    # regular files only: a link named like an event file (to anything) makes no run
    found = {p.parent for p in src_root.rglob(_EVENTS) if p.is_file() and not p.is_symlink()}
    folders = sorted(f for f in found if not _through_link(src_root, f))
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


# What merges into --out made there, so that a later merge replaces only that: JSON {"time", "src_root", "mode",
# "runs": [names under --out]}. A folder of --out it does not list (a user's notes/ named like a run) is never
# removed or written into; an older merge's plain-text file lists nothing.
RECORD = ".merged"


def _made_before(dst: Path) -> set[str]:
    try:
        record = json.loads((dst / RECORD).read_text())
        return {str(name) for name in record["runs"]}
    except (OSError, ValueError, KeyError, TypeError):
        return set()


def _only_event_files(folder: Path) -> bool:
    """Whether `folder` holds nothing but event files (what a copy-mode merge puts there)."""
    return all(
        entry.is_file(follow_symlinks=False) and fnmatch.fnmatchcase(entry.name, _EVENTS)
        for entry in os.scandir(folder)
    )


def _shown_through_link(dst: Path, name: str, made: set[str]) -> bool:
    """Whether a folder above `dst/name` is a link an earlier merge made to a run: `name` is shown through it."""
    parts = name.split("/")
    above = ["/".join(parts[:i]) for i in range(1, len(parts))]
    return any(rel in made and (dst / rel).is_symlink() for rel in above)


def _blocked(dst: Path, name: str, mode: str, made: set[str]) -> str | None:
    """Why `dst/name` cannot take the run `name` (None: it can) without writing through a link or removing or
    mixing with what the merge did not make."""
    parts = name.split("/")
    for i in range(1, len(parts)):
        above = dst / "/".join(parts[:i])
        if above.is_symlink():
            return f"{above} is a symbolic link: tb merge never writes through one; remove it or choose another --out"
        if above.exists() and not above.is_dir():
            return (
                f"{above} is a file, where the run {name} needs a folder; remove it or choose another --out"
            )
    target = dst / name
    if target.is_symlink() or not target.exists():
        return (
            None  # nothing, or a link: replaced (a link holds nothing; unlinking it writes through nothing)
        )
    if not target.is_dir():
        return f"{target} is a file that tb merge did not make; remove it or choose another --out"
    if name not in made:
        return (
            f"{target} is a folder that tb merge did not make (not in {dst / RECORD}); tb merge never removes or "
            "writes into one: move it, or choose another --out"
        )
    if mode == "symlink" and not _only_event_files(target):
        return f"{target} holds files besides the event files an earlier merge copied; move them, or choose another --out"
    return None


def _place(run: TbRun, target: Path, mode: str) -> None:
    make_folders(target.parent)
    if target.is_symlink():
        target.unlink()
    elif target.is_dir() and mode == "symlink":
        shutil.rmtree(target)  # a copy an earlier merge made (_blocked checked it holds only event files)
    if mode == "symlink":
        os.symlink(run.path.resolve(), target, target_is_directory=True)
        return
    # Copy new and grown event files; TensorBoard appends to them, so a later merge refreshes the copy. Only
    # regular files: a link in the source tree (to a .env, a key) is never followed out of it.
    make_folders(target)
    for entry in os.scandir(run.path):
        if not entry.is_file(follow_symlinks=False):
            continue
        src, dst = Path(entry.path), target / entry.name
        if (
            dst.is_symlink()
            or not dst.exists()
            or dst.stat().st_size != entry.stat(follow_symlinks=False).st_size
        ):
            # unsynced: a copy lost to a power cut is made again by the next merge; a link at the name is replaced
            with atomic_path(dst, fsync=False) as tmp:
                shutil.copy2(src, tmp, follow_symlinks=False)


def merge(
    dst: Path,
    src_root: Path,
    mode: str = "symlink",
    since: str | None = None,
    match: str | None = None,
    glob: str | None = None,
) -> list[TbRun]:
    """Link or copy the selected runs of src_root into dst (named by their path under src_root). Every target is
    checked before anything is written: a link on the way, a file, or a folder an earlier merge did not make
    (RECORD) is one ValueError, and nothing changes."""
    if mode not in ("symlink", "copy"):
        raise ValueError(f"--mode={mode!r}: choose symlink or copy")
    dst, src_root = Path(dst), Path(src_root)
    runs = select(find_runs(src_root), since, match, glob)
    if dst.resolve() == src_root.resolve() or src_root.resolve() in dst.resolve().parents:
        raise ValueError(f"--dst={dst} is inside --src-root={src_root}: the merge would include itself")
    planted = foreign_link(dst)
    if planted:
        raise ValueError(f"--out {dst}: {planted}; tb merge never writes through one")
    made = _made_before(dst)
    names = {run.name for run in runs}
    if mode == "symlink":  # a run inside another selected run is shown through that run's link
        runs = [r for r in runs if not any(r.name.startswith(n + "/") for n in names)]
        runs = [r for r in runs if not _shown_through_link(dst, r.name, made)]
    problems = [p for p in (_blocked(dst, run.name, mode, made) for run in runs) if p]
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise ValueError(f"{problems[0]}{more}; nothing was changed")
    make_folders(dst)
    for run in runs:
        _place(run, dst / run.name, mode)
    record = {
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
        "src_root": str(src_root),
        "mode": mode,
        "runs": sorted(made | {run.name for run in runs}),
    }
    atomic_write_text(dst / RECORD, json.dumps(record, indent=1) + "\n")  # replaces a link, never follows it
    return runs
