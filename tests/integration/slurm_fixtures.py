"""A real local SLURM cluster (hpc/local-cluster) as a session-scoped pytest fixture.

tests/conftest.py registers it for the whole suite (pytest_plugins): a test just names it. Do not import the
fixture into a test module: pytest would take that for a second session fixture and start a second cluster.

    def test_something(slurm_cluster, tmp_path):
        job = slurm_cluster.sbatch(["-N1", "--gres=gpu:1", "job.sh"], cwd=tmp_path)
        assert slurm_cluster.wait(job, timeout=30) == "COMPLETED"

The cluster has 2 nodes c1, c2 (partition `debug`), 4 GPUs (gres), 16 CPUs and 64000 MB each, real
accounting (slurmdbd), KillWait=5 s, a requeue hop of ~6 s. Each test gets it with both nodes in service: a
NodeKeeper thread resumes a node SLURM drains because a job's step outlived SIGKILL ("Kill task failed"), as a
site's admin would, and a warning names the node and the processes that would not die. Jobs inherit
`slurm_cluster.env` (sbatch's default --export=ALL), whose PATH starts with this interpreter's bin folder, so
`python` and `hpctrain` inside a job are the venv's. Node names do not resolve: use `node_addr("c1")` (127.0.0.1).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LOCAL_CLUSTER = REPO / "hpc" / "local-cluster"
TERMINAL_STATES = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "PREEMPTED",
        "OUT_OF_MEMORY",
        "BOOT_FAIL",
        "DEADLINE",
    }
)
# States in which a job still holds (or waits for) resources; cancel_all waits for these to clear.
ACTIVE_STATES = "PENDING,RUNNING,SUSPENDED,COMPLETING,CONFIGURING,REQUEUED,RESIZING,SIGNALING,STAGE_OUT"
# Words of sinfo's node state (%T: drained, draining, mixed+drain, down*, failing...) for a node the scheduler
# starts no job on.
OUT_OF_SERVICE = ("drain", "down", "fail")


@dataclass
class SlurmCluster:
    """Handle on a running local cluster. All commands run with `env` (SLURM_CONF, PATH)."""

    state_dir: Path
    env: dict[str, str]

    def run(self, argv: list[str], check: bool = True, timeout: float = 30, cwd: str | Path | None = None):
        """Run a SLURM client command against this cluster; returns the CompletedProcess (text)."""
        res = subprocess.run(argv, capture_output=True, text=True, env=self.env, timeout=timeout, cwd=cwd)
        if check and res.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed ({res.returncode}): {res.stderr.strip()}")
        return res

    def sbatch(self, args: list[str], cwd: str | Path | None = None) -> str:
        """Submit (options before the script, as sbatch wants them); returns the job id."""
        out = self.run(["sbatch", "--parsable", *args], cwd=cwd).stdout.strip()
        return out.split(";")[0]  # "id" or "id;cluster"

    def scontrol(self, *args: str, check: bool = True) -> str:
        """`scontrol ARGS...` on this cluster; returns stdout."""
        return self.run(["scontrol", *args], check=check).stdout

    def job_info(self, job_id: str) -> dict[str, str]:
        """`scontrol show job -o` as a dict ({} once the controller forgot the job, MinJobAge=10 s)."""
        res = self.run(["scontrol", "show", "job", "-o", str(job_id)], check=False)
        if res.returncode != 0:
            return {}
        return dict(tok.split("=", 1) for tok in res.stdout.split() if "=" in tok)

    def sacct_state(self, job_id: str) -> str | None:
        """State of the job's allocation in accounting (lags the controller by up to ~1 s)."""
        res = self.run(["sacct", "-n", "-X", "-P", "-o", "State", "-j", str(job_id)], check=False)
        lines = res.stdout.split()
        return lines[0].split()[0] if res.returncode == 0 and lines else None  # "CANCELLED by 0" -> CANCELLED

    def state(self, job_id: str) -> str | None:
        """Current state: from the controller while it knows the job, else from accounting."""
        info = self.job_info(job_id)
        return info.get("JobState") or self.sacct_state(job_id)

    def wait(
        self, job_id: str, states: Iterable[str] = TERMINAL_STATES, timeout: float = 60, poll: float = 0.2
    ) -> str:
        """Wait until the job is in one of `states` (or any terminal state); return that state.

        Raises TimeoutError after `timeout` seconds, naming the last state seen.
        """
        wanted = set(states)
        deadline = time.monotonic() + timeout
        state = None
        while time.monotonic() < deadline:
            state = self.state(job_id)
            if state in wanted or state in TERMINAL_STATES:
                return state
            time.sleep(poll)
        why = f"; {self.pending_reason(job_id)}" if state == "PENDING" else ""
        raise TimeoutError(
            f"job {job_id} still {state} after {timeout:.0f} s (waiting for {sorted(wanted)}){why}"
        )

    def wait_sacct(self, job_id: str, state: str = "COMPLETED", timeout: float = 15) -> str:
        """Wait until accounting (sacct) reports a terminal state for the job; return it."""
        deadline = time.monotonic() + timeout
        seen = None
        while time.monotonic() < deadline:
            seen = self.sacct_state(job_id)
            if seen == state or seen in TERMINAL_STATES:
                return seen
            time.sleep(0.2)
        raise TimeoutError(f"sacct still says {seen} for job {job_id} after {timeout:.0f} s")

    def node_addr(self, node: str) -> str:
        """The address a node listens on (node names like c1 do not resolve on this machine)."""
        info = self.run(["scontrol", "show", "node", "-o", node]).stdout
        return dict(tok.split("=", 1) for tok in info.split() if "=" in tok)["NodeAddr"]

    def nodes_out_of_service(self) -> dict[str, str]:
        """{node: "state (SLURM's reason)"} for each node the scheduler starts no job on."""
        res = self.run(["sinfo", "-h", "-N", "-o", "%N|%T|%E"], check=False)
        found = {}
        for line in res.stdout.splitlines():
            node, state, reason = [*line.split("|", 2), "", ""][:3]
            if any(word in state for word in OUT_OF_SERVICE):
                found[node] = f"{state} ({reason.strip() or 'no reason given'})"
        return found

    def return_nodes_to_service(self, timeout: float = 60) -> dict[str, str]:
        """Resume every node out of service (drained, down), wait until the scheduler can use it again, and return
        what was found ({} when all were in service). Raises if a node stays out (say, its slurmd died)."""
        found = self.nodes_out_of_service()
        for node in found:
            self.run(["scontrol", "update", f"nodename={node}", "state=resume"], check=False)
        deadline = time.monotonic() + timeout
        while (left := self.nodes_out_of_service()) and time.monotonic() < deadline:
            time.sleep(0.5)
        if left:
            raise RuntimeError(f"SLURM nodes still out of service {timeout:.0f} s after a resume: {left}")
        return found

    def pending_reason(self, job_id: str) -> str:
        """Why a job waits (squeue's reason, say Resources) and which nodes are out of service, for a failure."""
        res = self.run(["squeue", "-h", "-j", str(job_id), "-o", "%T %r"], check=False)
        out = self.nodes_out_of_service()
        return f"squeue: {res.stdout.strip() or res.stderr.strip() or '-'}; nodes out of service: {out or 'none'}"

    def unkillable_log(self) -> str:
        """What hpc/local-cluster's UnkillableStepProgram wrote (a header and the machine's processes, as a forest)
        each time a step would not die; "" if none did."""
        path = self.state_dir / "log" / "unkillable.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def unkillable_steps(self, text: str | None = None) -> str:
        """unkillable_log (or a part of it) cut to what matters: each header, and each step daemon with the
        processes under it."""
        kept: list[str] = []
        command_at, depth = 0, None  # where ps's COMMAND column starts; the slurmstepd being followed
        for line in (self.unkillable_log() if text is None else text).splitlines():
            if line.startswith("== ") or "COMMAND" in line:
                command_at, depth = (line.index("COMMAND") if "COMMAND" in line else command_at), None
                kept += [line] if line.startswith("== ") else []
                continue
            command = line[command_at:]
            indent = len(command) - len(command.lstrip(" \\_|"))
            if "slurmstepd" in command:
                depth = indent
            elif depth is not None and indent <= depth:
                depth = None
            if depth is not None:
                kept.append(line)
        return "\n".join(kept)

    def active_jobs(self) -> list[str]:
        return self.run(["squeue", "-h", "-t", ACTIVE_STATES, "-o", "%A"]).stdout.split()

    def cancel_all(self, timeout: float = 120) -> None:
        """Cancel every job of THIS cluster (no other cluster is touched) and wait until none is active (a hop
        that was starting saves and exits first: ~30 s on a loaded machine)."""
        jobs = self.active_jobs()
        if jobs:
            self.run(["scancel", *jobs], check=False)
        deadline = time.monotonic() + timeout
        while jobs and time.monotonic() < deadline:
            time.sleep(0.2)
            jobs = self.active_jobs()
        if jobs:
            raise TimeoutError(f"jobs {jobs} still active {timeout:.0f} s after scancel")


