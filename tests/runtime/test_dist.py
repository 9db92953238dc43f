"""Joining the process group: a rendezvous that fails is one line naming the rank and the address."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from hpctrain.errors import EXIT_RESUMABLE
from tests.conftest import clean_env, free_port, hpctrain


def test_a_rendezvous_port_held_on_the_node_is_one_line_naming_it(tmp_path: Path) -> None:
    with socket.socket() as holder:  # another process on the node listens on the job's port
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        env = clean_env(
            RANK="0", WORLD_SIZE="2", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
        )
        done = hpctrain("train", "run.name=d", "train.total_updates=2", cwd=tmp_path, env=env, timeout=120)
    lines = [ln for ln in done.err.splitlines() if ln.strip()]
    assert done.code == 1, done.err
    assert lines[-1].startswith(f"error: rank 0 cannot listen on the rendezvous port 127.0.0.1:{port}:"), (
        lines
    )
    assert "MASTER_PORT" in lines[-1] and "EADDRINUSE" in lines[-1]
    assert "Traceback" not in done.err


def _rank(job: str, rank: int, port: int, cwd: Path, *args: str) -> tuple[subprocess.Popen, Path, Path]:
    """One rank of a 2-rank job `job` (its id as torchrun gives it) on 127.0.0.1:port; output into files."""
    env = clean_env(
        RANK=str(rank),
        WORLD_SIZE="2",
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE="2",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        TORCHELASTIC_RUN_ID=job,
    )
    out, err = cwd / f"{job}{rank}.out", cwd / f"{job}{rank}.err"
    with out.open("w") as o, err.open("w") as e:
        proc = subprocess.Popen(
            [sys.executable, "-m", "hpctrain", "train", f"run.name={job}", *args],
            cwd=cwd,
            env=env,
            stdout=o,
            stderr=e,
            text=True,
        )
    return proc, out, err


def _updates(out: Path) -> int:
    done = re.findall(r"^update (\d+)/", out.read_text(), re.M)
    return int(done[-1]) if done else 0


def test_a_second_job_on_the_same_port_fails_alone_and_the_first_trains_on(tmp_path: Path) -> None:
    """Two jobs on one node meet at one MASTER_PORT (job ids 20000 apart; CI's two test clusters, both
    numbering jobs from 1): the second's rank 0 cannot listen, its rank 1 reaches the first job's store. The
    second fails, one line per rank; the first, innocent, trains on undisturbed and stops cleanly."""
    port = free_port()
    first = [
        _rank("jobA", r, port, tmp_path, "train.total_updates=1000000", "logging.log_every=5") for r in (0, 1)
    ]
    deadline = time.monotonic() + 120
    while _updates(first[0][1]) < 10:
        assert time.monotonic() < deadline and all(p.poll() is None for p, _, _ in first), first[0][
            2
        ].read_text()
        time.sleep(0.2)
    second = [_rank("jobB", r, port, tmp_path, "distributed.timeout_seconds=10") for r in (0, 1)]
    for proc, _, _ in second:
        proc.wait(timeout=120)
    errs = [err.read_text() for _, _, err in second]
    assert [proc.returncode for proc, _, _ in second] == [1, 1], errs
    last = [[ln for ln in err.splitlines() if ln.strip()][-1] for err in errs]
    assert last[0].startswith(f"error: rank 0 cannot listen on the rendezvous port 127.0.0.1:{port}:"), errs[
        0
    ]
    assert last[1].startswith(f"error: rank 1/2 could not join the process group at 127.0.0.1:{port}:"), errs[
        1
    ]
    assert not any("Traceback" in err for err in errs), errs
    # The first job: still training, on both ranks, past where it was when the second came and went.
    reached = _updates(first[0][1])
    while _updates(first[0][1]) < reached + 10:
        assert time.monotonic() < deadline + 120 and all(p.poll() is None for p, _, _ in first), [
            err.read_text()[-3000:] for _, _, err in first
        ]
        time.sleep(0.2)
    for proc, _, _ in first:
        proc.send_signal(signal.SIGUSR1)
    for proc, _, _ in first:
        proc.wait(timeout=120)
    first_errs = [err.read_text() for _, _, err in first]
    assert [proc.returncode for proc, _, _ in first] == [EXIT_RESUMABLE, EXIT_RESUMABLE], first_errs
    assert not any("Traceback" in err or "error" in err.lower() for err in first_errs), first_errs
    stopped = [ln for ln in first[0][1].read_text().splitlines() if "stopped" in ln]
    assert stopped, first[0][1].read_text()[-3000:]
