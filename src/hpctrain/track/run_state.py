"""What state a run folder is in (running, finished, stopped, cancelled, failed, crashed, not started) and the
evidence for it, read from its files alone: what `hpctrain status` says of one run and of each row of a folder's
table."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

from hpctrain.fsutil import pid_alive
from hpctrain.track.cancel import MARK, CancelMark
from hpctrain.track.chain import hop_number

HEARTBEAT_FRESH = 120.0
_RUNNING_STATES = ("RUNNING", "COMPLETING", "CONFIGURING", "STAGE_OUT", "SIGNALING")


def lock_holder(run_dir: Path, now: float) -> str | None:
    """Who holds run.lock, as evidence for 'running' (None: nobody, or a stale lock)."""
    try:
        lock = json.loads((run_dir / "run.lock").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(lock, dict):
        return None
    pid, host, beat = lock.get("pid"), lock.get("host"), lock.get("heartbeat")
    if isinstance(pid, int) and host == socket.gethostname():
        # On this host the process table is the evidence: a fresh heartbeat of a dead pid is a killed run.
        return f"run.lock held by live process {pid} on this host" if pid_alive(pid) else None
    if isinstance(beat, (int, float)) and now - beat < HEARTBEAT_FRESH:
        return f"run.lock heartbeat {max(now - beat, 0):.0f} s ago (process {pid} on {host})"
    return None


def run_state(
    hops: list[dict[str, Any]],
    summary: dict[str, Any],
    holder: str | None,
    queue: str | None,
    finished: bool,
    mark: CancelMark | None = None,
) -> tuple[str, str]:
    """(state, the evidence for it): running | finished | stopped | cancelled | failed | crashed | not started.
    `mark`: `hpctrain cancel`'s (track/cancel.py); a run it marked that is neither running nor finished is
    cancelled (and resumable)."""
    asked = f" ({mark.said()}: saving and stopping)" if mark is not None else ""
    if holder:
        return "running", holder + asked
    if queue and queue.split(" ", 1)[0] in _RUNNING_STATES:
        return "running", f"squeue: job {hops[-1].get('job_id')} {queue.split(' ', 1)[0]}" + asked
    if mark is not None and not finished:
        ended = f"; the last hop ended: {hops[-1].get('exit_reason') or 'killed'}" if hops else ""
        return "cancelled", f"{MARK}: {mark.said()}{ended}"
    if not hops and not summary:
        return "not started", "no hop in chain.json and no summary.json"
    last = hops[-1] if hops else None
    if last is not None and last.get("end") is None:
        return "crashed", (
            f"hop #{hop_number(last, len(hops) - 1)} never closed and no process holds run.lock "
            "(killed, out of memory, node failure, or an error: see the job's log)"
        )
    written_by = summary.get("hops")  # the number of hops when the summary was written
    if last is not None and (not summary or (isinstance(written_by, int) and written_by < len(hops))):
        return "crashed", f"hop #{hop_number(last, len(hops) - 1)} closed but wrote no summary.json"
    status = summary.get("status")
    if finished or status in ("finished", "already_finished"):  # early stopping finishes short of the total
        reason = summary.get("reason")
        said = {"finished": "all updates done", "early_stop": "early stopping", None: status}
        return "finished", f"summary.json: {said.get(reason, reason)}"
    if status == "stopped":
        return "stopped", f"summary.json: stopped ({summary.get('reason')}), resumable"
    if status == "failed":  # ended on purpose by the trainer (e.g. a non-finite loss), its last save intact
        where = summary.get("nonfinite_update")
        return "failed", f"summary.json: failed ({summary.get('reason')}" + (
            f" at update {where})" if where is not None else ")"
        )
    return "crashed", f"summary.json says {status!r}"
