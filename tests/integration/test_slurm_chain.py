"""Chained resubmission, preemption, a killed rank and the no-progress cap, with the real templates.

Hops are throttled with the checkpoint layer's fault hook (tests/faulthook: every save sleeps) so
that the work needs several hops whatever the machine's speed, and so that a test can act mid-run.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import clean_env, save_pause
from tests.integration.slurm_fixtures import SlurmCluster
from tests.integration.slurm_project import (
    failure_log,
    log_of,
    loss_steps,
    make_project,
    read_json,
    submit,
    variant,
    wait_done,
    wait_for,
)

pytestmark = pytest.mark.integration
# The CPU debug job's settings (as the uninterrupted reference runs them), not the template's own preset.
DEBUG = ["--preset", "debug"]
# distributed.timeout_seconds of the killed-rank test (the default is 300)
PEER_TIMEOUT = 15


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return make_project(tmp_path / "proj")


def hops(project: Path, name: str) -> list[dict]:
    return read_json(project / "logs" / name / "chain.json", [])


@pytest.mark.timeout(900)  # ~2 minutes idle; at load 14 a hop's start alone takes ~30 s of its minute
def test_chain_of_short_hops_equals_an_uninterrupted_run(slurm_cluster: SlurmCluster, project: Path) -> None:
    # 1-minute hops; the trainer stops itself 20 s before the end (budget margin: its save, exit and the requeue
    # fit in it), so a hop trains for at most 40 s less its start. In the first two hops every save pauses 2.8 s:
    # their work (30 saves: 84 s; 16 or more still left for the second) exceeds 40 s, so both run out of time on
    # any machine; the third trains at full speed and finishes (on a loaded machine a fourth may).
    script = variant(project, "single_gpu", "chain", time="00:01:00", signal="B:USR1@15", cpus_per_task="1")
    work = ["train.threads=1", "train.total_updates=600", "checkpoint.every=20", "logging.log_every=1"]
    job = submit(
        slurm_cluster,
        project,
        [script.name, *DEBUG, "run.name=chain", "budget.margin_seconds=20", *work],
        **save_pause(2.8, hops=2),
    )
    # The same run without interruption, meanwhile, outside SLURM.
    ref = subprocess.Popen(
        [sys.executable, "-m", "hpctrain", "train", "run.name=ref", *work],
        cwd=project,
        env=clean_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # However slow the hops, each one moves chain.json; 3 minutes without a change is a stuck chain.
        state = wait_done(slurm_cluster, project, job, timeout=180, progress=lambda: hops(project, "chain"))
        assert state == "COMPLETED", failure_log(project, job)[-3000:]
        assert ref.wait(timeout=300) == 0, ref.stderr.read() if ref.stderr else ""
    finally:
        ref.kill()
        slurm_cluster.cancel_all()
    chain = hops(project, "chain")
    assert len(chain) >= 3, chain
    assert all(h["exit_reason"] in ("time_budget", "signal") for h in chain[:-1])
    assert chain[-1]["exit_reason"] == "finished"
    for before, after in zip(chain, chain[1:]):
        assert after["first_update"] == before["last_update"]  # nothing lost, nothing repeated
    assert len({h["job_id"] for h in chain}) == 1  # requeued: the same job id every hop
    run, ref_run = project / "logs" / "chain", project / "logs" / "ref"
    assert (
        read_json(run / "summary.json")["params_sha256"]
        == read_json(ref_run / "summary.json")["params_sha256"]
    )
    assert loss_steps(run) == list(range(1, 601))


def test_preemption_by_scancel_signal_usr1(slurm_cluster: SlurmCluster, project: Path) -> None:
    job = submit(
        slurm_cluster,
        project,
        [
            "slurm/single_gpu.sh",
            *DEBUG,
            "run.name=preempt",
            "train.threads=1",
            "train.total_updates=200",
            "checkpoint.every=20",
            "logging.log_every=1",
        ],
        **save_pause(0.5),
    )
    try:
        run = project / "logs" / "preempt"
        wait_for(lambda: (run / "checkpoints" / "latest").exists(), "first checkpoint", timeout=300)
        slurm_cluster.run(["scancel", "--signal=USR1", job])  # to the job's steps, as a preemption does
        state = wait_done(slurm_cluster, project, job, timeout=180, progress=lambda: hops(project, "preempt"))
        assert state == "COMPLETED", failure_log(project, job)[-3000:]
    finally:
        slurm_cluster.cancel_all()
    chain = hops(project, "preempt")
    assert chain[0]["exit_reason"] == "signal" and chain[-1]["exit_reason"] == "finished"
    assert chain[1]["first_update"] == chain[0]["last_update"]
    assert loss_steps(run) == list(range(1, 201))


def rank_pid(job: str, rank: int) -> int | None:
    """PID of the training process of `rank` in `job` (found through /proc: we run as root, like slurmd)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if b"hpctrain" not in cmdline or b"train" not in cmdline:
            continue
        if f"SLURM_JOB_ID={job}".encode() in environ and f"SLURM_PROCID={rank}".encode() in environ:
            return int(entry.name)
    return None


