"""Ending a chain on the real local cluster: `hpctrain cancel RUN` under afterany (the hop saves and stops, the
queued successor is cancelled, status says cancelled, resumable), `hpctrain cancel --job ID` under requeue (no
requeue), and what a plain `scancel` does under afterany (docs/slurm.md: the successor carries on)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import hpctrain, save_pause
from tests.integration.slurm_fixtures import SlurmCluster
from tests.integration.slurm_project import (
    failure_log,
    job_env,
    make_project,
    read_json,
    submit,
    wait_done,
    wait_for,
)

pytestmark = pytest.mark.integration
WORK = ["--preset", "debug", "train.threads=1", "train.total_updates=400", "checkpoint.every=10"]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return make_project(tmp_path / "proj")


def _queued(cluster: SlurmCluster) -> dict[str, tuple[str, str]]:
    """job id -> (state, comment) of every job in the queue."""
    out = cluster.run(["squeue", "-h", "-r", "-o", "%i|%T|%k"]).stdout
    return {line.split("|")[0]: tuple(line.split("|")[1:3]) for line in out.splitlines()}  # type: ignore[misc]


def _start(cluster: SlurmCluster, project: Path, name: str, *extra: str) -> tuple[str, Path]:
    job = submit(
        cluster, project, ["slurm/single_gpu.sh", *WORK, f"run.name={name}", *extra], **save_pause(0.5)
    )
    run = project / "logs" / name
    wait_for(lambda: (run / "checkpoints" / "latest").exists(), "first checkpoint", timeout=300)
    return job, run


def test_cancel_ends_an_afterany_chain_and_the_run_stays_resumable(
    slurm_cluster: SlurmCluster, project: Path
) -> None:
    try:
        job, run = _start(slurm_cluster, project, "ca", "slurm.resubmit=afterany")
        queued = _queued(slurm_cluster)
        successors = [j for j, (_, comment) in queued.items() if j != job and comment.endswith(str(run))]
        assert len(successors) == 1 and queued[job][1] == f"hpctrain:sbatch:{run}", queued
        said = hpctrain("cancel", str(run), cwd=project, env=job_env(slurm_cluster))
        assert said.code == 0, said.err
        assert f"job {job} (running): asked to save and stop" in said.out
        assert f"job {successors[0]} (pending): cancelled" in said.out
        wait_done(slurm_cluster, project, job, timeout=300)
        assert slurm_cluster.wait_sacct(successors[0], "CANCELLED") == "CANCELLED"
    finally:
        slurm_cluster.cancel_all()
    hops = read_json(run / "chain.json")
    assert len(hops) == 1 and hops[0]["exit_reason"] == "signal", failure_log(project, job)[-3000:]
    assert read_json(run / "summary.json")["step"] == hops[0]["last_update"] > 0
    status = hpctrain("status", str(run), cwd=project, env=job_env(slurm_cluster))
    assert status.out.startswith(f"run {run}: cancelled, resumable"), status.out


def test_cancel_by_job_id_ends_a_requeue_chain(slurm_cluster: SlurmCluster, project: Path) -> None:
    try:
        job, run = _start(slurm_cluster, project, "cr")
        said = hpctrain("cancel", "--job", job, cwd=project, env=job_env(slurm_cluster))
        assert said.code == 0 and f"run {run}: cancelled" in said.out, said.err
        wait_done(slurm_cluster, project, job, timeout=300)  # ended, not requeued (a requeue never ends it)
    finally:
        slurm_cluster.cancel_all()
    hops = read_json(run / "chain.json")
    assert len(hops) == 1 and hops[0]["exit_reason"] == "signal", failure_log(project, job)[-3000:]
    assert "the chain ends here" in failure_log(project, job)


def test_a_plain_scancel_under_afterany_lets_the_successor_carry_on(
    slurm_cluster: SlurmCluster, project: Path
) -> None:
    try:
        job, run = _start(slurm_cluster, project, "cs", "slurm.resubmit=afterany")
        slurm_cluster.run(["scancel", job])  # TERM to the job: the hop saves within KillWait and exits 75
        wait_for(lambda: len(read_json(run / "chain.json", [])) >= 2, "a second hop", timeout=300)
    finally:
        slurm_cluster.cancel_all()
    hops = read_json(run / "chain.json")
    assert hops[0]["exit_reason"] == "signal" and hops[1]["first_update"] == hops[0]["last_update"]


def test_cancel_sweep_stops_the_running_element_and_cancels_the_queued_ones(
    slurm_cluster: SlurmCluster, project: Path
) -> None:
    submitted = subprocess.run(
        [sys.executable, "-m", "hpctrain", "submit", "--sweep", "optim.lr=2e-3,3e-3,4e-3", "--max-parallel", "1",
         "train.threads=1", "train.total_updates=400", "checkpoint.every=10"],
        cwd=project, env=job_env(slurm_cluster, **save_pause(0.5)), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr
    array = re.search(r"^job array (\d+)", submitted.stdout, flags=re.M).group(1)  # type: ignore[union-attr]
    first = project / "logs" / "debug-lr0.002"
    try:
        wait_for(lambda: (first / "checkpoints" / "latest").exists(), "first checkpoint", timeout=300)
        said = hpctrain("cancel", str(first), "--sweep", cwd=project, env=job_env(slurm_cluster))
        assert said.code == 0, said.err
        assert f"job {array}_0 (running): asked to save and stop" in said.out
        assert said.out.count("(pending): cancelled") == 2, said.out
        wait_for(lambda: not _queued(slurm_cluster), "an empty queue", timeout=300)
    finally:
        slurm_cluster.cancel_all()
    hops = read_json(first / "chain.json")
    assert len(hops) == 1 and hops[0]["exit_reason"] == "signal", failure_log(project, f"{array}_0")[-3000:]
    assert (
        not (project / "logs" / "debug-lr0.003").exists()
        and not (project / "logs" / "debug-lr0.004").exists()
    )
