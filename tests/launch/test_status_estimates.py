"""`hpctrain status`: hops left from the job's real time limit (or "unknown"), and the state from evidence."""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import clean_env, hpctrain
from tests.launch.test_submit_status import _bin, _dead_pid, _hop, _run_folder, _status


def _long_hop(deadline: float | None, job: str | None = None) -> dict:
    """A hop of 100 s wall that did 100 updates (1 update per wall second), `deadline` s after its start."""
    now = time.time()
    hop = _hop(0, now - 300, now - 200, 0, 100, "time_budget")
    hop.update(job_id=job, deadline=deadline if deadline is None else now - 300 + deadline)
    return hop


STOPPED = {"status": "stopped", "reason": "time_budget", "step": 100, "total_updates": 1000, "hops": 1}


def test_no_hop_count_without_a_known_time_limit(tmp_path: Path) -> None:
    run = _run_folder(tmp_path, [_long_hop(None)], STOPPED)
    info = _status(tmp_path, run)
    assert info["status"] == "stopped" and info["remaining_hops"] is None and info["hop_seconds"] is None
    assert "more hops: unknown (no job time limit known" in info["text"]
    assert info["remaining_wall_seconds"] == pytest.approx(900, rel=0.01)  # 900 updates at 1 per second


def test_hops_from_the_deadline_then_squeue_then_slurm_time(tmp_path: Path) -> None:
    run = _run_folder(tmp_path / "d", [_long_hop(120.0)], STOPPED)
    info = _status(tmp_path / "d", run)
    # 900 updates left, 1 per wall second, 120 s per hop
    assert info["remaining_hops"] == 8 and info["hop_seconds"] == pytest.approx(120)
    assert "about 8 more hop(s) of 0:02:00 (hop #1's deadline in chain.json)" in info["text"]

    run = _run_folder(tmp_path / "q", [_long_hop(None, job="77")], STOPPED)
    squeue = 'case "$*" in *%l*) echo 5:00;; *) exit 0;; esac'  # time limit 5 min; not in the queue
    info = _status(tmp_path / "q", run, squeue=squeue)
    assert info["remaining_hops"] == 3 and info["hop_seconds_source"] == "squeue time limit of job 77"

    run = _run_folder(tmp_path / "s", [_long_hop(None, job="78")], STOPPED)
    (run / "config.yaml").write_text("train:\n  total_updates: 1000\nslurm:\n  time: '0-00:10'\n")
    info = _status(tmp_path / "s", run)  # squeue knows nothing: slurm.time of a run that ran as jobs
    assert info["remaining_hops"] == 2 and info["hop_seconds_source"] == "slurm.time=0-00:10"


def test_a_running_hop_counts_what_it_still_does(tmp_path: Path) -> None:
    now = time.time()
    hop = _hop(0, now - 100, None, 0, 100, None)
    hop.update(deadline=now + 200, last_seen=now)  # 200 s left in this hop at 1 update/s
    lock = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "job_id": None,
        "started": now,
        "heartbeat": now,
    }
    run = _run_folder(tmp_path, [hop], None, lock)
    (run / "config.yaml").write_text("train:\n  total_updates: 1000\n")
    info = _status(tmp_path, run)
    assert info["status"] == "running"
    assert info["remaining_hops"] == 3  # 900 left: 200 in this hop, then 700 at 300 per hop
    assert "about 3 more hop(s) after the running one" in info["text"]


def test_a_fresh_heartbeat_of_a_dead_process_on_this_host_is_not_running(tmp_path: Path) -> None:
    now = time.time()
    hop = _hop(0, now - 100, None, 0, 40, None)
    lock = {
        "pid": _dead_pid(),
        "host": socket.gethostname(),
        "job_id": None,
        "started": now,
        "heartbeat": now,
    }
    info = _status(tmp_path, _run_folder(tmp_path, [hop], None, lock))
    assert info["status"] == "crashed" and "never closed" in info["evidence"]


def _train(tmp_path: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "hpctrain", "train", "run.name=r", "train.total_updates=1000000", *args],
        cwd=tmp_path,
        env=clean_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_a_real_time_limited_run_counts_hops_of_its_own_length(tmp_path: Path) -> None:
    proc = _train(tmp_path, "budget.time_limit=0:08")
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 75, err
    done = hpctrain("status", "logs/r", "--json", cwd=tmp_path, env=clean_env(PATH=_bin(tmp_path)))
    info = json.loads(done.out)
    assert info["status"] == "stopped" and "resumable" in info["evidence"]
    # the 8 s count from the process start: the hop's share of them after its start-up, this run's length
    (hop,) = json.loads((tmp_path / "logs" / "r" / "chain.json").read_text())
    assert (
        info["hop_seconds"] == pytest.approx(hop["deadline"] - hop["start"]) and 0 < info["hop_seconds"] <= 8
    )
    left = 1_000_000 - info["updates_done"]
    per_hop = info["updates_per_wall_second"] * info["hop_seconds"]  # what one hop of this length does
    assert info["remaining_hops"] == math.ceil(left / per_hop)


def test_a_real_run_stopped_by_ctrl_c_has_no_hop_estimate(tmp_path: Path) -> None:
    proc = _train(tmp_path, "checkpoint.every=20")
    deadline = time.time() + 300
    latest = tmp_path / "logs" / "r" / "checkpoints" / "latest"
    while not latest.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 75, err
    done = hpctrain("status", "logs/r", cwd=tmp_path, env=clean_env(PATH=_bin(tmp_path)))
    assert done.code == 0, done.err
    assert "stopped, resumable" in done.out
    assert "more hops: unknown (no job time limit known" in done.out  # not "877 more hops"
