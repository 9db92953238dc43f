"""The local SLURM cluster behaves like a real one: multi-node steps, GPU gres, requeue, signals, teardown."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import wait_for
from tests.integration.slurm_fixtures import (
    KILL_TASK_FAILED,
    LOCAL_CLUSTER,
    SlurmCluster,
    local_cluster,
    node_keeper,
    start_cluster,
    stop_cluster,
)

pytestmark = pytest.mark.integration


def write_script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(0o755)
    return path


def wait_file(path: Path, pattern: str, timeout: float) -> str:
    """Wait until `path` contains `pattern` (a regex); return the text."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = path.read_text() if path.exists() else ""
        if re.search(pattern, text):
            return text
        time.sleep(0.1)
    raise TimeoutError(f"{path} has no {pattern!r} after {timeout:.0f} s: {text!r}")


def test_two_node_step_completes_and_is_accounted(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    script = write_script(tmp_path / "hosts.sh", "srun bash -c 'echo \"$SLURMD_NODENAME $SLURM_PROCID\"'\n")
    job = slurm_cluster.sbatch(["-N2", "--ntasks-per-node=1", "-o", "out.txt", str(script)], cwd=tmp_path)
    assert slurm_cluster.wait(job, timeout=120) == "COMPLETED"
    lines = sorted((tmp_path / "out.txt").read_text().split("\n"))
    assert [line for line in lines if line] == ["c1 0", "c2 1"]
    assert slurm_cluster.wait_sacct(job, timeout=60) == "COMPLETED"


def test_a_drained_node_is_named_and_returned_to_service(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    """A drained node holds a 2-node job PENDING: the wait's error says why, and a resume lets the job run (what
    the fixture does to a node found out of service at a test's start)."""
    slurm_cluster.scontrol("update", "nodename=c2", "state=drain", "reason=drained by a test")
    try:
        assert slurm_cluster.nodes_out_of_service() == {"c2": "drained (drained by a test)"}
        job = slurm_cluster.sbatch(["-N2", "--wrap", "srun true"], cwd=tmp_path)
        with pytest.raises(TimeoutError, match=r"still PENDING .*c2.*drained by a test"):
            slurm_cluster.wait(job, timeout=5)
    finally:
        found = slurm_cluster.return_nodes_to_service()
    assert found == {"c2": "drained (drained by a test)"}
    assert slurm_cluster.nodes_out_of_service() == {}
    assert slurm_cluster.wait(job, timeout=120) == "COMPLETED"


def test_the_keeper_resumes_a_node_drained_for_a_step_that_would_not_die(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    """SLURM drains a node whose job step outlived SIGKILL ("Kill task failed"; a loaded machine's disk, CI once):
    the session's NodeKeeper resumes it within seconds, as an admin would, so the next 2-node job runs, and notes
    it for the tests' warnings."""
    keeper = node_keeper()
    keeper.take_notes()
    slurm_cluster.scontrol("update", "nodename=c1", "state=drain", f"reason={KILL_TASK_FAILED}")
    job = slurm_cluster.sbatch(["-N2", "--wrap", "srun true"], cwd=tmp_path)
    assert slurm_cluster.wait(job, timeout=120) == "COMPLETED"  # without a resume it would wait forever
    assert slurm_cluster.nodes_out_of_service() == {}
    notes = wait_for(keeper.take_notes, "the keeper's note", timeout=30)
    assert len(notes) == 1 and f"'c1': 'drained ({KILL_TASK_FAILED})'" in notes[0], notes


def test_an_unkillable_step_is_listed(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    """A step whose processes outlive SIGKILL for 60 s drains its node; the program SLURM then runs lists the
    machine's processes (here run by hand, as slurmstepd would, while a step runs), and what a warning quotes of
    it is each step daemon with the processes under it."""
    config = slurm_cluster.scontrol("show", "config")
    assert re.search(r"^UnkillableStepTimeout\s*=\s*60 sec", config, re.M), config
    program = re.search(r"^UnkillableStepProgram\s*=\s*(\S+)", config, re.M)
    assert program, config
    marker = tmp_path / "started"
    job = slurm_cluster.sbatch(
        ["-o", "/dev/null", "--wrap", f"srun bash -c 'touch {marker}; exec sleep 271'"]
    )
    try:
        wait_for(marker.exists, "the step's start", timeout=120)
        env = dict(slurm_cluster.env, SLURM_JOB_ID=job, SLURM_STEP_ID="0", SLURMD_NODENAME="c1")
        subprocess.run([program[1]], env=env, check=True, timeout=30)
    finally:
        slurm_cluster.cancel_all()
    listing = slurm_cluster.unkillable_log()
    assert f"unkillable step {job}.0 on c1" in listing
    assert re.search(rf"^\s*{os.getpid()}\s+\d+ ", listing, re.M), listing[-3000:]  # this process, among all
    steps = slurm_cluster.unkillable_steps().splitlines()
    assert steps[0].endswith(f"unkillable step {job}.0 on c1")
    assert any("sleep 271" in line for line in steps), steps  # the step's task, under its step daemon
    assert all("slurmstepd" in line or "\\_ " in line for line in steps[1:]), steps  # nothing else
    (slurm_cluster.state_dir / "log" / "unkillable.log").unlink()  # no step of this session's was unkillable


def test_gpu_gres_sets_cuda_visible_devices(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    # The templates' default request must fit one node: 4 GPUs, 8 CPUs per task, 16G.
    script = write_script(tmp_path / "gpu.sh", 'echo "CVD=$CUDA_VISIBLE_DEVICES"\n')
    job = slurm_cluster.sbatch(
        ["--gres=gpu:2", "--cpus-per-task=8", "--mem=16G", "-o", "out.txt", str(script)], cwd=tmp_path
    )
    assert slurm_cluster.wait(job, timeout=120) == "COMPLETED"
    assert (tmp_path / "out.txt").read_text().strip() == "CVD=0,1"
    big = slurm_cluster.sbatch(["-N2", "--gres=gpu:4", "--mem=16G", "--wrap", "true"], cwd=tmp_path)
    assert slurm_cluster.wait(big, timeout=120) == "COMPLETED"


def test_requeued_job_runs_again(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    log = tmp_path / "runs.txt"
    script = write_script(
        tmp_path / "rq.sh",
        f'echo "restart=${{SLURM_RESTART_COUNT:-0}}" >> {log}\n'
        '[ "${SLURM_RESTART_COUNT:-0}" = 0 ] && sleep 300\nexit 0\n',
    )
    job = slurm_cluster.sbatch(["--requeue", "-o", "/dev/null", str(script)], cwd=tmp_path)
    try:
        wait_file(log, "restart=0", timeout=120)
        t0 = time.monotonic()
        slurm_cluster.scontrol("requeue", job)
        assert slurm_cluster.wait(job, timeout=120) == "COMPLETED"
        # ~6 s (AuthInfo=cred_expire=5): far below the 121 s a requeued job waits with SLURM's default
        assert time.monotonic() - t0 < 110  # a loaded machine adds its job start; still short of 121 s
        assert log.read_text().split() == ["restart=0", "restart=1"]
        assert slurm_cluster.job_info(job)["Restarts"] == "1"
    finally:
        slurm_cluster.cancel_all()


def test_signal_before_time_limit_reaches_batch_trap(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    marker = tmp_path / "signal.txt"
    script = write_script(
        tmp_path / "sig.sh",
        f"trap 'echo got-USR1 > {marker}; exit 0' USR1\n"
        # bash runs a trap only between commands: short sleeps keep it responsive.
        "for i in $(seq 1000); do sleep 0.2; done\n",
    )
    job = slurm_cluster.sbatch(
        ["--time=1", "--signal=B:USR1@50", "-o", "/dev/null", str(script)], cwd=tmp_path
    )
    try:
        # The controller checks time limits every ~30 s, so the signal comes 0-30 s early; without it the job
        # would end TIMEOUT at its 1-minute limit.
        assert slurm_cluster.wait(job, timeout=180) == "COMPLETED"
        assert marker.read_text().strip() == "got-USR1"
    finally:
        slurm_cluster.cancel_all()


def running(pid: int) -> bool:
    """Alive and not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] not in "ZX"


def daemon_pids(state_dir: Path) -> dict[str, int]:
    return {p.stem: int(p.read_text().split()[0]) for p in (state_dir / "run" / "pids").glob("*.pid")}


def test_second_cluster_side_by_side_then_down(
    slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A second cluster (no accounting: sacct shim) runs next to the session one; down stops all of it."""
    shape = ["--nodes", "1", "--gpus-per-node", "0", "--no-accounting"]
    other = start_cluster(tmp_path_factory.mktemp("slurm2"), *shape)
    pids = daemon_pids(other.state_dir)
    try:
        assert set(pids) == {"munged", "slurmctld", "slurmd-c1"}
        conf_a = Path(slurm_cluster.env["SLURM_CONF"]).read_text()
        conf_b = Path(other.env["SLURM_CONF"]).read_text()

        for key in ("ClusterName", "SlurmctldPort", "StateSaveLocation"):
            pattern = rf"^{key}=(\S+)"
            assert re.findall(pattern, conf_a, re.M) != re.findall(pattern, conf_b, re.M)
        # The daemons' ports stay out of the jobs' MASTER_PORT range (12000-31999) and the ephemeral one.
        ports = [int(p) for conf in (conf_a, conf_b) for p in re.findall(r"Port=(\d+)", conf)]
        assert ports and all(port < 12000 for port in ports), ports
        job = other.sbatch(["--wrap", "true"], cwd=other.state_dir)
        assert other.wait(job, timeout=120) == "COMPLETED"
        assert other.sacct_state(job) == "COMPLETED"  # the shim, answering from squeue
    finally:
        stop_cluster(other)
    alive = [name for name, pid in pids.items() if running(pid)]
    assert alive == [], f"still running after down: {alive}"
    status = local_cluster("status", "--state-dir", str(other.state_dir), check_rc=False)
    assert status.returncode != 0
    # The session cluster is untouched.
    assert slurm_cluster.run(["sinfo", "-h", "-N", "-o", "%N"]).stdout.split() == ["c1", "c2"]


def test_down_ends_every_process_of_its_jobs_even_deaf_ones(
    slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A job whose batch shell, srun and task ignore TERM, one process of it escaped from the job's tree, and a
    controller that crashed (nothing cancels the job, its step daemons outlive slurmd): `down` still ends all of
    them (TERM, then KILL after a grace), and nothing of the session cluster."""
    other = start_cluster(
        tmp_path_factory.mktemp("slurm3"), "--nodes", "1", "--gpus-per-node", "0", "--no-accounting"
    )
    work = other.state_dir / "work"
    work.mkdir()
    pids = work / "pids.txt"
    write_script(
        work / "task.sh",
        f"trap '' TERM\necho \"task $$ $PPID\" >> {pids}\n"
        f'( setsid bash -c \'trap "" TERM; echo "escaped $$" >> {pids}; exec sleep 300\' & )\nsleep 300\n',
    )
    script = write_script(
        work / "deaf.sh",
        f"trap '' TERM\necho \"batch $$ $PPID\" >> {pids}\nsrun {work / 'task.sh'} &\n"
        f'echo "srun $!" >> {pids}\nwait\nsleep 300\n',
    )
    try:
        other.sbatch(["-o", "/dev/null", str(script)], cwd=work)
        text = wait_file(pids, r"escaped \d+", timeout=60)
    except BaseException:
        stop_cluster(other)
        raise
    seen = {
        int(n) for line in text.splitlines() for n in line.split()[1:]
    }  # the step daemons are the parents
    assert len(seen) == 6 and all(running(pid) for pid in seen), text
    os.kill(daemon_pids(other.state_dir)["slurmctld"], signal.SIGKILL)  # the controller crashes
    local_cluster("down", "--state-dir", str(other.state_dir), timeout=120)
    assert [pid for pid in seen if running(pid)] == [], text
    assert slurm_cluster.run(["sinfo", "-h", "-N", "-o", "%N"]).stdout.split() == ["c1", "c2"]


def test_install_is_a_quick_noop_when_installed(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    # `make test` runs it every time; the session fixture has installed everything already: it looks for the
    # packages' files and runs nothing (no apt-get, no dpkg: stand-ins first on PATH record any call).
    calls = tmp_path / "calls.txt"
    for tool in ("apt-get", "apt", "dpkg", "dpkg-query"):
        write_script(tmp_path / tool, f'echo "{tool} $*" >> {calls}\nexit 1\n')
    res = subprocess.run(
        [sys.executable, str(LOCAL_CLUSTER), "install"],
        env={**os.environ, "PATH": f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    assert not calls.exists(), calls.read_text()


@pytest.mark.parametrize("name", ["with space", "with#hash"])
def test_a_state_dir_slurm_conf_cannot_hold_is_refused_in_one_line(tmp_path: Path, name: str) -> None:
    """slurm.conf's paths are unquoted words: such a folder made slurmctld print a parse error per path, then die."""
    state = tmp_path / name
    res = local_cluster("up", "--state-dir", str(state), "--nodes", "1", "--no-accounting", check_rc=False)
    assert res.returncode == 1
    assert res.stderr.strip().splitlines() == [
        f"local-cluster: error: --state-dir '{state}' holds a space or '#', which slurm.conf cannot take"
    ]
    assert not state.exists()  # nothing made, nothing started
