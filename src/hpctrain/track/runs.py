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

from hpctrain.config.yaml_file import MAX_BYTES, load_yaml
from hpctrain.errors import UserError
from hpctrain.track.chain import is_record

# What the trainer leaves in a run folder from its first start on (config.yaml before anything else).
RUN_MARKERS = ("chain.json", "summary.json", "config.yaml", "run.lock", "checkpoints", "metrics.jsonl")
# A folder of sweeps holds folders of runs: run folders are looked for this many levels down.
SEARCH_DEPTH = 2
TAIL_BLOCK = 64 * 1024
TAIL_LIMIT = 16 * 1024 * 1024  # about 30000 records


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
    """The run's resolved config.yaml ({} when missing, unreadable, or past the config loader's bounds: a file
    over MAX_BYTES, aliases expanding past MAX_NODES values, as `--config` refuses; a folder others can write
    may hold anything, and `status` and `report` read every run's)."""
    try:
        with open(Path(run_dir) / "config.yaml", "rb") as handle:
            raw = handle.read(MAX_BYTES + 1)
        if len(raw) > MAX_BYTES:
            return {}
        config = load_yaml(raw.decode("utf-8"), f"{run_dir}/config.yaml")
    except (OSError, UnicodeDecodeError, yaml.YAMLError, UserError):
        return {}
    return config if isinstance(config, dict) else {}


def section(config: dict[str, Any], name: str) -> dict[str, Any]:
    """A section of a read config.yaml ({} when missing or not a mapping: a hand-edited or damaged file)."""
    value = config.get(name)
    return value if isinstance(value, dict) else {}


@dataclass
class Tail:
    """The last records of a metrics.jsonl, in file order. `whole`: these are all of the file's records;
    `kept_whole`: all of its records that hold a `keep` key are among them."""

    records: list[dict[str, Any]]
    whole: bool
    kept_whole: bool


def tail_records(
    path: Path,
    want: tuple[str, ...] = (),
    all_of_want: bool = False,
    block: int = TAIL_BLOCK,
    limit: int = TAIL_LIMIT,
) -> Tail:
    """Every record in the last `block` bytes of `path`; before them, the records that hold a key of `want` (an
    evaluation's figures: one record in many), read back until each key of `want` is among them, or with
    `all_of_want` (their best is wanted) as far as the limit: never more than the last `limit` bytes, and only
    those lines are parsed. A line cut by the start of what was read, or by a kill, is skipped."""
    try:
        handle = open(path, "rb")  # noqa: SIM115 (closed below)
    except OSError:
        return Tail([], True, True)
    needles = [f'"{key}":'.encode() for key in want]
    with handle:
        size = handle.seek(0, os.SEEK_END)
        span = min(block, limit)
        while True:
            start = max(size - span, 0)
            handle.seek(start)
            data = handle.read(size - start)
            cut = max(len(data) - block, 0)
            cut = data.find(b"\n", cut - 1) + 1 if cut else 0  # the last block, from a line's start
            early, late = (data[:cut].split(b"\n") if cut else []), data[cut:].split(b"\n")
            if start:  # what was read begins inside a line
                early, late = (early[1:], late) if early else (early, late[1:])
            lines = [line for line in early if any(n in line for n in needles)] + late
            records = [r for r in map(_parse, lines) if r is not None]
            seen = all(any(key in r for r in records) for key in want)
            if start == 0 or span >= limit or (seen and not all_of_want):
                return Tail(records, start == 0 and cut == 0, start == 0)
            span = min(span * 4, limit)  # few reads, at most 4/3 of the bytes of the last one


def _parse(line: bytes) -> dict[str, Any] | None:
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):
        return None
    return record if is_record(record) else None
