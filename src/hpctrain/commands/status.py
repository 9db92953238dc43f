"""`hpctrain status RUN_DIR`: progress, hops, last checkpoint, throughput, goodput, what is left, queue state.
(A folder of run folders gets a table of its runs instead: status_table.py.)

Reads only the run folder's small files (chain.json, summary.json, config.yaml, run.lock, checkpoints/latest)
and asks `squeue` about the current job when it exists. Never imports torch: it runs on login nodes.

The state comes from evidence, in this order:
- running: run.lock names a live process on this host, or its heartbeat is younger than HEARTBEAT_FRESH
  seconds (a process on another node; a lock of this host whose process is gone is stale whatever its
  heartbeat), or squeue says the last hop's job runs;
- finished / stopped (resumable): summary.json, written at a clean exit, belongs to the last hop;
- crashed: the last hop never closed (or its summary is missing) and nobody holds the lock;
- not started: no hop and no summary yet.

How many more hops: from the wall time one hop gets (`hop_seconds`), first known of: the last hop's deadline in
chain.json (the SLURM job's end time or budget.time_limit, minus its start), squeue's time limit of the job,
slurm.time of a run that ran as SLURM jobs. A run without any (a local run without budget.time_limit) has no
hop estimate: "unknown", never a count extrapolated from a short local hop.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from hpctrain.commands.common import ArgParser
from hpctrain.commands.status_table import collect_rows, render_table, sort_rows
from hpctrain.config.schema import parse_duration
from hpctrain.errors import EXIT_OK, UserError
from hpctrain.track.cancel import read_mark
from hpctrain.track.chain import (
    changes_text,
    hop_number,
    is_count,
    is_stamp,
    read_chain,
    read_json,
    read_summary,
)
from hpctrain.track.run_state import lock_holder, run_state
from hpctrain.track.runs import SEARCH_DEPTH, find_runs, is_run_dir, read_config, section, tail_records
from hpctrain.track.what_ran import describe

LOGGED_TAIL = 16 * 1024  # bytes of metrics.jsonl read for its last record (a few records)


def _pointer(folder: Path) -> str | None:
    """The step file `checkpoints/latest` names (None: no pointer, or one that names no step file)."""
    try:
        with open(folder / "latest", "rb") as handle:
            named = handle.read(256).decode("utf-8", "replace").strip()
    except OSError:
        return None
    return named if re.fullmatch(r"step_\d+\.pt", named) else None


def _when(stamp: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(stamp)) if is_stamp(stamp) and stamp else "-"


def _duration(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "unknown"
    seconds = int(max(seconds, 0))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


# run.lock's heartbeat is refreshed at least every 30 s while the run holds it.
def queue_state(job_id: str | None) -> str | None:
    """`squeue` on the job: state, elapsed, time left, reason; None when squeue is missing or silent."""
    exe = shutil.which("squeue")
    if not exe or not job_id:
        return None
    try:
        done = subprocess.run(
            [exe, "-h", "-j", str(job_id), "-o", "%T elapsed %M, left %L, %R"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    out = done.stdout.strip()
    return out if done.returncode == 0 and out else ("not in the queue" if done.returncode == 0 else None)


def queue_time_limit(job_id: str | None) -> float | None:
    """The job's time limit in seconds from `squeue -o %l` (None when unknown, UNLIMITED or no squeue)."""
    exe = shutil.which("squeue")
    if not exe or not job_id:
        return None
    try:
        done = subprocess.run(
            [exe, "-h", "-j", str(job_id), "-o", "%l"], capture_output=True, text=True, timeout=10
        )
        return parse_duration(done.stdout.strip()) if done.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return None


def hop_seconds(hops: list[dict[str, Any]], cfg: dict[str, Any]) -> tuple[float | None, str]:
    """(wall seconds one hop gets, where that comes from); (None, why) when no time limit is known."""
    if not hops:
        return None, "no hop yet"
    hop = hops[-1]  # the latest settings: an earlier hop's limit may no longer hold
    deadline, start = hop.get("deadline"), hop.get("start")
    if isinstance(deadline, (int, float)) and isinstance(start, (int, float)) and deadline > start:
        return deadline - start, f"hop #{hop_number(hop, len(hops) - 1)}'s deadline in chain.json"
    job = hop.get("job_id")
    limit = queue_time_limit(job)
    if limit:
        return limit, f"squeue time limit of job {job}"
    slurm_time = section(cfg, "slurm").get("time")
    if job and slurm_time:
        try:
            return parse_duration(slurm_time), f"slurm.time={slurm_time}"
        except ValueError:
            pass
    return None, "no job time limit known (no deadline in chain.json, no SLURM job)"


