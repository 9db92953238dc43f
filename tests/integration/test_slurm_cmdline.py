"""sbatch's own command-line options win over the templates' #SBATCH lines, in the in-job check too (issue 13
item 6): the time limit, GPUs, tasks and CPUs come from SLURM; the signal lead, which SLURM shows nowhere, from
slurm.signal_lead_seconds when given, else the script's line, with one warning line either way."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.integration.slurm_fixtures import SlurmCluster
from tests.integration.slurm_project import failure_log, log_of, make_project, read_json, submit, wait_done

pytestmark = pytest.mark.integration

SMALL = ["train.threads=1", "train.total_updates=20", "logging.log_every=10"]


def test_sbatch_command_line_options_beat_the_template(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    project = make_project(tmp_path / "proj")
    override = [
        "-t",
        "00:03:00",  # beats the template's 04:00:00; room for 20 updates in one hop on a loaded machine
        "--signal=B:USR1@15",
        "--gres=gpu:2",
        "--ntasks-per-node=2",
        "--cpus-per-task=2",
    ]
    good = submit(
        slurm_cluster,
        project,
        [
            *override,
            "slurm/single_gpu.sh",
            "slurm.signal_lead_seconds=15",
            "run.name=cli",
            "train.device=cpu",  # the GPU preset asks for CUDA; these nodes have none
            "--export=LR=2e-5",
            *SMALL,
        ],
    )
    # Without slurm.signal_lead_seconds the script's @120 is all there is to check: refused, and said why.
    bad = submit(
        slurm_cluster, project, ["-t", "00:01:00", "--signal=B:USR1@15", "slurm/single_gpu.sh", "run.name=no"]
    )
    assert wait_done(slurm_cluster, project, good, timeout=240) == "COMPLETED", failure_log(project, good)
    log = log_of(project, good)
    assert (
        "warning: SLURM does not show this job's --signal; checking with slurm.signal_lead_seconds=15 (from "
        "command line), which could not be confirmed" in log
    )
    # One warning per hop: a hop cut short on a very loaded machine is requeued (same job, same appended log) and
    # checks its allocation again.
    hops = log.count("] run folder ")
    assert hops >= 1 and log.count("warning: SLURM does not show") == hops, failure_log(project, good)
    assert "rank 0/2" in log  # --gres=gpu:2 --ntasks-per-node=2 beat the template's gpu:1 and one task
    assert "note: taken from the environment or .env: optim.lr=2e-5 (environment LR)" in log
    assert yaml.safe_load((project / "logs" / "cli" / "config.yaml").read_text())["optim"][
        "lr"
    ] == pytest.approx(2e-5)
    assert read_json(project / "logs" / "cli" / "summary.json", {}).get("status") == "finished"
    cpus = slurm_cluster.run(["sacct", "-n", "-X", "-P", "-o", "AllocCPUS", "-j", good]).stdout.split()
    assert cpus[0] == "4"  # 2 tasks x --cpus-per-task=2, not the template's 8

    assert wait_done(slurm_cluster, project, bad, timeout=120) == "FAILED", failure_log(project, bad)
    log = log_of(project, bad)
    assert "checking with the script's #SBATCH --signal line (120 s), which could not be confirmed" in log
    assert "slurm.signal_lead_seconds=120 is not shorter than the wall time (60 s)" in log
    assert not (project / "logs" / "no").exists()
