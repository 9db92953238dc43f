"""ClusterEnv reads who and where a process is from ONE table: torchrun's variables first, SLURM's per-task
variables only inside a job step (the batch shell's SLURM_NTASKS describes the whole allocation)."""

from __future__ import annotations

import pytest

from hpctrain.runtime.env import ClusterEnv

# What `srun` sets for task 3 of 4 on the second of two nodes (2 tasks per node).
SRUN_STEP = {
    "SLURM_JOB_ID": "77",
    "SLURM_STEP_ID": "0",
    "SLURM_PROCID": "3",
    "SLURM_LOCALID": "1",
    "SLURM_STEP_NUM_TASKS": "4",
    "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
    "SLURM_NODEID": "1",
    "SLURM_STEP_NUM_NODES": "2",
    "SLURM_JOB_NUM_NODES": "2",
    "SLURM_JOB_NODELIST": "n[1-2]",
    "SLURM_RESTART_COUNT": "2",
    "SLURM_TMPDIR": "/scratch/77",
}


def test_nothing_set_is_one_process() -> None:
    env = ClusterEnv.from_environ({})
    assert (env.rank, env.world_size, env.local_rank, env.num_nodes, env.job_id) == (0, 1, 0, 1, None)
    assert env.is_main and not env.distributed
    assert env.describe() == "rank 0/1 (local 0/1, node 0/1), no job scheduler"


def test_srun_step_gives_rank_world_and_node() -> None:
    env = ClusterEnv.from_environ(SRUN_STEP)
    assert (env.rank, env.local_rank, env.world_size, env.local_world_size) == (3, 1, 4, 2)
    assert (env.node_rank, env.num_nodes, env.job_id, env.restart_count) == (1, 2, "77", 2)
    assert (env.node_list, env.tmpdir) == ("n[1-2]", "/scratch/77")
    assert not env.is_main and env.distributed


def test_batch_shell_ignores_per_task_variables() -> None:
    """In the batch script (no step) SLURM_PROCID and SLURM_NTASKS-like values describe the allocation, not
    this process: it is rank 0 of 1 and still knows its job and nodes."""
    shell = {k: v for k, v in SRUN_STEP.items() if k not in ("SLURM_STEP_ID",)}
    env = ClusterEnv.from_environ(shell)
    assert (env.rank, env.world_size, env.local_rank, env.node_rank) == (0, 1, 0, 0)
    assert (env.job_id, env.num_nodes) == ("77", 2)


def test_torchrun_wins_over_slurm() -> None:
    """One torchrun per node inside an srun step: SLURM_PROCID is the node's index, RANK the process's."""
    both = {
        **SRUN_STEP,
        "RANK": "5",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "8",
        "LOCAL_WORLD_SIZE": "4",
        "GROUP_RANK": "1",
    }
    env = ClusterEnv.from_environ(both)
    assert (env.rank, env.local_rank, env.world_size, env.local_world_size, env.node_rank) == (5, 1, 8, 4, 1)


@pytest.mark.parametrize(("tasks", "local"), [("2(x2)", 2), ("3,1", 3), ("4", 4)])
def test_tasks_per_node_forms(tasks: str, local: int) -> None:
    env = ClusterEnv.from_environ({**SRUN_STEP, "SLURM_STEP_TASKS_PER_NODE": tasks, "SLURM_PROCID": "0"})
    assert env.local_world_size == local


def test_empty_variables_count_as_unset() -> None:
    env = ClusterEnv.from_environ({"RANK": "", "WORLD_SIZE": "", "SLURM_JOB_ID": ""})
    assert (env.rank, env.world_size, env.job_id) == (0, 1, None)


def test_rank_outside_the_world_is_refused() -> None:
    with pytest.raises(ValueError, match="rank 4 is outside world size 4"):
        ClusterEnv.from_environ({"RANK": "4", "WORLD_SIZE": "4"})


def test_an_array_task_is_named_by_its_array_and_index() -> None:
    # The task holding the array's own id (77): `scontrol show job 77` answers for every task of the array.
    task = ClusterEnv.from_environ({**SRUN_STEP, "SLURM_ARRAY_JOB_ID": "77", "SLURM_ARRAY_TASK_ID": "3"})
    assert (task.job_id, task.scheduler_job) == ("77", "77_3")
    assert ClusterEnv.from_environ(SRUN_STEP).scheduler_job == "77"
    assert ClusterEnv.from_environ({}).scheduler_job is None
