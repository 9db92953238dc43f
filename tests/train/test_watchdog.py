"""The hang watchdog in one process (its thread, its report, its verdict); tests/integration/test_hang.py stalls
one of two real gloo ranks."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from hpctrain.config.loading import ConfigRequest, load_config
from hpctrain.config.schema import DistributedConfig
from hpctrain.errors import EXIT_RESUMABLE
from hpctrain.runtime.env import ClusterEnv
from hpctrain.train.watchdog import HangWatchdog, NoWatchdog, build_watchdog, verdict
from hpctrain.workloads.registry import config_model, fill_default_types

FOLDER = Path("/run/hang")


def report(
    rank: int,
    entered: int,
    left: int,
    progress=(9, 0, 0),
    last: str = "CheckVotes vote",
    where: str = "x.py:1 in f",
) -> dict:
    return {
        "rank": rank,
        "entered": entered,
        "left": left,
        "progress": list(progress),
        "last": last,
        "where": where,
    }


def test_the_rank_that_has_not_entered_the_collective_is_behind() -> None:
    reports = [report(0, 12, 11), report(1, 11, 11, where="task.py:88 in train_step"), report(2, 12, 11)]
    assert verdict(reports, 3, 60, FOLDER) == (
        "hang: no progress for 60 s (distributed.hang_seconds); rank 1 is behind: rank 0, 2 wait for it in "
        "collective #12 (CheckVotes vote); rank 1 is at task.py:88 in train_step; every rank's stacks in /run/hang; "
        "the hop ends for a restart from the last checkpoint"
    )


def test_a_rank_that_has_not_begun_its_backward_is_behind_the_one_in_ddps_all_reduce() -> None:
    reports = [report(0, 30, 30, (9, 1, 0)), report(1, 30, 30, (9, 0, 0))]
    assert (
        "; rank 1 is behind: rank 0 waits for it in the gradient all-reduce of update 10 (DDP, in backward);"
        in (verdict(reports, 2, 60, FOLDER))
    )


def test_a_rank_without_a_report_is_named() -> None:
    line = verdict([report(0, 5, 4)], 2, 60, FOLDER)
    assert "; rank 1 wrote no report (dead, frozen or its node gone); " in line


def test_every_rank_inside_one_collective_blames_the_communication() -> None:
    line = verdict([report(0, 7, 6, last="barrier"), report(1, 7, 6, last="barrier")], 2, 30, FOLDER)
    assert (
        "every rank waits in collective #7 (barrier): none is behind, the communication itself hangs" in line
    )


def test_one_process_says_where_its_main_thread_is() -> None:
    line = verdict([report(0, 0, 0, where="loader.py:9 in read")], 1, 30, FOLDER)
    assert "; the main thread is at loader.py:9 in read; " in line


def test_a_stuck_loop_is_reported_and_ends_with_the_requeue_code(tmp_path: Path) -> None:
    """The thread arms at the first progress, then reports after hang_seconds without any: the stacks (this test's
    own main thread, sleeping), the record, the one line, the hop's record, the requeue code."""
    progress = [0]
    said: list[str] = []
    ended: list[int] = []
    dog = HangWatchdog(1.0, ClusterEnv(), tmp_path, lambda: (progress[0], 0), said.append, ended.append)
    dog.start()
    try:
        time.sleep(1.2)
        assert not ended  # not armed yet: start-up is not timed
        progress[0] = 1
        deadline = time.time() + 30
        while not ended and time.time() < deadline:
            time.sleep(0.1)
    finally:
        dog.close()
    assert ended == [EXIT_RESUMABLE] and said == [dog.line]
    assert "hang: no progress for 1 s" in dog.line and "the main thread is at test_watchdog.py:" in dog.line
    record = json.loads((tmp_path / "hang" / "rank0.json").read_text())
    assert record["progress"] == [1, 0] and record["entered"] == record["left"]
    stacks = (tmp_path / "hang" / "rank0.txt").read_text()
    assert "test_a_stuck_loop_is_reported" in stacks and "hpctrain-hang-watchdog" not in stacks.split("\n")[0]


def test_progress_keeps_it_quiet(tmp_path: Path) -> None:
    progress = [0]
    ended: list[int] = []
    # progress every 0.1 s for 5 s under a 2-s limit (a loaded machine may hold this thread for a second)
    dog = HangWatchdog(2.0, ClusterEnv(), tmp_path, lambda: (progress[0], 0), lambda line: None, ended.append)
    dog.start()
    try:
        for _ in range(50):
            progress[0] += 1
            time.sleep(0.1)
    finally:
        dog.close()
    assert not ended and not (tmp_path / "hang" / "rank0.json").exists()


def test_off_by_default_and_refused_at_or_above_the_collective_timeout(tmp_path: Path) -> None:
    assert isinstance(build_watchdog(DistributedConfig(), ClusterEnv(), tmp_path, tuple, print), NoWatchdog)
    with pytest.raises(ValueError, match=r"hang_seconds=300 must be below distributed\.timeout_seconds=300"):
        DistributedConfig(hang_seconds=300)
    with pytest.raises(Exception, match=r"distributed.hang_seconds"):
        load_config(
            ConfigRequest(None, None, ["distributed.hang_seconds=0"], None),
            config_model(),
            prepare=fill_default_types,
        )
