"""Many runs at once: which folders are run folders, the run folders under a folder, and the last records of a
run's metrics.jsonl read from its end (a long run's file can be large; a table of runs needs only its end).

`hpctrain status FOLDER` (the table of runs) and `hpctrain report --compare` find their runs here. No torch.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

# What the trainer leaves in a run folder from its first start on (config.yaml before anything else).
RUN_MARKERS = ("chain.json", "summary.json", "config.yaml", "run.lock", "checkpoints", "metrics.jsonl")
# A folder of sweeps holds folders of runs: run folders are looked for this many levels down.
SEARCH_DEPTH = 2
TAIL_BLOCK = 64 * 1024
TAIL_LIMIT = 16 * 1024 * 1024


def is_run_dir(path: Path) -> bool:
    return path.is_dir() and any((path / name).exists() for name in RUN_MARKERS)


def find_runs(folder: Path, depth: int = SEARCH_DEPTH) -> list[Path]:
    """The run folders under `folder` (not `folder` itself), `depth` levels deep at most, sorted by path. A run
    folder's own subfolders (checkpoints, reports, an earlier run moved aside into old-<time>/) are not
    searched; hidden folders are skipped."""
    found: list[Path] = []
    try:
        children = sorted(p for p in Path(folder).iterdir() if p.is_dir() and not p.name.startswith("."))
    except OSError:
        return found
    for child in children:
        if is_run_dir(child):
            found.append(child)
        elif depth > 1:
            found += find_runs(child, depth - 1)
    return found


def read_config(run_dir: Path) -> dict[str, Any]:
    """The run's resolved config.yaml ({} when missing or unreadable)."""
    try:
        config = yaml.safe_load((Path(run_dir) / "config.yaml").read_text())
    except (OSError, yaml.YAMLError):
        return {}
    return config if isinstance(config, dict) else {}


@dataclass
class Tail:
    """The last records of a metrics.jsonl, in file order. `whole`: these are all of the file's records;
    `kept_whole`: all of its records that hold a `keep` key are among them."""

    records: list[dict[str, Any]]
    whole: bool
    kept_whole: bool


def tail_records(
    path: Path, keep: tuple[str, ...] = (), block: int = TAIL_BLOCK, limit: int = TAIL_LIMIT
) -> Tail:
    """Every record in the last `block` bytes of `path`, and before them, within the last `limit` bytes, the
    records that hold a key of `keep` (an evaluation's figures: one record in many, and the best of them is
    wanted): only those lines are parsed. A line cut by the start of what was read, or by a kill, is skipped."""
    try:
        with open(path, "rb") as handle:
            size = handle.seek(0, os.SEEK_END)
            start = max(size - limit, 0)
            handle.seek(start)
            data = handle.read(size - start)
    except OSError:
        return Tail([], True, True)
    cut = max(len(data) - block, 0)
    cut = data.find(b"\n", cut - 1) + 1 if cut else 0  # the last block from a line's start
    early = data[:cut].split(b"\n")[1 if start else 0 :]  # a line cut by `start` is skipped
    needles = [f'"{key}":'.encode() for key in keep]
    lines = [line for line in early if any(n in line for n in needles)] + data[cut:].split(b"\n")
    if start and not cut:
        lines = lines[1:]
    return Tail([r for r in map(_parse, lines) if r is not None], start == 0 and cut == 0, start == 0)


def _parse(line: bytes) -> dict[str, Any] | None:
    try:
        record = json.loads(line)
    except ValueError:
        return None
    return record if isinstance(record, dict) and isinstance(record.get("step"), int) else None
