"""`hpctrain submit` (submitit) end to end on the local cluster: submission, a preemption, requeue, finish."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import exit_marks, save_pause
from tests.integration.slurm_fixtures import SlurmCluster
from tests.integration.slurm_project import job_env, loss_steps, make_project, read_json, wait_done, wait_for

pytestmark = pytest.mark.integration


def hpctrain_submit(
    cluster: SlurmCluster, project: Path, *args: str, **env: str
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hpctrain", "submit", *args],
        cwd=project,
        env=job_env(cluster, **env),
        capture_output=True,
        text=True,
        timeout=60,
    )


def submitit_log(project: Path, job: str) -> str:
    folder = project / "logs" / "slurm" / "submitit"
    return "\n".join(p.read_text(errors="replace")[-2000:] for p in sorted(folder.glob(f"{job}_*_log.*")))


def test_submit_dry_run_then_submit_preempt_and_finish(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    project = make_project(tmp_path / "proj")
    args = [
        "run.name=sub",
        "train.threads=1",
        "train.total_updates=200",
        "checkpoint.every=20",
        "logging.log_every=1",
        "slurm.time=00:05:00",
        "slurm.signal_lead_seconds=20",
        "slurm.max_resubmits=3",
    ]
    dry = hpctrain_submit(slurm_cluster, project, "--dry-run", *args)
    assert dry.returncode == 0, dry.stderr
    assert "#SBATCH --signal=USR2@20" in dry.stdout and "#SBATCH --time=5" in dry.stdout
    assert not list((project / "logs" / "slurm").glob("submitit/*.pkl"))  # nothing submitted

    done = hpctrain_submit(slurm_cluster, project, *args, **save_pause(0.5))
    assert done.returncode == 0, done.stderr
    match = re.search(r"job (\d+); run folder (\S+)", done.stdout)
    assert match, done.stdout
    job, run = match.group(1), Path(match.group(2))
    assert run == (project / "logs" / "sub").resolve()
    try:
        wait_for(lambda: (run / "checkpoints" / "latest").exists(), "first checkpoint", timeout=300)
        # submitit's signal (USR2) to every task: the trainer's stop path saves, then submitit requeues.
        slurm_cluster.run(["scancel", "--signal=USR2", job])
        assert wait_done(slurm_cluster, project, job, timeout=300) == "COMPLETED", submitit_log(project, job)
    finally:
        slurm_cluster.cancel_all()
    hops = read_json(run / "chain.json", [])
    assert [h["exit_reason"] for h in hops] == ["signal", "finished"], hops
    assert hops[1]["first_update"] == hops[0]["last_update"]
    assert loss_steps(run) == list(range(1, 201))
    assert "Requeued job" in submitit_log(project, job)


def test_submit_rejects_bad_job_settings_before_queueing(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    project = make_project(tmp_path / "proj")
    done = hpctrain_submit(slurm_cluster, project, "slurm.gpus_per_node=4", "slurm.tasks_per_node=2")
    assert done.returncode == 2 and "2 tasks per node with 4 GPUs per node" in done.stderr
    assert slurm_cluster.active_jobs() == []


def test_a_two_rank_submitit_job_ends_without_finalization(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    """Each rank of a DDP job under submitit ends after submitit recorded its result, every exit handler run, and
    without the interpreter's finalization (where a gloo worker aborted a finished rank: dist.end_process)."""
    project = make_project(tmp_path / "proj")
    marks = tmp_path / "exit.marks"
    args = ["run.name=two", "train.threads=1", "train.total_updates=20", "train.device=cpu"]
    done = hpctrain_submit(
        slurm_cluster, project, *args, "slurm.gpus_per_node=2", "slurm.time=00:05:00", **exit_marks(marks)
    )
    assert done.returncode == 0, done.stderr
    match = re.search(r"job (\d+); run folder (\S+)", done.stdout)
    assert match, done.stdout
    job, run = match.group(1), Path(match.group(2))
    try:
        assert wait_done(slurm_cluster, project, job, timeout=300) == "COMPLETED", submitit_log(project, job)
    finally:
        slurm_cluster.cancel_all()
    assert read_json(run / "summary.json", {}).get("status") == "finished"
    assert [h["world_size"] for h in read_json(run / "chain.json", [])] == [2]
    lines = marks.read_text().splitlines()
    for rank in (0, 1):
        assert f"exit-handlers rank={rank}" in lines and f"finalized rank={rank}" not in lines, lines
    results = list((project / "logs" / "slurm" / "submitit").glob(f"{job}_*_result.pkl"))
    assert len(results) == 2, results  # submitit recorded each rank's result before the rank ended
