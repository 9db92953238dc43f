"""train.threads=0 takes the allocation's cores, not the machine's (issue 31 item 3), less those other work keeps
busy (issue 44)."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from hpctrain.errors import UserError
from hpctrain.runtime.env import ClusterEnv
from hpctrain.runtime.threads import CoreProbe, Threads, choose_threads, cpu_threads, usable_cores


def test_a_set_count_wins() -> None:
    env = ClusterEnv.from_environ({"SLURM_CPUS_PER_TASK": "8"})
    assert cpu_threads(3, env, cores=64) == (3, "train.threads")


def test_a_set_count_past_the_machines_cpus_is_one_line() -> None:
    # train.threads=100000 ended in "can't start new thread" and a segfault
    machine = os.cpu_count() or 1
    with pytest.raises(
        UserError, match=rf"^train.threads={machine * 4}: more than the {machine} CPUs of this"
    ):
        cpu_threads(machine * 4, ClusterEnv.from_environ({}))


def test_slurm_share_bounds_the_affinity_mask() -> None:
    env = ClusterEnv.from_environ({"SLURM_JOB_ID": "7", "SLURM_CPUS_PER_TASK": "4"})
    assert cpu_threads(0, env, cores=64) == (4, "SLURM_CPUS_PER_TASK=4")
    # a mask narrower than the share (taskset, a cgroup) wins
    assert cpu_threads(0, env, cores=2) == (2, "2 cores in the affinity mask")


def test_torchrun_processes_split_the_node() -> None:
    environ = {"TORCHELASTIC_RUN_ID": "x", "RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "4"}
    threads, source = cpu_threads(0, ClusterEnv.from_environ(environ), cores=16)
    assert threads == 4 and source == "16 cores in the affinity mask / 4 processes on this node"
    # never 0, even with more processes than cores
    assert cpu_threads(0, ClusterEnv.from_environ(environ), cores=2)[0] == 1


def test_without_a_scheduler_the_mask_of_this_process() -> None:
    threads, source = cpu_threads(0, ClusterEnv.from_environ({}))
    assert threads == usable_cores() >= 1 and "affinity mask" in source


class Busy:
    """A probe that says how many cores other work kept busy (the real one is tested below)."""

    def __init__(self, cores: float | None) -> None:
        self.cores = cores
        self.asked = 0

    def busy_elsewhere(self) -> float | None:
        self.asked += 1
        return self.cores


def test_auto_takes_the_cores_other_work_leaves_free() -> None:
    env = ClusterEnv.from_environ({})
    assert choose_threads(0, env, Busy(0.1), cores=2).count == 2  # a daemon's noise: both
    busy = choose_threads(0, env, Busy(1.9), cores=2)
    assert busy.count == 1 and busy.record == {"threads": 1, "threads_cores": 2}
    assert "1.9 busy with other work" in busy.why and "train.threads=N" in busy.why
    assert choose_threads(0, env, Busy(1.0), cores=2).count == 1
    assert choose_threads(0, env, Busy(3.0), cores=16).count == 13
    assert choose_threads(0, env, Busy(40.0), cores=16).count == 1  # never 0
    # a probe that cannot tell, or none (a GPU, DDP): the allocation, nothing recorded
    assert choose_threads(0, env, Busy(None), cores=2) == Threads(2, "auto: 2 cores in the affinity mask", {})
    assert choose_threads(0, env, None, cores=2).count == 2
    assert choose_threads(2, env, Busy(2.0), cores=2).count == 2  # a set count wins, unmeasured


def test_a_run_keeps_its_count_on_the_same_cores() -> None:
    """Another count changes the arithmetic: a resumed hop on the same cores keeps the earlier hop's count,
    however idle the box is now; other cores (another allocation) choose again."""
    env = ClusterEnv.from_environ({})
    probe = Busy(0.0)
    kept = choose_threads(0, env, probe, {"threads": 1, "threads_cores": 2}, cores=2)
    assert kept.count == 1 and probe.asked == 0 and "earlier hops" in kept.why
    assert kept.record == {"threads": 1, "threads_cores": 2}
    assert choose_threads(0, env, probe, {"threads": 1, "threads_cores": 8}, cores=2).count == 2
    assert choose_threads(0, env, probe, {"job_id": "7"}, cores=2).count == 2  # an older record


def test_the_probe_sees_busy_loops_on_this_process_cores() -> None:
    """Two busy loops on this process's cores: the probe counts them (and whatever else runs), never this
    process's own work."""
    cpus = sorted(os.sched_getaffinity(0))[:2]
    loops = [subprocess.Popen(["sh", "-c", "while :; do :; done"]) for _ in cpus]
    try:
        for proc, cpu in zip(loops, cpus):
            os.sched_setaffinity(proc.pid, {cpu})
        time.sleep(0.2)
        probe = CoreProbe()
        busy = probe.busy_elsewhere()
    finally:
        for proc in loops:
            proc.kill()
            proc.wait()
    assert busy is not None and len(cpus) - 0.5 <= busy <= len(os.sched_getaffinity(0)) + 0.01
