"""The hang watchdog with two real gloo ranks (torchrun, CPU), one of them stalled in its update."""

from __future__ import annotations

import json
import time
from pathlib import Path

from tests.conftest import step_fault, torchrun_train

ARGS = [
    "run.name=h",
    "train.threads=1",
    "logging.log_every=1",
    "data.batch_size=16",
    "train.total_updates=200",
    "checkpoint.every=4",
    # 8 s: longer than a checkpoint save on a loaded disk (a rank saving is not a hang); the collective timeout
    # far beyond a loaded machine's torchrun start, build and 10 updates, so that only the watchdog can end the hop
    "distributed.hang_seconds=8",
    "distributed.timeout_seconds=300",
]


def test_a_stalled_rank_is_named_with_every_ranks_stacks_and_the_hop_ends_for_a_restart(
    tmp_path: Path,
) -> None:
    """Rank 1 sleeps in its 10th update; rank 0 waits for it in the next collective. Within seconds of the limit
    (not the 300-s collective timeout) both write their stacks, rank 0 says rank 1 is behind, and the hop ends as a
    resumable stop at its last checkpoint."""
    started = time.monotonic()
    proc = torchrun_train(*ARGS, cwd=tmp_path, env=step_fault(stall_rank=1, stall_at=10))
    _, err = proc.communicate(timeout=420)
    took = time.monotonic() - started
    assert proc.returncode != 0, err[-3000:]  # torchrun's 1 for its workers' 75
    hang = tmp_path / "logs" / "h" / "hang"
    records = {r: json.loads((hang / f"rank{r}.json").read_text()) for r in (0, 1)}
    # rank 0 took its batch and waits in DDP's gradient all-reduce; rank 1 never began its backward
    assert records[0]["progress"][:2] == [9, 1] and records[1]["progress"][:2] == [9, 0]
    assert records[0]["entered"] == records[1]["entered"]
    assert "in step" in records[1]["where"]
    assert "step_faults.py" in (hang / "rank1.txt").read_text()  # its stack: the stalled update
    assert "backward" in (hang / "rank0.txt").read_text()
    lines = [line for line in err.splitlines() if "hang: no progress for 8 s" in line]
    assert len(lines) == 1, err[-3000:]
    assert (
        "rank 1 is behind: rank 0 waits for it in the gradient all-reduce of update 10 (DDP, in backward); rank 1 "
        "is at step_faults.py:" in lines[0]
    )
    summary = json.loads((tmp_path / "logs" / "h" / "summary.json").read_text())
    assert (summary["status"], summary["reason"], summary["step"]) == ("stopped", "hang", 8)
    assert json.loads((tmp_path / "logs" / "h" / "chain.json").read_text())[-1]["exit_reason"] == "hang"
    assert took < 240  # far from the collective timeout (300 s), with a loaded machine's start-up
