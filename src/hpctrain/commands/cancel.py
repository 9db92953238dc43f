"""`hpctrain cancel RUN` / `hpctrain cancel --job ID`: end a run's chain; the run stays resumable.

1. The run folder: RUN, or the one job ID's comment names (`hpctrain:<via>:<run folder>`, set by the templates
   and `hpctrain submit`).
2. Its jobs: every job of this user whose comment names the folder (the running hop, a queued successor, a
   requeued job), and the last hop's job in chain.json while squeue still knows it; with `--sweep`, every task of
   the job array the run is an element of, and their run folders.
3. The mark (track/cancel.py) in each run folder, naming those jobs, BEFORE anything is signalled: whatever
   decides to go on afterwards (the chain, a successor's start, submitit's requeue, a supervisor) sees it.
4. A running job is asked to save and stop: USR1 to its steps (`scancel --signal=USR1 <job>.<step>`: every rank
   saves at the next step boundary and exits 75) and, for a template's job, to its batch shell (`--batch`: a hop
   not launched yet does not start; an array task's shell is not signalled, its chain and its training start
   read the mark). A queued job is cancelled (`scancel`): it holds no state. A training on this host with no
   job (run.lock's holder) gets USR1 itself.
Never imports torch (login nodes).
"""

from __future__ import annotations

import getpass
import os
import shutil
import signal
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

from hpctrain.commands.common import ArgParser
from hpctrain.errors import EXIT_OK, UserError
from hpctrain.fsutil import pid_alive
from hpctrain.track.cancel import read_mark, write_mark
from hpctrain.track.chain import read_chain, read_json
from hpctrain.track.runs import is_run_dir

_RUNNING = ("RUNNING", "CONFIGURING", "COMPLETING", "SIGNALING", "STAGE_OUT")
_COMMENT = "hpctrain:"


@dataclass(frozen=True)
class Job:
    id: str  # as scontrol names it: 12, or 12_3 for an array task
    state: str
    run_dir: Path | None  # from the job's comment
    via: str  # sbatch (a template: its batch shell passes signals on) | submitit (steps only) | "" (unknown)

    @property
    def array(self) -> str | None:
        return self.id.split("_", 1)[0] if "_" in self.id else None


