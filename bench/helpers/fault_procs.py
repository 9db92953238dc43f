"""Child processes of the fault campaign (bench/faults.py): their environment, killing them for good, and
watching what they log."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from fault_check import read_metrics

_LEAKY = ("LR", "BATCH_SIZE", "TOTAL_UPDATES", "EPOCHS", "SEED", "RESULTS_DIR", "DATA_DIR", "WANDB_API_KEY")


def child_env(src: Path) -> dict[str, str]:
    """This environment without anything that would change the job's configuration."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("HPCTRAIN_", "SLURM_")) and k not in _LEAKY
    }
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    env.update(PYTHONUNBUFFERED="1", PYTHONPATH=str(src))
    return env


def group_alive(pgid: int) -> list[int]:
    """Live (not zombie) processes of a process group, from /proc."""
    alive = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            alive.append(int(entry.name))
    return alive


def kill_group(proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    """SIGKILL the child's whole group (started with start_new_session: its DataLoader workers too) and return
    only once none of it is left: the next run must not meet a live writer or a held lock."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.wait()
        alive = group_alive(proc.pid)
        if not alive:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"processes {alive} of group {proc.pid} survive SIGKILL")
        time.sleep(0.02)


class Watch:
    """What a child has logged (metrics.jsonl), re-read only when the file changed."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.initial = self._stat()
        self.seen = self.initial
        self.train: list[int] = []
        self.evals: set[int] = set()
        self._read()

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return st.st_ino, st.st_size, st.st_mtime_ns

    def _read(self) -> None:
        records: list[dict[str, Any]] = read_metrics(self.path)
        self.train = [r["step"] for r in records if "loss" in r]
        self.evals = {r["step"] for r in records if "loss" not in r}

    def refresh(self) -> None:
        now = self._stat()
        if now != self.seen:
            self.seen = now
            self._read()

    def trained_beyond(self, step: int) -> int | None:
        """The last update this child logged, if it logged one after `step` (the update it resumed from).
        Before the child rewrites metrics.jsonl at start-up, records of a killed predecessor beyond `step` are
        still there: an unchanged file means nothing logged yet."""
        last = max(self.train, default=0)
        return last if self.seen != self.initial and last > step else None
