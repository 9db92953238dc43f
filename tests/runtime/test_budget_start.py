"""budget.time_limit counts from the process start (the job's start where the launcher says it), not from the
trainer's: the interpreter, torch's import and the set-up are on the same wall clock as the training."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil

from hpctrain.config.schema import BudgetConfig
from hpctrain.runtime.budget import TimeBudget, process_start
from hpctrain.runtime.env import ClusterEnv
from hpctrain.runtime.signals import StopSignals
from tests.conftest import clean_env


def test_the_job_start_a_launcher_gives_wins() -> None:
    env = ClusterEnv.from_environ({"SLURM_JOB_START_TIME": "1700000000"})
    assert process_start(env) == (1700000000.0, "the job's start")


def test_a_torchrun_worker_counts_from_its_agent() -> None:
    """Under torchrun the parent is the agent that started the workers (a restart of them included)."""
    started, said = process_start(ClusterEnv.from_environ({"TORCHELASTIC_RUN_ID": "x"}))
    assert said == "torchrun's start" and started == psutil.Process(os.getppid()).create_time()


def test_a_process_counts_from_its_creation() -> None:
    started, said = process_start(ClusterEnv())
    assert said == "the process start" and started == psutil.Process().create_time() < time.time()


def test_an_in_process_budget_counts_from_its_own_start() -> None:
    """A notebook's or a test's run: the process is older than the run."""
    now = [5000.0]
    budget = TimeBudget(BudgetConfig(time_limit="0:10"), ClusterEnv(), StopSignals(), lambda: now[0])
    assert budget.deadline == 5010.0
    assert budget.deadline_source == "budget.time_limit=0:10 from the trainer's start"
    given = TimeBudget(BudgetConfig(time_limit="0:10"), ClusterEnv(), StopSignals(), started=(4990.0, "x"))
    assert given.deadline == 5000.0


def test_hpctrain_train_counts_its_limit_from_the_launch(tmp_path: Path) -> None:
    """What must hold on any machine: the deadline chain.json records is the limit after the process's creation
    (psutil's, to within the second its boot time is rounded to), never after the trainer's start."""
    before = time.time()
    proc = subprocess.Popen(
        [sys.executable, "-m", "hpctrain", "train", "run.name=t", "train.total_updates=3", "budget.time_limit=10:00"],
        cwd=tmp_path, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    launched = time.time()
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err[-2000:]
    deadline = json.loads((tmp_path / "logs" / "t" / "chain.json").read_text())[0]["deadline"]
    assert before - 1.5 <= deadline - 600 <= launched + 0.5
    assert "(budget.time_limit=10:00 from the process start)" in out
