"""train.threads=0 takes the allocation's cores, not the machine's (issue 31 item 3)."""

from __future__ import annotations

from hpctrain.runtime.env import ClusterEnv
from hpctrain.runtime.threads import cpu_threads, usable_cores


def test_a_set_count_wins() -> None:
    env = ClusterEnv.from_environ({"SLURM_CPUS_PER_TASK": "8"})
    assert cpu_threads(3, env, cores=64) == (3, "train.threads")


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
