"""A stop signal at a hop's very start, under the real templates and srun: while the training process is still
starting (before its handlers exist), a preemption's USR1 to the job's steps, or a TERM to every process of the
job, is a stop and the chain goes on, never a failed hop that ends the chain.

The start is held open with the fault hook (tests/faulthook: each `hpctrain train` waits at a gate, before any
hpctrain line runs, until the test opens it); the task is seen there with the stop signals blocked, and the USR1
seen pending in it (not yet handled)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.conftest import start_gate
from tests.integration.slurm_fixtures import SlurmCluster
from tests.integration.slurm_project import (
    failure_log,
    log_of,
    loss_steps,
    make_project,
    read_json,
    submit,
    wait_done,
    wait_for,
)

pytestmark = pytest.mark.integration
USR1_BIT, TERM_BIT = 1 << 9, 1 << 14  # signal N is bit N-1 of /proc/PID/status masks


def training_pid(cluster: SlurmCluster, job: str) -> int | None:
    """PID of the job's `hpctrain train` Python process (found through /proc: we run as root, like slurmd). Job ids
    start at 1 on every local cluster: the cluster's SLURM_CONF tells ours from another test session's."""
    conf = f"SLURM_CONF={cluster.env['SLURM_CONF']}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"python" not in argv[0] or b"train" not in argv or not any(a.endswith(b"hpctrain") for a in argv):
            continue  # srun's and perl's command lines name `hpctrain train` too
        if f"SLURM_JOB_ID={job}".encode() in environ and conf in environ:
            return int(entry.name)
    return None


def masks(pid: int) -> dict[str, int]:
    """The process's blocked and pending signal sets; all 0 once it is gone."""
    fields = {"SigBlk": 0, "SigPnd": 0, "ShdPnd": 0}
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return fields
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in ("SigBlk", "SigPnd", "ShdPnd"):
            fields[key] = int(value.strip(), 16)
    return fields


def pending(pid: int, bit: int) -> bool:
    """Whether the signal `bit` becomes pending in the process (blocked, not yet handled) within a minute (it
    waits at its gate meanwhile)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        now = masks(pid)
        if (now["SigPnd"] | now["ShdPnd"]) & bit:
            return True
        time.sleep(0.02)
    return False


@pytest.mark.parametrize(
    ("how", "bit"),
    [(["--signal=USR1"], USR1_BIT), (["--full", "--signal=TERM"], TERM_BIT)],
    ids=["usr1-to-steps", "term-to-all"],
)
def test_a_stop_signal_while_the_task_starts_is_a_stop_and_the_chain_goes_on(
    slurm_cluster: SlurmCluster, tmp_path: Path, how: list[str], bit: int
) -> None:
    """USR1 to the steps (a preemption's warning, `scancel --signal=USR1`): the task takes it once its handlers
    are in, as a stop. TERM to every process of the job (as at a preemption without warning): the batch shell
    passes it on as USR1, but srun got the TERM too and SIGKILLs its tasks whatever they do; the shell counts
    that hop as stopped, and the chain goes on from the last checkpoint either way."""
    project = make_project(tmp_path / "proj")
    args = [
        "slurm/single_gpu.sh",
        "--preset",
        "debug",
        "run.name=early",
        "train.threads=1",
        "logging.log_every=1",
    ]
    work = [*args, "train.total_updates=12", "checkpoint.every=4"]
    gate = project / "gate"
    job = submit(slurm_cluster, project, work, **start_gate(gate))
    try:
        pid = wait_for(lambda: training_pid(slurm_cluster, job), "the training task", timeout=300, poll=0.05)
        assert masks(pid)["SigBlk"] & bit  # started shielded, still before its handlers
        slurm_cluster.run(["scancel", *how, job])
        if bit == USR1_BIT:
            assert pending(pid, bit), "the signal did not arrive inside the start"
        gate.touch()  # the start goes on (and the next hops' pass at once)
        state = wait_done(slurm_cluster, project, job, timeout=180, progress=lambda: log_of(project, job))
        assert state == "COMPLETED", failure_log(project, job)[-3000:]
    finally:
        slurm_cluster.cancel_all()
    chain = read_json(project / "logs" / "early" / "chain.json", [])
    log = log_of(project, job)
    assert chain[-1]["exit_reason"] == "finished", chain
    assert loss_steps(project / "logs" / "early") == list(range(1, 13))
    assert "training failed" not in log and "requeueing job" in log, log[-3000:]
    if bit == USR1_BIT:  # a clean stop: one update trained and saved
        assert chain[0]["exit_reason"] == "signal" and chain[1]["first_update"] == chain[0]["last_update"]
    else:  # killed by srun before it could record its hop: the next hop starts from nothing kept
        assert "after SIGTERM: counted as a stop" in log, log[-3000:]
        assert chain[0]["first_update"] == 0
