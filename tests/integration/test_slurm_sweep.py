"""`hpctrain submit --sweep` on the local cluster: one job array, one run folder per element, each element
interrupted (requeued by the controller, or stopped by the walltime warning) and continued in its own folder
by its own array task, ending exactly where its uninterrupted run ends."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import clean_env, save_pause
from tests.integration.slurm_fixtures import SlurmCluster
from tests.integration.slurm_project import job_env, loss_steps, make_project, read_json, wait_for

pytestmark = pytest.mark.integration

# The default regression job, short: 6 saves of 1 s each (save_pause) make an element last long enough to be
# interrupted after its first checkpoint whatever the machine's speed.
WORK = ["train.threads=1", "train.total_updates=60", "checkpoint.every=10", "logging.log_every=1"]
SWEEP = ["--sweep", "optim.lr=2e-3,3e-3", "--sweep", "model.hidden=[16],[32]"]
ELEMENTS = [
    ("debug-lr0.002-hidden16", ["optim.lr=2e-3", "model.hidden=[16]"]),
    ("debug-lr0.002-hidden32", ["optim.lr=2e-3", "model.hidden=[32]"]),
    ("debug-lr0.003-hidden16", ["optim.lr=3e-3", "model.hidden=[16]"]),
    ("debug-lr0.003-hidden32", ["optim.lr=3e-3", "model.hidden=[32]"]),
]
DONE = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")


def task_states(cluster: SlurmCluster, array: str) -> dict[str, str]:
    """Array task index -> its state in accounting (the tasks that started so far)."""
    res = cluster.run(["sacct", "-n", "-X", "-P", "-o", "JobID,State", "-j", array], check=False)
    states = {}
    for line in res.stdout.splitlines():
        job, _, state = line.partition("|")
        if re.fullmatch(rf"{array}_\d+", job):
            states[job.split("_")[1]] = state.split()[0] if state else ""
    return states


def array_log(project: Path, array: str, index: int) -> str:
    logs = list((project / "logs" / "slurm").glob(f"*-{array}_{index}.out"))
    return logs[0].read_text(errors="replace") if logs else "(no log)"


def submit_array(cluster: SlurmCluster, project: Path, args: list[str], tasks: int) -> str:
    """`hpctrain submit ARGS` on the cluster; the job array's id, checked to span `tasks` tasks."""
    submitted = subprocess.run(
        [sys.executable, "-m", "hpctrain", "submit", *args],
        cwd=project,
        env=job_env(cluster, **save_pause(1.0)),  # sbatch's --export=ALL hands it to every task
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert submitted.returncode == 0, submitted.stderr
    match = re.search(rf"^job array (\d+) \(tasks 0-{tasks - 1}\)", submitted.stdout, flags=re.M)
    assert match, submitted.stdout
    return match.group(1)


def test_sweep_elements_are_interrupted_continue_their_own_folders_and_match_uninterrupted_runs(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    project = make_project(tmp_path / "proj")
    array = submit_array(slurm_cluster, project, [*SWEEP, "--max-parallel", "4", *WORK], tasks=4)
    runs = [project / "logs" / name for name, _ in ELEMENTS]
    # Each element's own uninterrupted run, meanwhile, outside SLURM (run.out_dir does not enter the name).
    refs = [
        subprocess.Popen(
            [sys.executable, "-m", "hpctrain", "train", *WORK, *overrides, "run.out_dir=ref"],
            cwd=project,
            env=clean_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _, overrides in ELEMENTS
    ]
    try:
        pending = set(range(4))
        deadline = time.monotonic() + 300
        while pending and time.monotonic() < deadline:  # interrupt each element once, after its first save
            for index in sorted(pending):
                if (runs[index] / "checkpoints" / "latest").exists():
                    task = f"{array}_{index}"
                    if index % 2 == 0:  # as a node failure or a preemption by the controller
                        slurm_cluster.scontrol("requeue", task)
                    else:  # as the walltime warning (or a preemption's signal) to the steps
                        slurm_cluster.run(["scancel", "--signal=USR1", task])
                    pending.discard(index)
            time.sleep(0.2)
        assert not pending, f"elements {sorted(pending)} never saved a checkpoint"
        wait_for(
            lambda: (
                len(states := task_states(slurm_cluster, array)) == 4
                and all(s in DONE for s in states.values())
            ),
            "end of every task",
            timeout=300,
        )
        states = task_states(slurm_cluster, array)
        assert states == dict.fromkeys("0123", "COMPLETED"), {
            i: (s, array_log(project, array, int(i))[-3000:]) for i, s in states.items() if s != "COMPLETED"
        }
        for ref in refs:
            assert ref.wait(timeout=300) == 0, ref.stderr.read() if ref.stderr else ""
    finally:
        for ref in refs:
            ref.kill()
        slurm_cluster.cancel_all()
    for index, ((name, _), run) in enumerate(zip(ELEMENTS, runs)):
        hops = read_json(run / "chain.json", [])
        log = array_log(project, array, index)
        assert len(hops) >= 2, (name, hops, log[-3000:])  # interrupted, then continued
        assert hops[-1]["exit_reason"] == "finished"
        assert {h["job_id"] for h in hops} == {
            f"{array}_{index}"
        }  # its own array task, requeued (squeue's name)
        for before, after in zip(hops, hops[1:]):
            assert after["first_update"] == before["last_update"]  # nothing lost, nothing repeated
        assert loss_steps(run) == list(range(1, 61))
        assert f"sweep element {index} of " in log, log[-3000:]
        if (
            index % 2
        ):  # stopped by the signal, it requeued its own task (never the whole array, as `requeue 1` did)
            assert f"requeueing job {array}_{index}" in log and "requeue failed" not in log, log[-3000:]
        else:
            assert "DUE TO JOB REQUEUE" in log
        ref = project / "ref" / name
        assert (
            read_json(run / "summary.json")["params_sha256"]
            == read_json(ref / "summary.json")["params_sha256"]
        ), name
        status = subprocess.run(
            [sys.executable, "-m", "hpctrain", "status", str(run)], capture_output=True, text=True, timeout=60
        )
        assert status.returncode == 0 and f"job {array}_{index} on " in status.stdout, (
            status.stdout + status.stderr
        )
    digests = {read_json(run / "summary.json")["params_sha256"] for run in runs}
    assert len(digests) == 4  # four different trainings


def test_an_afterany_element_continues_its_own_folder_in_a_successor_job(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    project = make_project(tmp_path / "proj")
    array = submit_array(
        slurm_cluster, project, ["--sweep", "run.seed=1,2", "slurm.resubmit=afterany", *WORK], tasks=2
    )
    runs = [project / "logs" / "debug-seed1", project / "logs" / "debug-seed2"]
    try:
        wait_for(
            lambda: (runs[0] / "checkpoints" / "latest").exists(), "element 0's first checkpoint", timeout=300
        )
        slurm_cluster.run(["scancel", "--signal=USR1", f"{array}_0"])
        wait_for(
            lambda: (
                all(read_json(r / "summary.json", {}).get("status") == "finished" for r in runs)
                and not slurm_cluster.active_jobs()
            ),
            "both elements finished and no job left",
            timeout=300,
        )
    finally:
        slurm_cluster.cancel_all()
    hops = read_json(runs[0] / "chain.json", [])
    assert [h["exit_reason"] for h in hops] == ["signal", "finished"], hops
    assert hops[1]["first_update"] == hops[0]["last_update"] and hops[0]["job_id"] != hops[1]["job_id"]
    assert loss_steps(runs[0]) == list(range(1, 61))
    log = array_log(project, array, 0)  # the successor appended to the element's own log
    assert f"successor job {hops[1]['job_id']} queued (afterany:{array}_0)" in log, log[-3000:]
    assert "resumed from logs/debug-seed1/checkpoints/" in log
    assert [h["exit_reason"] for h in read_json(runs[1] / "chain.json", [])] == ["finished"]
