"""Questions to the SLURM controller (scontrol), answered None when SLURM is not reachable."""

from __future__ import annotations

import itertools
import re
import shutil
import socket
import subprocess
from datetime import datetime


def _scontrol(*args: str, timeout: float = 10.0) -> str | None:
    exe = shutil.which("scontrol")
    if exe is None:
        return None
    try:
        done = subprocess.run([exe, *args], capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def job_fields(job_id: str) -> dict[str, str]:
    """`scontrol show job -o ID` as a dict (empty when unknown)."""
    out = _scontrol("show", "job", "-o", str(job_id))
    if not out:
        return {}
    fields: dict[str, str] = {}
    for token in out.split():
        key, sep, value = token.partition("=")
        if sep and key not in fields:
            fields[key] = value
    return fields


def job_end_time(job_id: str) -> float | None:
    """The job's end time as a UNIX timestamp (SLURM 22.05 has no SLURM_JOB_END_TIME: ask the controller)."""
    end = job_fields(job_id).get("EndTime")
    if not end or end in ("Unknown", "None"):
        return None
    try:
        return datetime.strptime(end, "%Y-%m-%dT%H:%M:%S").timestamp()
    except ValueError:
        return None


def expand_hostnames(node_list: str) -> list[str]:
    """The host names of a SLURM node list ("n[1-3],gpu[01-02]"), in SLURM's order. Pure Python: no
    `scontrol` call (a container or a node without SLURM's configuration still finds its rendezvous host)."""
    return [name for item in _split_top(node_list) for name in _expand_item(item)]


def _split_top(text: str) -> list[str]:
    """Split at the commas outside brackets: "n[1,3],m2" -> ["n[1,3]", "m2"]."""
    items, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if depth not in (0, 1):
            raise ValueError(f"{text!r} is not a SLURM host list (nested or unbalanced brackets)")
        if char == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError(f"{text!r} is not a SLURM host list (unbalanced brackets)")
    items.append(text[start:])
    if any(not item for item in items):
        raise ValueError(f"{text!r} is not a SLURM host list (an empty name)")
    return items


def _expand_item(item: str) -> list[str]:
    """One name with any number of bracket groups, each a product dimension: "rack[1-2]-n[3-4]" gives
    rack1-n3, rack1-n4, rack2-n3, rack2-n4 (SLURM's order: the last group varies fastest)."""
    parts = re.split(r"(\[[^\]]*\])", item)
    choices = [_expand_group(p[1:-1], item) if p.startswith("[") else [p] for p in parts]
    return ["".join(combo) for combo in itertools.product(*choices)]


def _expand_group(group: str, item: str) -> list[str]:
    """ "1-3,07-09" -> 1 2 3 07 08 09: a range keeps the zero padding of its lower bound."""
    out: list[str] = []
    for part in group.split(","):
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if match is None or (match[2] is not None and int(match[2]) < int(match[1])):
            raise ValueError(f"{item!r}: {part!r} is not a number or a range of numbers")
        low, high = match[1], match[2] or match[1]
        width = len(low) if low.startswith("0") else 0
        out.extend(str(n).zfill(width) for n in range(int(low), int(high) + 1))
    return out


def node_address(name: str) -> str:
    """The name if it resolves, else the node's NodeAddr from `scontrol show node`."""
    try:
        socket.getaddrinfo(name, None)
        return name
    except OSError:
        pass
    out = _scontrol("show", "node", "-o", name) or ""
    for token in out.split():
        if token.startswith("NodeAddr="):
            return token.split("=", 1)[1]
    return name
