"""`hpctrain cancel`'s mark in a run folder (cancelled.json): the chain ends, the run stays resumable.

`hpctrain cancel` writes it BEFORE it signals or cancels a job, naming the jobs (and a local process) it found
running the run; every decision to go on reads it:
- a template's chain (launch/chain.py): `start` refuses a job the mark names or one that a named job queued (its
  predecessor, HPCTRAIN_PREDECESSOR); `next` neither requeues a named job nor keeps its successor;
- the submitit job does not requeue a named job; `--until-done` and `hpctrain supervise` start no attempt after
  one that began before the mark (launch/supervise.py);
- a training process the mark names, or started before it, does not start training (train/entry.py); any other
  start (the user's resubmission, `hpctrain train` again) removes the mark and continues the run;
- `hpctrain status` shows "cancelled, resumable" while the mark is there and nothing runs.
No torch: it runs in batch shells and on login nodes.
"""

from __future__ import annotations

import getpass
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpctrain.track.chain import read_json, write_json

MARK = "cancelled.json"
PREDECESSOR = "HPCTRAIN_PREDECESSOR"  # the job that queued this one (afterany), set by slurm/common.sh


@dataclass(frozen=True)
class CancelMark:
    time: float
    by: str  # user@host
    jobs: tuple[str, ...] = ()  # the jobs it found running or queued for the run (scheduler ids: 12, 12_3)
    pids: tuple[int, ...] = field(default=())  # a local training process (no SLURM) it signalled

    def names(self, job: str | None, predecessor: str | None = None) -> bool:
        """Whether `job` is one of the cancelled jobs, or was queued by one (its afterany predecessor)."""
        return any(j is not None and j in self.jobs for j in (job, predecessor))

    def said(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.time))
        return f"cancelled by {self.by} at {when} (hpctrain cancel)"


def write_mark(run_dir: Path, jobs: list[str], pids: list[int]) -> CancelMark:
    mark = CancelMark(time.time(), f"{getpass.getuser()}@{socket.gethostname()}", tuple(jobs), tuple(pids))
    write_json(
        Path(run_dir) / MARK,
        {"time": mark.time, "by": mark.by, "jobs": list(mark.jobs), "pids": list(mark.pids)},
    )
    return mark


def read_mark(run_dir: Path) -> CancelMark | None:
    """The run's mark, or None (none, or a file that is no mark: it then stops nothing)."""
    data: Any = read_json(Path(run_dir) / MARK, None)
    if not isinstance(data, dict) or not isinstance(data.get("time"), (int, float)):
        return None
    jobs: list[Any] = data["jobs"] if isinstance(data.get("jobs"), list) else []
    pids: list[Any] = data["pids"] if isinstance(data.get("pids"), list) else []
    return CancelMark(
        float(data["time"]),
        str(data.get("by") or "?"),
        tuple(str(j) for j in jobs),
        tuple(int(p) for p in pids if isinstance(p, int)),
    )


def remove_mark(run_dir: Path) -> None:
    (Path(run_dir) / MARK).unlink(missing_ok=True)
