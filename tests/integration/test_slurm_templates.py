"""The sbatch templates on a real (local) SLURM cluster: DDP layouts, the --export forms, bad input."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import clean_env, save_pause
from tests.integration.slurm_fixtures import SlurmCluster
from tests.integration.slurm_project import (
    failure_log,
    log_of,
    make_project,
    read_json,
    submit,
    wait_done,
    wait_for,
)

pytestmark = pytest.mark.integration

SMALL = ["train.threads=1", "train.total_updates=30", "logging.log_every=10"]
DEBUG = ["--preset", "debug"]  # the CPU debug job's settings instead of the template's own preset: quicker
# The GPU presets ask for CUDA and refuse a CPU-only torch: these nodes have no GPU (tests/train/test_gpu_path.py)
CPU = ["train.device=cpu"]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return make_project(tmp_path / "proj")


def finished(project: Path, name: str, world: int) -> dict:
    summary = read_json(project / "logs" / name / "summary.json", {})
    assert summary.get("status") == "finished", summary
    hops = read_json(project / "logs" / name / "chain.json", [])
    assert [h["world_size"] for h in hops] == [world]
    return summary


def test_single_node_two_task_ddp(slurm_cluster: SlurmCluster, project: Path) -> None:
    job = submit(
        slurm_cluster,
        project,
        ["--ntasks-per-node=2", "--gres=gpu:2", "slurm/multi_gpu.sh", "run.name=ddp", *CPU, *SMALL],
    )
    assert wait_done(slurm_cluster, project, job, timeout=300) == "COMPLETED", failure_log(project, job)
    finished(project, "ddp", world=2)
    log = log_of(project, job)
    assert "rank 0/2 (local 0/2, node 0/1)" in log
    assert "master 127.0.0.1:" in log  # c1 does not resolve: the node's NodeAddr


def test_two_nodes_with_one_and_two_tasks_per_node(slurm_cluster: SlurmCluster, project: Path) -> None:
    jobs = {
        tasks: submit(
            slurm_cluster,
            project,
            [
                f"--ntasks-per-node={tasks}",
                f"--gres=gpu:{tasks}",
                "slurm/multi_node.sh",
                *DEBUG,
                f"run.name=n2t{tasks}",
                *SMALL,
            ],
        )
        for tasks in (1, 2)
    }
    for tasks, job in jobs.items():
        assert wait_done(slurm_cluster, project, job, timeout=300) == "COMPLETED", failure_log(project, job)
        finished(project, f"n2t{tasks}", world=2 * tasks)
        assert f"rank 0/{2 * tasks} (local 0/{tasks}, node 0/2)" in log_of(project, job)


def test_export_forms_both_set_the_learning_rate(slurm_cluster: SlurmCluster, project: Path) -> None:
    common = ["--ntasks-per-node=2", "--gres=gpu:2"]
    jobs = {
        # sbatch's own option, with ALL so that the job keeps the environment.
        "sbatch_option": submit(
            slurm_cluster,
            project,
            [*common, "--export=ALL,LR=2e-5", "slurm/multi_gpu.sh", *DEBUG, "run.name=exp_a", *SMALL],
        ),
        # The seed docs' form: `--export=` after the script goes to the SCRIPT; common.sh exports it.
        "script_argument": submit(
            slurm_cluster,
            project,
            [*common, "slurm/multi_gpu.sh", "--export=LR=2e-5", *DEBUG, "run.name=exp_b", *SMALL],
        ),
    }
    for (form, job), name in zip(jobs.items(), ("exp_a", "exp_b")):
        assert wait_done(slurm_cluster, project, job, timeout=300) == "COMPLETED", (
            form,
            failure_log(project, job),
        )
        cfg = yaml.safe_load((project / "logs" / name / "config.yaml").read_text())
        assert cfg["optim"]["lr"] == pytest.approx(2e-5), form
        finished(project, name, world=2)


def test_bad_config_fails_with_exit_2_before_srun(slurm_cluster: SlurmCluster, project: Path) -> None:
    job = submit(slurm_cluster, project, ["slurm/single_gpu.sh", "optim.lr=-1", "run.name=bad"])
    assert wait_done(slurm_cluster, project, job, timeout=120) == "FAILED"
    log = log_of(project, job)
    assert "optim.lr" in log and "nothing was run" in log
    assert "srun" not in log and not (project / "logs" / "bad").exists()
    info = slurm_cluster.run(["sacct", "-n", "-X", "-P", "-o", "ExitCode", "-j", job]).stdout.split()
    assert info[0] == "2:0"


def test_tasks_inconsistent_with_gpus_fail_before_srun(slurm_cluster: SlurmCluster, project: Path) -> None:
    job = submit(
        slurm_cluster,
        project,
        ["--ntasks-per-node=1", "--gres=gpu:2", "slurm/multi_gpu.sh", "run.name=mismatch"],
    )
    assert wait_done(slurm_cluster, project, job, timeout=120) == "FAILED"
    assert "1 tasks per node with 2 GPUs per node" in log_of(project, job)


def test_torchrun_per_node_survives_a_preemption(slurm_cluster: SlurmCluster, project: Path) -> None:
    # One torchrun per node (2 workers each): torchrun reports the workers' 75 as a failure of its own, so the
    # template reads the run folder's summary; the USR1 goes to the batch shell only (scancel -b), as --signal=B:.
    job = submit(
        slurm_cluster,
        project,
        [
            "--ntasks-per-node=1",
            "--gres=gpu:2",
            "slurm/multi_node.sh",
            *DEBUG,
            "run.name=trun",
            "slurm.launcher=torchrun",
            "train.threads=1",
            "train.total_updates=120",
            "checkpoint.every=20",
            "logging.log_every=1",
        ],
        **save_pause(0.5),
    )
    run = project / "logs" / "trun"
    try:
        wait_for(lambda: (run / "checkpoints" / "latest").exists(), "first checkpoint", timeout=300)
        slurm_cluster.run(["scancel", "--batch", "--signal=USR1", job])
        assert wait_done(slurm_cluster, project, job, timeout=300) == "COMPLETED", failure_log(project, job)[
            -3000:
        ]
    finally:
        slurm_cluster.cancel_all()
    hops = read_json(run / "chain.json", [])
    assert [(h["exit_reason"], h["world_size"]) for h in hops] == [("signal", 4), ("finished", 4)], hops
    assert hops[1]["first_update"] == hops[0]["last_update"]


def test_first_sbatch_after_make_run_starts_its_own_run(slurm_cluster: SlurmCluster, project: Path) -> None:
    # The README's first command, then the sbatch line: it must not continue the CPU debug run.
    made = subprocess.run(
        [sys.executable, "-m", "hpctrain", "train", "train.threads=1"],
        cwd=project,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert made.returncode == 0, made.stderr
    debug = project / "logs" / "debug"
    before = {p.name: p.read_bytes() for p in debug.rglob("*") if p.is_file()}
    job = submit(
        slurm_cluster,
        project,
        [
            "--ntasks-per-node=2",
            "--gres=gpu:2",
            "slurm/multi_gpu.sh",
            "--export=LR=2e-5",
            "train.total_updates=30",
            "train.threads=1",
            *CPU,  # no GPU here; a key that may change between hops, so not part of the run's name
        ],
    )
    assert wait_done(slurm_cluster, project, job, timeout=300) == "COMPLETED", failure_log(project, job)[
        -3000:
    ]
    assert {p.name: p.read_bytes() for p in debug.rglob("*") if p.is_file()} == before  # untouched
    # The template's preset and the exported LR name its own run folder.
    summary = finished(project, "multi_gpu-lr0.00002", world=2)
    assert summary["step"] == 30
    cfg = yaml.safe_load((project / "logs" / "multi_gpu-lr0.00002" / "config.yaml").read_text())
    assert cfg["optim"]["lr"] == pytest.approx(2e-5) and cfg["train"]["precision"] == "bf16"
    assert f"run folder {project / 'logs' / 'multi_gpu-lr0.00002'}" in log_of(project, job)


def test_every_documented_sbatch_line_is_accepted(slurm_cluster: SlurmCluster, project: Path) -> None:
    """The sbatch lines of README.md and docs/*.md, exactly as written, pass the real controller's checks
    (`sbatch --test-only`: script, options, array, dependency). The templates' runs themselves are the tests
    above; `hpctrain submit` lines that queue are checked through their documented `--dry-run` twin."""
    from tests.docs.commands import all_commands

    lines = [c for c in all_commands() if c.on_cluster and "sbatch " in c.text]  # also in a `for` loop
    assert len(lines) >= 6, lines
    held = submit(slurm_cluster, project, ["--hold", "--wrap", "true"])  # a job for `afterany:$LAST_JOB`
    try:
        for line in lines:
            command = line.text.replace("sbatch ", "sbatch --test-only ")
            done = subprocess.run(
                ["bash", "-c", command],
                cwd=project,
                env=clean_env(**slurm_cluster.env, LAST_JOB=held),
                capture_output=True,
                text=True,
                timeout=30,
            )
            assert done.returncode == 0 and "to start at" in done.stderr, f"{line}\n{done.stderr}"
    finally:
        subprocess.run(["scancel", held], env=slurm_cluster.env, timeout=30, check=False)


def test_fields_data_as_an_array_job_and_unknown_exports_refused(
    slurm_cluster: SlurmCluster, project: Path
) -> None:
    """generate_data.sh for the fields workload as a real array job (3 tasks, disjoint shares, meta.json once the
    split is whole), and a job given an --export name nobody reads fails in one line listing the known ones."""
    out = project / "fields"
    args = [
        "--kind",
        "fields",
        "--maps",
        "40",
        "--val-maps",
        "8",
        "--test-maps",
        "0",
        "--shard-size",
        "8",
        "--size",
        "16",
        "--layout",
        "hdf5",
    ]
    array = submit(
        slurm_cluster, project, ["--array=0-2", "slurm/generate_data.sh", *args, "--out", str(out)]
    )
    bad = submit(slurm_cluster, project, ["slurm/single_gpu.sh", "--export=LRR=2e-5", *DEBUG, "run.name=bad"])
    for task in range(3):
        assert wait_done(slurm_cluster, project, f"{array}_{task}", timeout=300) == "COMPLETED"
    assert sorted(p.name for p in (out / "train").glob("shard-*.h5")) == [
        f"shard-{i:05d}.h5" for i in range(5)
    ]
    meta = read_json(out / "train" / "meta.json", {})
    assert meta.get("n") == 40 and sum(shard["n"] for shard in meta["shards"]) == 40, meta
    assert wait_done(slurm_cluster, project, bad, timeout=120) == "FAILED", failure_log(project, bad)
    lines = [x for x in log_of(project, bad).splitlines() if "LRR" in x]
    assert lines and "LR" in lines[0] and "Traceback" not in log_of(project, bad), lines
