"""The run's history across job hops: chain.json (one record per hop) and summary.json (written at exit)."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def read_json(path: Path, default: Any) -> Any:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return default


class ChainLog:
    """chain.json: the hops of a run. Rank 0 opens a record at start and closes it at exit."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / "chain.json"
        self.hops: list[dict[str, Any]] = read_json(self.path, [])
        self.current: dict[str, Any] | None = None

    def open_hop(self, job_id: str | None, node_list: str | None, first_update: int, world_size: int) -> None:
        for hop in self.hops:
            # A hop that never closed was killed (SIGKILL, node failure): say so instead of leaving it open.
            if hop.get("end") is None:
                hop["end"] = hop.get("last_seen", hop["start"])
                hop["exit_reason"] = "failure"
        self.current = {
            "hop": len(self.hops),
            "job_id": job_id,
            "nodes": node_list or socket.gethostname(),
            "world_size": world_size,
            "start": time.time(),
            "end": None,
            "first_update": first_update,
            "last_update": first_update,
            "exit_reason": None,
            "train_seconds": 0.0,
        }
        self.hops.append(self.current)
        _write_json(self.path, self.hops)

    def progress(self, last_update: int, train_seconds: float) -> None:
        """Called at checkpoint commits: a hop killed later still shows how far it got."""
        if self.current is None:
            return
        self.current.update(last_update=last_update, train_seconds=train_seconds, last_seen=time.time())
        _write_json(self.path, self.hops)

    def close_hop(self, last_update: int, train_seconds: float, reason: str) -> dict[str, Any]:
        assert self.current is not None
        end = time.time()
        wall = max(end - self.current["start"], 1e-9)
        self.current.update(
            end=end,
            last_update=last_update,
            exit_reason=reason,
            train_seconds=train_seconds,
            goodput=train_seconds / wall,
        )
        self.current.pop("last_seen", None)
        _write_json(self.path, self.hops)
        return self.current

    def totals(self) -> dict[str, float]:
        wall = sum((h["end"] or h["start"]) - h["start"] for h in self.hops)
        train = sum(h.get("train_seconds", 0.0) for h in self.hops)
        return {"hops": len(self.hops), "run_wall_seconds": wall, "run_train_seconds": train,
                "run_goodput": train / wall if wall > 0 else 0.0}


def write_summary(run_dir: Path, summary: dict[str, Any]) -> None:
    _write_json(run_dir / "summary.json", summary)