def _squeue() -> tuple[list[Job], str | None]:
    """This user's jobs, one line per array task, and why there are none when squeue cannot answer (no SLURM
    here: a run outside SLURM is still cancelled through its lock holder)."""
    exe = shutil.which("squeue")
    if not exe:
        return [], "no squeue on this machine"
    try:
        done = subprocess.run(
            [exe, "-h", "-r", "-u", getpass.getuser(), "-o", "%i|%T|%k"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [], f"squeue did not answer ({exc})"
    if done.returncode != 0:
        said = (done.stderr.strip().splitlines() or [""])[-1].strip()
        return [], f"squeue failed ({said[:200] or done.returncode})"
    jobs = []
    for line in done.stdout.splitlines():
        job, _, rest = line.strip().partition("|")
        state, _, comment = rest.partition("|")
        via, run_dir = "", None
        if comment.startswith(_COMMENT):
            via, _, path = comment[len(_COMMENT) :].partition(":")
            run_dir = Path(path) if path else None
        if job:
            jobs.append(Job(job, state, run_dir, via))
    return jobs, None


def _same(a: Path | None, b: Path) -> bool:
    return a is not None and os.path.realpath(a) == os.path.realpath(b)


def _jobs_of(run_dir: Path, queue: list[Job]) -> list[Job]:
    """The queued or running jobs of one run folder: by their comment, and the last hop's job in chain.json."""
    found = [job for job in queue if _same(job.run_dir, run_dir)]
    hops = read_chain(run_dir / "chain.json").hops
    last = str(hops[-1].get("job_id") or "") if hops else ""
    found += [job for job in queue if job.id == last and job not in found]
    return found


def _scancel(*args: str) -> str | None:
    """None, or what scancel said when it failed (a job that ended meanwhile, for one)."""
    try:
        done = subprocess.run(["scancel", *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    return None if done.returncode == 0 else (done.stderr.strip() or f"exit code {done.returncode}")


def _steps(job: str) -> list[str]:
    """The job's running steps (`12.0`, `40_3.0`): signalled by their own ids, since `scancel --signal` on an array
    task (`40_3`) retries for a minute on SLURM 22.05 (measured on the local cluster) while a step id is instant."""
    try:
        done = subprocess.run(
            ["squeue", "-h", "--steps", "-j", job, "-o", "%i"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [s for s in done.stdout.split() if s.rpartition(".")[2].isdigit()]


def _act(job: Job) -> str:
    if job.state in _RUNNING:
        problems = [p for step in _steps(job.id) if (p := _scancel("--signal=USR1", step))]
        if job.via != "submitit" and job.array is None:
            # the template's shell passes USR1 on, or does not launch a hop that has not started (an array task's
            # shell is reached by the mark instead: its chain and its training start read it)
            problems += [p] if (p := _scancel("--batch", "--signal=USR1", job.id)) else []
        problem = problems[0] if problems else None
        said = "asked to save and stop (USR1)"
    else:
        problem = _scancel(job.id)
        said = "cancelled (it held no state)"
    return f"job {job.id} ({job.state.lower()}): " + (f"scancel failed: {problem}" if problem else said)


def _local_holder(run_dir: Path) -> int | None:
    """The pid of a training on this host that holds run.lock and runs in no job (nothing else can stop it)."""
    lock = read_json(run_dir / "run.lock", {})
    if not isinstance(lock, dict) or lock.get("job_id") or not isinstance(lock.get("pid"), int):
        return None
    if lock.get("host") != socket.gethostname() or not pid_alive(lock["pid"]):
        return None
    return int(lock["pid"])


def _finished(run_dir: Path) -> bool:
    summary = read_json(run_dir / "summary.json", {})
    return isinstance(summary, dict) and summary.get("status") in ("finished", "already_finished")


def cancel(plan: dict[Path, list[Job]], others: list[Job]) -> list[str]:
    """Mark every run folder (naming its jobs, or its local training), then ask the running to save and stop and
    cancel the queued (`others`: array tasks of no known folder); returns one line per action."""
    pids = {run_dir: None if jobs else _local_holder(run_dir) for run_dir, jobs in plan.items()}
    lines = []
    for run_dir, jobs in plan.items():
        pid = pids[run_dir]
        if not jobs and pid is None and _finished(run_dir):
            lines.append(f"run {run_dir} is finished: nothing to cancel")
            continue
        write_mark(run_dir, [job.id for job in jobs], [pid] if pid else [])
    lines += [_act(job) for job in [*(j for jobs in plan.values() for j in jobs), *others]]
    for pid in pids.values():
        if pid is not None:
            os.kill(pid, signal.SIGUSR1)
            lines.append(f"process {pid} on this host: asked to save and stop (USR1)")
    return lines or ["nothing was running or queued"]


def main(argv: list[str]) -> int:
    parser = ArgParser(
        prog="hpctrain cancel",
        description="End a run's chain: the running hop saves and stops, queued successors are cancelled; the "
        "run stays resumable (`hpctrain status` says cancelled; run or submit it again to continue).",
    )
    parser.add_argument("run_dir", type=Path, nargs="?", help="the run folder (<run.out_dir>/<run.name>)")
    parser.add_argument("--job", metavar="ID", help="a job of the run instead of its folder (squeue's id)")
    parser.add_argument(
        "--sweep", action="store_true", help="every element of the sweep (job array) the run is in"
    )
    args = parser.parse_args(argv)
    if (args.run_dir is None) == (args.job is None):
        raise UserError(
            "hpctrain cancel: name the run folder (hpctrain cancel RUN) or a job (--job ID), one of them"
        )
    queue, no_queue = _squeue()
    if no_queue and args.job is not None:
        raise UserError(f"hpctrain cancel --job {args.job}: {no_queue}; nothing was cancelled")
    if args.job is not None:
        job = next((j for j in queue if args.job in (j.id, j.id.split("_")[0]) and j.run_dir), None)
        if job is None or job.run_dir is None:
            known = any(args.job in (j.id, j.id.split("_")[0]) for j in queue)
            why = (
                "carries no hpctrain run folder in its comment" if known else "is not in your queue (squeue)"
            )
            raise UserError(
                f"hpctrain cancel --job {args.job}: the job {why}; end it with scancel {args.job}"
            )
        run_dir = job.run_dir
    else:
        run_dir = args.run_dir
        if not run_dir.is_dir() or not is_run_dir(run_dir):
            what = "is not a run folder (no chain.json, summary.json, config.yaml or run.lock)"
            raise UserError(f"hpctrain cancel {run_dir}: {what if run_dir.is_dir() else 'no such folder'}")
    plan = {run_dir: _jobs_of(run_dir, queue)}
    others: list[Job] = []
    if args.sweep:
        arrays = {job.array for job in plan[run_dir] if job.array}
        if not arrays:
            raise UserError(
                f"hpctrain cancel --sweep: no job of {run_dir} in the queue is a job array's task"
            )
        for job in queue:
            if job.array not in arrays or any(job in jobs for jobs in plan.values()):
                continue
            if job.run_dir is None:
                others.append(job)  # a task that has not started: no folder yet
            else:
                plan.setdefault(job.run_dir, []).append(job)
    if no_queue:
        print(f"note: {no_queue}: no SLURM job was looked for")
    for line in cancel(plan, others):
        print(line)
    for folder in (f for f in plan if read_mark(f) is not None):
        print(
            f"run {folder}: cancelled, resumable (`hpctrain status {folder}`; run or submit it again to continue)"
        )
    return EXIT_OK