def local_cluster(
    *args: str, timeout: float = 180, check_rc: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run hpc/local-cluster; raise with its stderr when it fails (never skip: CI starts with nothing)."""
    res = subprocess.run(
        [sys.executable, str(LOCAL_CLUSTER), *args], capture_output=True, text=True, timeout=timeout
    )
    if check_rc and res.returncode != 0:
        raise RuntimeError(f"hpc/local-cluster {' '.join(args)} failed:\n{res.stderr}{res.stdout}")
    return res


def cluster_env(state_dir: Path, conf: str) -> dict[str, str]:
    """os.environ plus SLURM_CONF, with the venv's bin (and the sacct shim, if any) first on PATH."""
    path = [str(Path(sys.executable).parent)]
    shim = state_dir / "bin"
    if (shim / "sacct").exists():
        path.insert(0, str(shim))
    return dict(os.environ, SLURM_CONF=conf, PATH=os.pathsep.join([*path, os.environ.get("PATH", "")]))


def start_cluster(state_dir: Path, *up_args: str) -> SlurmCluster:
    """install + up in `state_dir`; returns the handle. The caller must `stop_cluster` it."""
    local_cluster("install")
    res = local_cluster("up", "--state-dir", str(state_dir), *up_args)
    last = res.stdout.strip().splitlines()[-1]
    assert last.startswith("export SLURM_CONF="), res.stdout
    return SlurmCluster(state_dir=state_dir, env=cluster_env(state_dir, last.split("=", 1)[1]))


def stop_cluster(cluster: SlurmCluster) -> None:
    """Cancel leftovers, then stop the daemons (down waits for them to exit)."""
    try:
        cluster.cancel_all()
    finally:
        local_cluster("down", "--state-dir", str(cluster.state_dir), timeout=60)


KILL_TASK_FAILED = "Kill task failed"  # SLURM's reason for a node whose job step outlived SIGKILL


class NodeKeeper(threading.Thread):
    """What a site's admin (or its node health check) does, every `every` s while the session's cluster runs: a node
    SLURM drained because a job's step outlived SIGKILL ("Kill task failed") is resumed. One step stuck on a loaded
    machine's disk then never holds every later multi-node job PENDING (CI, once: c1 drained during a sweep test,
    and two template tests later waited 300 s for it). What it did is kept for the tests' warnings (`take_notes`)."""

    def __init__(self, cluster: SlurmCluster, every: float = 5.0) -> None:
        super().__init__(name="slurm-node-keeper", daemon=True)
        self.cluster, self.every = cluster, every
        self.halt = threading.Event()
        self._notes: list[str] = []
        self._lock = threading.Lock()
        self._log_seen = 0  # how much of unkillable.log earlier notes quoted

    def run(self) -> None:
        while not self.halt.wait(self.every):
            try:
                self.keep()
            except (OSError, subprocess.SubprocessError):  # a loaded machine's slow sinfo: the next round
                continue

    def keep(self) -> None:
        drained = {
            n: why for n, why in self.cluster.nodes_out_of_service().items() if KILL_TASK_FAILED in why
        }
        if not drained:
            return
        time.sleep(2)  # slurmstepd runs UnkillableStepProgram as it gives up: let it write its listing
        for node in drained:
            self.cluster.run(["scontrol", "update", f"nodename={node}", "state=resume"], check=False)
        log = self.cluster.unkillable_log()
        steps = self.cluster.unkillable_steps(log[self._log_seen :]) or "none listed"
        self._log_seen = len(log)
        with self._lock:
            self._notes.append(
                f"{time.strftime('%H:%M:%S')} resumed {drained}; processes that would not die: {steps}"
            )

    def take_notes(self) -> list[str]:
        """What was done since the last call."""
        with self._lock:
            notes, self._notes = self._notes, []
        return notes


_UP: list[tuple[SlurmCluster, NodeKeeper]] = []  # the session's cluster and its keeper, while it is up
_LAST: list[str] = []  # the last test that had it


def node_keeper() -> NodeKeeper:
    """The session cluster's keeper (for the test of it)."""
    return _UP[0][1]


@pytest.fixture(scope="session")
def slurm_session_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """A 2-node local SLURM cluster for the whole test session, with its NodeKeeper; torn down at the end. Tests
    take it through `slurm_cluster`. A module that imports this fixture registers it a second time: that one hands
    out the same cluster instead of starting another."""
    if _UP:
        yield _UP[0][0]
        return
    cluster = start_cluster(tmp_path_factory.mktemp("slurm"), "--nodes", "2")
    keeper = NodeKeeper(cluster)
    keeper.start()
    _UP.append((cluster, keeper))
    try:
        yield cluster
    finally:
        _UP.clear()
        keeper.halt.set()
        keeper.join(timeout=60)
        stop_cluster(cluster)


def _warn_of(notes: list[str], when: str) -> None:
    if notes:
        warnings.warn(f"SLURM nodes drained {when}: {' | '.join(notes)}", stacklevel=2)


@pytest.fixture(name="slurm_cluster")
def slurm_cluster_fixture(
    slurm_session_cluster: SlurmCluster, request: pytest.FixtureRequest
) -> Iterator[SlurmCluster]:
    """The session's cluster for one test, every node in service: a node still out of service at the start (drained
    by hand, down) is resumed with a warning, and one that stays out (say, its slurmd died) fails the test here,
    naming it. A warning also tells what the keeper did since the last test, and during this one."""
    cluster = slurm_session_cluster
    _warn_of(node_keeper().take_notes(), f"after {_LAST[-1]}" if _LAST else "before the first SLURM test")
    if found := cluster.return_nodes_to_service():
        warnings.warn(
            f"SLURM nodes out of service at the start of {request.node.nodeid}, resumed: {found}",
            stacklevel=1,
        )
    yield cluster
    _LAST[:] = [request.node.nodeid]
    _warn_of(node_keeper().take_notes(), f"during {request.node.nodeid}")


# The same fixture under its own name, for modules written when it had to be imported (no longer needed).
slurm_cluster = slurm_cluster_fixture
