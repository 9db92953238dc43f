"""ClusterEnv: who and where this process is, read from torchrun or SLURM through ONE table.

torchrun's variables win over SLURM's (under one torchrun per node, SLURM_PROCID is the node index). SLURM's
per-task variables are used only inside a job step (srun), never in the batch shell, whose SLURM_NTASKS
describes the whole allocation.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

# field -> environment variables, first found wins. "step:" marks variables trusted only inside an srun step.
_TABLE: dict[str, tuple[str, ...]] = {
    "rank": ("RANK", "step:SLURM_PROCID"),
    "local_rank": ("LOCAL_RANK", "step:SLURM_LOCALID"),
    "world_size": ("WORLD_SIZE", "step:SLURM_STEP_NUM_TASKS"),
    "local_world_size": ("LOCAL_WORLD_SIZE", "step:SLURM_STEP_TASKS_PER_NODE"),
    "node_rank": ("GROUP_RANK", "step:SLURM_NODEID"),
    "num_nodes": ("step:SLURM_STEP_NUM_NODES", "SLURM_JOB_NUM_NODES", "SLURM_NNODES"),
    "job_id": ("SLURM_JOB_ID", "TORCHELASTIC_RUN_ID"),
    "array_job_id": ("SLURM_ARRAY_JOB_ID",),
    "array_task_id": ("SLURM_ARRAY_TASK_ID",),
    "restart_count": ("SLURM_RESTART_COUNT",),
    "node_list": ("SLURM_JOB_NODELIST", "SLURM_NODELIST"),
    "master_addr": ("MASTER_ADDR",),
    "master_port": ("MASTER_PORT",),
    "tmpdir": ("SLURM_TMPDIR", "TMPDIR"),
    "submit_dir": ("SLURM_SUBMIT_DIR",),
    "cpus_per_task": ("SLURM_CPUS_PER_TASK",),
    "torchrun": ("TORCHELASTIC_RUN_ID",),
    "job_start": ("SLURM_JOB_START_TIME",),
}
_INTS = {
    "rank",
    "local_rank",
    "world_size",
    "local_world_size",
    "node_rank",
    "num_nodes",
    "restart_count",
    "cpus_per_task",
    "job_start",
}


def _lookup(environ: Mapping[str, str], names: tuple[str, ...]) -> str | None:
    in_step = "SLURM_STEP_ID" in environ or "SLURM_STEPID" in environ
    for name in names:
        step_only = name.startswith("step:")
        name = name.removeprefix("step:")
        if step_only and not in_step:
            continue
        value = environ.get(name)
        if value not in (None, ""):
            # SLURM_STEP_TASKS_PER_NODE looks like "2(x2)" or "2,1": the first count is this layout's.
            return value.split("(")[0].split(",")[0] if name == "SLURM_STEP_TASKS_PER_NODE" else value
    return None


@dataclass(frozen=True)
class ClusterEnv:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    node_rank: int = 0
    num_nodes: int = 1
    job_id: str | None = None
    array_job_id: str | None = None
    array_task_id: str | None = None
    restart_count: int = 0
    node_list: str | None = None
    master_addr: str | None = None
    master_port: str | None = None
    tmpdir: str | None = None
    submit_dir: str | None = None
    cpus_per_task: int | None = None  # SLURM's share of cores per task (runtime/threads.py)
    torchrun: str | None = None  # torchrun's run id: its processes on a node share one allocation
    job_start: int | None = None  # the job's start (Unix time), where the launcher says it

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> ClusterEnv:
        environ = os.environ if environ is None else environ
        values: dict[str, object] = {}
        for field, names in _TABLE.items():
            raw = _lookup(environ, names)
            if raw is None:
                continue
            values[field] = int(raw) if field in _INTS else raw
        env = cls(**values)  # type: ignore[arg-type]
        if not 0 <= env.rank < env.world_size:
            raise ValueError(
                f"rank {env.rank} is outside world size {env.world_size} (check RANK/WORLD_SIZE)"
            )
        return env

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def scheduler_job(self) -> str | None:
        """The job as scontrol and squeue name it: `<array job>_<task>` for an array task, whose own id may be
        the array's (then `scontrol show job ID` answers for every task, and `requeue ID` requeues them all)."""
        if self.array_job_id and self.array_task_id:
            return f"{self.array_job_id}_{self.array_task_id}"
        return self.job_id

    @property
    def under_slurm(self) -> bool:
        return self.job_id is not None and "SLURM_JOB_ID" in os.environ

    def describe(self) -> str:
        where = f"job {self.job_id}" if self.job_id else "no job scheduler"
        return (
            f"rank {self.rank}/{self.world_size} (local {self.local_rank}/{self.local_world_size}, "
            f"node {self.node_rank}/{self.num_nodes}), {where}"
        )