def hop_estimate(
    left: int, per_wall: float | None, limit: float | None, running_hop: dict[str, Any] | None, now: float
) -> int | None:
    """Hops still needed after the current one (when running) for `left` updates at `per_wall` updates per
    wall second, each hop getting `limit` seconds; None when the rate or the limit is unknown."""
    if left <= 0:
        return 0
    if not per_wall or not limit:
        return None
    if running_hop is not None:
        deadline = running_hop.get("deadline")
        end = deadline if isinstance(deadline, (int, float)) else running_hop["start"] + limit
        left -= int(per_wall * max(end - now, 0.0))  # what the current hop still does
        if left <= 0:
            return 0
    return math.ceil(left / (per_wall * limit))


def collect(run_dir: Path) -> dict[str, Any]:
    """Everything the status shows, as plain data (also printed with --json)."""
    if not run_dir.is_dir():
        what = "is a file, not a run folder" if run_dir.exists() else "does not exist"
        raise UserError(f"run folder {str(run_dir)!r} {what}")
    chain = read_chain(run_dir / "chain.json")
    hops = chain.hops
    summary = read_summary(run_dir)
    cfg = read_config(run_dir)  # bounded as --config is (a planted alias bomb costs nothing)
    if not is_run_dir(run_dir):
        raise UserError(
            f"{run_dir} is not a run folder (no chain.json, summary.json, config.yaml or run.lock) and holds "
            f"none {SEARCH_DEPTH} levels down"
        )
    total = summary.get("total_updates") or _count(section(cfg, "train").get("total_updates"))
    pointer = _pointer(run_dir / "checkpoints")
    checkpoint = None
    if pointer:
        ckpt = run_dir / "checkpoints" / pointer
        meta = read_json(ckpt.with_suffix(".json"), {})
        checkpoint = {
            "path": str(ckpt),
            "step": _count(meta.get("step")),
            "time": _mtime(ckpt),
        }
    # metrics.jsonl's last record: where a running hop is now (chain.json and the checkpoint lag by up to
    # checkpoint.every updates); a resume cuts the file back to its checkpoint, so no record is from a dead past
    logged = tail_records(run_dir / "metrics.jsonl", block=LOGGED_TAIL).records
    last_logged = max((r for r in logged if is_stamp(r.get("time"))), key=_step, default=None)
    done = max(
        [int(h.get("last_update") or 0) for h in hops]
        + [int(summary.get("step") or 0)]
        + [_step(last_logged) if last_logged else 0]
    )
    now = time.time()
    walls = [((h.get("end") or h.get("last_seen") or now) - h["start"]) for h in hops]
    trained = sum(float(h.get("train_seconds") or 0.0) for h in hops)
    progress = sum(max(int(h.get("last_update") or 0) - int(h.get("first_update") or 0), 0) for h in hops)
    wall = sum(walls)
    finished = (
        summary.get("status") in ("finished", "already_finished") and total is not None and done >= total
    )
    left = max((total or 0) - done, 0)
    per_wall = progress / wall if wall > 0 else None
    slurm = section(cfg, "slurm")
    holder = lock_holder(run_dir, now)
    queue = queue_state(hops[-1].get("job_id")) if hops and not finished else None
    state, evidence = run_state(hops, summary, holder, queue, finished, read_mark(run_dir))
    limit, limit_source = hop_seconds(hops, cfg) if not finished else (None, "finished")
    running_hop = hops[-1] if state == "running" and hops else None
    return {
        "run_dir": str(run_dir),
        "status": state,
        "evidence": evidence,
        "updates_done": done,
        "total_updates": total,
        "hops": hops,
        "chain_problem": chain.problem,
        "last_checkpoint": checkpoint,
        "last_logged": {"step": _step(last_logged), "time": last_logged["time"]} if last_logged else None,
        "updates_per_train_second": progress / trained if trained > 0 else None,
        "updates_per_wall_second": per_wall,
        "goodput": trained / wall if wall > 0 else None,
        "remaining_wall_seconds": (left / per_wall) if per_wall else (0.0 if finished else None),
        "remaining_hops": 0 if finished else hop_estimate(left, per_wall, limit, running_hop, now),
        "hop_seconds": limit,
        "hop_seconds_source": limit_source,
        "resubmit": slurm.get("resubmit"),
        "queue": queue,
    }


_STATE_TEXT = {
    "stopped": "stopped, resumable (run the same command again, or hpctrain submit)",
    "cancelled": "cancelled, resumable (run the same command again, or hpctrain submit, to continue it)",
    "crashed": "crashed (resume with the same command: it continues from the last checkpoint)",
    "failed": "failed (fix the cause, e.g. a lower optim.lr with checkpoint.accept_changes, then run again: it "
    "continues from the last good checkpoint)",
}


