"""What state a run folder is in (running, finished, stopped, cancelled, failed, crashed, not started) and the
evidence for it, read from its files alone: what `hpctrain status` says of one run and of each row of a folder's
table."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

from hpctrain.fsutil import holder_alive
from hpctrain.track.cancel import MARK, CancelMark
from hpctrain.track.chain import hop_number, is_count, is_stamp, read_json

HEARTBEAT_FRESH = 120.0
_RUNNING_STATES = ("RUNNING", "COMPLETING", "CONFIGURING", "STAGE_OUT", "SIGNALING")


def lock_holder(run_dir: Path, now: float) -> str | None:
    """Who holds run.lock, as evidence for 'running' (None: nobody, or a stale lock: a dead holder, or a pid now
    used by another process, or a record that is damaged)."""
    lock = read_json(run_dir / "run.lock", {})
    pid, host, beat, started = lock.get("pid"), lock.get("host"), lock.get("heartbeat"), lock.get("started")
    identity = lock.get("identity") if isinstance(lock.get("identity"), str) else None
    if not (is_count(pid) and is_stamp(started) and is_stamp(beat)):
        return None  # no whole record (as train/runlock.py reads it): nobody's
    if host == socket.gethostname():
        # On this host the process table is the evidence: a fresh heartbeat of a dead pid is a killed run, and a
        # live pid that is another process than the holder (reused after a kill) a stale lock.
        alive = holder_alive(pid, identity, started)
        return f"run.lock held by live process {pid} on this host" if alive else None
    if now - beat < HEARTBEAT_FRESH:
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
        return "finished", f"summary.json: {said.get(reason, reason)}{copies_missing(summary)}"
    if status == "stopped":
        return (
            "stopped",
            f"summary.json: stopped ({summary.get('reason')}), resumable{copies_missing(summary)}",
        )
    if status == "failed":  # ended on purpose by the trainer (e.g. a non-finite loss), its last save intact
        where = summary.get("nonfinite_update")
        return "failed", f"summary.json: failed ({summary.get('reason')}" + (
            f" at update {where})" if where is not None else ")"
        )
    return "crashed", f"summary.json says {status!r}"


def copies_missing(summary: dict[str, Any]) -> str:
    """`; NOT copied to DEST (why): ...` for each checkpoint copy summary.json says did not arrive ("" if none)."""
    failures = summary.get("copy_failures")
    if not isinstance(failures, dict) or not failures:
        return ""
    shown = ", ".join(f"{dest} ({str(why)[:120]})" for dest, why in failures.items())
    return f"; its checkpoints were NOT copied to {shown}: run the same command again to copy them"