def test_killed_rank_fails_the_job_and_the_run_continues(slurm_cluster: SlurmCluster, project: Path) -> None:
    args = [
        "--ntasks-per-node=2",
        "--gres=gpu:2",
        "slurm/multi_gpu.sh",
        *DEBUG,
        "run.name=killed",
        "train.threads=1",
        "train.total_updates=200",
        "checkpoint.every=20",
        f"distributed.timeout_seconds={PEER_TIMEOUT}",
    ]
    job = submit(slurm_cluster, project, args, **save_pause(0.5))
    run = project / "logs" / "killed"
    try:
        wait_for(lambda: (run / "checkpoints" / "latest").exists(), "first checkpoint", timeout=300)
        pid = wait_for(lambda: rank_pid(job, 1), "rank 1", timeout=120)
        os.kill(pid, signal.SIGKILL)
        # Rank 0 must not hang: it leaves after distributed.timeout_seconds (plus its exit and accounting, a
        # minute at most on a loaded machine), long before the default 300 s would have let it go.
        state = wait_done(slurm_cluster, project, job, timeout=PEER_TIMEOUT + 60)
        assert state == "FAILED", failure_log(project, job)[-3000:]
    finally:
        slurm_cluster.cancel_all()
    killed_at = (run / "checkpoints" / "latest").read_text().strip()
    again = submit(slurm_cluster, project, args)
    state = wait_done(slurm_cluster, project, again, timeout=180, progress=lambda: hops(project, "killed"))
    assert state == "COMPLETED", failure_log(project, again)[-3000:]
    chain = hops(project, "killed")
    assert chain[0]["exit_reason"] == "failure"
    assert chain[-1]["exit_reason"] == "finished"
    assert str(chain[-1]["first_update"]) in killed_at  # continued from the last good checkpoint


def test_no_progress_cap_stops_the_chain(slurm_cluster: SlurmCluster, project: Path) -> None:
    # Saves never commit (each would sleep 300 s): every hop is killed before completing an update.
    job = submit(
        slurm_cluster,
        project,
        [
            "slurm/single_gpu.sh",
            *DEBUG,
            "run.name=stuck",
            "train.threads=1",
            "checkpoint.every=1",
            "slurm.max_hops_without_progress=2",
        ],
        **save_pause(300),
    )
    try:
        for hop in (1, 2):
            wait_for(lambda hop=hop: len(hops(project, "stuck")) >= hop, f"hop {hop}", timeout=300)
            slurm_cluster.scontrol("requeue", job)  # as a node failure would
        state = wait_done(slurm_cluster, project, job, timeout=300)
        assert state == "FAILED", failure_log(project, job)[-3000:]
    finally:
        slurm_cluster.cancel_all()
    assert "the last 2 hops completed no update" in log_of(project, job)
    assert len(hops(project, "stuck")) == 2
