"""Questions to the SLURM controller (scontrol), answered None when SLURM is not reachable."""

from __future__ import annotations

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
    out = _scontrol("show", "hostnames", node_list)
    return out.split() if out else [node_list]


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
