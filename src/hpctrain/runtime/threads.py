"""How many CPU threads torch may use in this process: the allocation's cores, not the machine's.

torch's own default is every core it sees, which on a shared node (a SLURM job's share, or a 2-core machine
that other jobs also use) oversubscribes: `train.threads=0` once gave 0.43 updates/s where 1 gave 2.6. The
cores this process may use come from the scheduler (SLURM_CPUS_PER_TASK, read through ClusterEnv) and the
affinity mask (cgroups and `taskset` narrow it; cpu_count does not see either); torchrun's processes on one node
share them.
"""

from __future__ import annotations

import os

from hpctrain.runtime.env import ClusterEnv


def usable_cores() -> int:
    """The cores in this process's affinity mask (all of them where the platform has no mask)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows: no affinity call
        return os.cpu_count() or 1


def cpu_threads(configured: int, env: ClusterEnv, cores: int | None = None) -> tuple[int, str]:
    """(threads, where the count comes from). `configured` > 0 wins; 0 takes the allocation: the fewer of
    SLURM_CPUS_PER_TASK and the affinity mask (`cores`), split over the processes torchrun started on this node
    (srun's tasks each have their own share already)."""
    if configured > 0:
        return configured, "train.threads"
    cores = usable_cores() if cores is None else cores
    source = f"{cores} cores in the affinity mask"
    if env.cpus_per_task is not None and env.cpus_per_task < cores:
        cores, source = env.cpus_per_task, f"SLURM_CPUS_PER_TASK={env.cpus_per_task}"
    share = env.local_world_size if env.torchrun else 1
    if share > 1:
        source += f" / {share} processes on this node"
    return max(1, cores // share), source