def render(info: dict[str, Any]) -> str:
    total = info["total_updates"]
    share = f" ({100 * info['updates_done'] / total:.1f}%)" if total else ""
    lines = [
        f"run {info['run_dir']}: {_STATE_TEXT.get(info['status'], info['status'])} ({info['evidence']})",
        f"updates {info['updates_done']} of {total if total is not None else '?'}{share}",
        f"hops {len(info['hops'])}:",
    ]
    if info["chain_problem"]:
        lines.insert(
            -1,
            f"chain.json is damaged ({info['chain_problem']}): only the hop records that could be read are "
            "shown; the next training start keeps it aside as chain.json.bad-<time> and rebuilds it",
        )
    for i, hop in enumerate(info["hops"]):
        changed = changes_text(hop, info["hops"][i - 1] if i else None)
        if changed:  # the boundary where this hop's configuration differs from the previous hop's
            lines.append(f"  -- changed at update {hop.get('first_update')}: {changed}")
        end = (
            _when(hop.get("end"))
            if hop.get("end")
            else ("running" if info["status"] == "running" else "killed")
        )
        goodput = f"{hop['goodput']:.2f}" if hop.get("goodput") is not None else "-"
        lines.append(
            f"  #{hop_number(hop, i)} job {hop.get('job_id') or '-'} on {hop.get('nodes') or '-'} "
            f"{_when(hop.get('start'))} -> {end}: "
            f"updates {hop.get('first_update')}->{hop.get('last_update')}, "
            f"{hop.get('exit_reason') or '-'}, goodput {goodput}"
            + (" (rebuilt from the checkpoints: chain.json was damaged)" if hop.get("rebuilt") else "")
        )
    ran = [(i, h["ran"]) for i, h in enumerate(info["hops"]) if isinstance(h.get("ran"), dict)]
    if ran:  # what the latest hop runs (ran) under: versions, GPUs, hosts, the config's git commit
        index, record = ran[-1]
        lines.append(f"ran (hop #{hop_number(info['hops'][index], index)}): {describe(record)}")
    ckpt = info["last_checkpoint"]
    lines.append(
        f"last checkpoint: {ckpt['path']} (update {ckpt['step']}, {_when(ckpt['time'])})"
        if ckpt
        else "last checkpoint: none"
    )
    logged = info["last_logged"]
    if logged and info["status"] == "running":
        lines.append(f"last logged: update {logged['step']} at {_when(logged['time'])} (metrics.jsonl)")
    rate = info["updates_per_train_second"]
    wall_rate = info["updates_per_wall_second"]
    lines.append(
        "throughput: "
        + (f"{rate:.2f} updates/s in training steps, " if rate else "")
        + (f"{wall_rate:.2f} updates/s of wall time" if wall_rate else "unknown")
    )
    goodput = info["goodput"]
    lines.append(
        f"goodput: {goodput:.2f} (training-step time / allocated time)"
        if goodput is not None
        else "goodput: -"
    )
    hops_left = info["remaining_hops"]
    if info["status"] == "finished":
        lines.append("remaining: nothing (finished)")
        return _with_queue(lines, info)
    if hops_left is None:
        hops_text = f"more hops: unknown ({info['hop_seconds_source']})"
    else:
        after = " after the running one" if info["status"] == "running" else ""
        hops_text = (
            f"about {hops_left} more hop(s){after} of {_duration(info['hop_seconds'])} "
            f"({info['hop_seconds_source']})"
        )
    lines.append(f"remaining: {_duration(info['remaining_wall_seconds'])} of wall time; {hops_text}")
    return _with_queue(lines, info)


def _with_queue(lines: list[str], info: dict[str, Any]) -> str:
    if info["queue"]:
        lines.append(f"queue: job {info['hops'][-1].get('job_id')} {info['queue']}")
    return "\n".join(lines)


def _step(record: dict[str, Any]) -> int:
    return int(record["step"])


def _count(value: Any) -> int | None:
    return value if is_count(value) else None


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def main(argv: list[str]) -> int:
    parser = ArgParser(
        prog="hpctrain status",
        description="Progress, hops and goodput of a run folder; a table of the runs in a folder of run folders.",
    )
    parser.add_argument(
        "run_dir", type=Path, help="a run folder (<run.out_dir>/<run.name>), or a folder of them (e.g. logs/)"
    )
    parser.add_argument("--json", action="store_true", help="print JSON (a list of objects for a table)")
    parser.add_argument("--sort", metavar="KEY", help="order the table by KEY (name, state, update, progress, "
                        "last, best, auc, goal, hops, goodput, activity; default name); auc and goal order a "
                        "sweep of generators by physics, the best first")  # fmt: skip
    parser.add_argument("--reverse", action="store_true", help="the table in the opposite order")
    args = parser.parse_args(argv)
    runs = [] if not args.run_dir.is_dir() or is_run_dir(args.run_dir) else find_runs(args.run_dir)
    if runs:
        rows = sort_rows(collect_rows(args.run_dir, runs), args.sort or "name", args.reverse)
        print(json.dumps(rows) if args.json else render_table(rows))
        return EXIT_OK
    if args.sort or args.reverse:
        raise UserError(f"--sort and --reverse order a table of runs; {args.run_dir} is one run folder")
    info = collect(args.run_dir)
    print(json.dumps(info) if args.json else render(info))
    return EXIT_OK
