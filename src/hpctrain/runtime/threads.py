"""How many CPU threads torch may use in this process: the allocation's cores, less those other work keeps busy.

torch's own default is every core it sees, which on a shared node (a SLURM job's share, or a 2-core machine
that other jobs also use) oversubscribes: `train.threads=0` once gave 0.43 updates/s where 1 gave 2.6. The
cores this process may use come from the scheduler (SLURM_CPUS_PER_TASK, read through ClusterEnv) and the
affinity mask (cgroups and `taskset` narrow it; cpu_count does not see either); torchrun's processes on one node
share them.

Cores are not all free because they are ours: a login node or a shared workstation runs other people's work on
them. OpenMP threads that share a core with a busy process spin waiting for each other (libgomp spins before it
sleeps): the quick muon config took 5x longer with 2 threads beside other work than with 1 (bench/threads.py).
So a single-process CPU run measures, while it starts, how busy its cores are with other processes (`CoreProbe`:
the per-core CPU time of the machine less this process's own), and takes only the free ones. A run keeps that
count in its later hops on the same cores (chain.json's `threads`): another count changes the arithmetic
(reductions split differently), and a resumed run must end with the weights an uninterrupted one has.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from typing import Any

import psutil

from hpctrain.errors import UserError
from hpctrain.runtime.env import ClusterEnv

# Cores of other work tolerated as noise (daemons, a shell): 2 cores with 0.3 busy still take 2 threads.
NOISE_CORES = 0.3
PROBE_SECONDS = 0.25  # the shortest window the probe measures over (start-up usually gives it more)


def usable_cores() -> int:
    """The cores in this process's affinity mask (all of them where the platform has no mask)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows: no affinity call
        return os.cpu_count() or 1


def _cpus() -> set[int] | None:
    try:
        return set(os.sched_getaffinity(0))
    except AttributeError:
        return None


class CoreProbe:
    """How many of this process's cores other processes kept busy since `start` (created): the machine's
    per-core busy time over the window, less this process's own CPU time. Started early (before torch is
    imported), read when the thread count is set: the start-up is the window, and costs nothing extra."""

    def __init__(self) -> None:
        self._begin = self._sample()

    def _sample(self) -> tuple[float, list[Any], float]:
        own = psutil.Process().cpu_times()
        return time.monotonic(), psutil.cpu_times(percpu=True), own.user + own.system

    def busy_elsewhere(self) -> float | None:
        """Cores busy with other work over the window (at least PROBE_SECONDS); None where it cannot tell."""
        start, before, own_before = self._begin
        wait = PROBE_SECONDS - (time.monotonic() - start)
        if wait > 0:
            time.sleep(wait)
        end, after, own_after = self._sample()
        if len(after) != len(before) or end <= start:
            return None
        cpus = _cpus()
        busy = 0.0
        for index, (b, a) in enumerate(zip(before, after)):
            if cpus is not None and index not in cpus:
                continue
            total = sum(a) - sum(b)
            idle = (a.idle - b.idle) + (getattr(a, "iowait", 0.0) - getattr(b, "iowait", 0.0))
            if total > 0:
                busy += max(total - idle, 0.0) / total
        own = (own_after - own_before) / (end - start)
        return max(busy - own, 0.0)


@dataclass(frozen=True)
class Threads:
    """The thread count, why (said at start) and what to record for the run's later hops (chain.json; empty:
    nothing, the count did not depend on the moment)."""

    count: int
    why: str
    record: dict[str, int]


def cpu_threads(configured: int, env: ClusterEnv, cores: int | None = None) -> tuple[int, str]:
    """(threads, where the count comes from). `configured` > 0 wins; 0 takes the allocation: the fewer of
    SLURM_CPUS_PER_TASK and the affinity mask (`cores`), split over the processes torchrun started on this node
    (srun's tasks each have their own share already)."""
    if configured > 0:
        machine = max(os.cpu_count() or 1, cores or 0)
        if configured > machine:  # 100000 ended in "can't start new thread" and a segfault
            raise UserError(
                f"train.threads={configured}: more than the {machine} CPUs of this machine (0 takes the "
                "allocation's cores)"
            )
        return configured, "train.threads"
    cores = usable_cores() if cores is None else cores
    source = f"{cores} cores in the affinity mask"
    if env.cpus_per_task is not None and env.cpus_per_task < cores:
        cores, source = env.cpus_per_task, f"SLURM_CPUS_PER_TASK={env.cpus_per_task}"
    share = env.local_world_size if env.torchrun else 1
    if share > 1:
        source += f" / {share} processes on this node"
    return max(1, cores // share), source


def choose_threads(
    configured: int,
    env: ClusterEnv,
    probe: CoreProbe | None,
    earlier: dict[str, Any] | None = None,
    cores: int | None = None,
) -> Threads:
    """The count for this process. `probe` (None: the allocation alone, e.g. on a GPU or under DDP, where the
    cores are the job's): the free cores of a single CPU process. `earlier`: the last hop's chain.json record;
    its count is kept on the same cores."""
    count, source = cpu_threads(configured, env, cores)
    if configured > 0 or probe is None or count == 1:
        return Threads(count, source, {})
    kept, kept_cores = (earlier or {}).get("threads"), (earlier or {}).get("threads_cores")
    if isinstance(kept, int) and kept_cores == count and 1 <= kept <= count:
        why = (
            f"auto: {source}; {kept} as in this run's earlier hops on the same cores, so that it resumes "
            "with the same arithmetic (train.threads=N sets it)"
        )
        return Threads(kept, why, {"threads": kept, "threads_cores": count})
    others = probe.busy_elsewhere()
    if others is None:
        return Threads(count, f"auto: {source}", {})
    free = max(1, min(count, math.floor(count - others + NOISE_CORES)))
    why = f"auto: {source}, {others:.1f} busy with other work"
    if free < count:  # said once, at start: why fewer than the allocation
        why += "; more threads would wait on each other beside it (train.threads=N sets it)"
    return Threads(free, why, {"threads": free, "threads_cores": count})
