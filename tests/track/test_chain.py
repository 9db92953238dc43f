"""chain.json hops and goodput."""

from __future__ import annotations

import json
import logging
import shutil
import time
from pathlib import Path

import pytest

from hpctrain.track.chain import ChainLog, process_start_time, read_chain
from tests.conftest import hpctrain


def test_goodput_per_hop_and_for_the_run(tmp_path: Path) -> None:
    chain = ChainLog(tmp_path)
    chain.open_hop("11", "n1", 0, 1)
    chain.progress(10, 0.01)
    hop = chain.close_hop(20, 0.02, "time_budget")
    assert 0 < hop["goodput"] <= 1
    # A hop that never closed (SIGKILL) is marked failed when the next one opens, with its goodput.
    killed = ChainLog(tmp_path)
    killed.open_hop("12", "n2", 20, 1)
    killed.progress(30, 0.01)
    again = ChainLog(tmp_path)
    again.open_hop("13", "n3", 30, 1)
    again.close_hop(40, 0.01, "finished")
    hops = json.loads((tmp_path / "chain.json").read_text())
    assert [h["exit_reason"] for h in hops] == ["time_budget", "failure", "finished"]
    assert all("goodput" in h for h in hops)
    totals = again.totals()
    assert totals["hops"] == 3 and 0 < totals["run_goodput"] <= 1


def test_process_start_time_is_before_now() -> None:
    start = process_start_time()
    assert time.time() - 3600 < start <= time.time()


def test_first_update_is_recorded_once_per_hop_and_written_at_once(tmp_path: Path) -> None:
    chain = ChainLog(tmp_path)
    chain.first_update_done()  # no hop open (e.g. ranks > 0 or before fit): nothing to record
    assert not (tmp_path / "chain.json").exists()
    chain.open_hop(None, "n1", 0, 1)
    chain.first_update_done()
    written = json.loads((tmp_path / "chain.json").read_text())[0]["startup_seconds"]
    assert 0 <= written < 3600
    chain.first_update_done()  # a later call keeps the first
    assert json.loads((tmp_path / "chain.json").read_text())[0]["startup_seconds"] == written
    hop = chain.close_hop(5, 0.1, "finished")
    assert hop["startup_seconds"] == written
    nxt = ChainLog(tmp_path)
    nxt.open_hop(None, "n1", 5, 1)  # the next hop starts without one until its own first update
    assert "startup_seconds" not in json.loads((tmp_path / "chain.json").read_text())[1]


# ---- a damaged chain.json (issue 29): kept aside, said in one line, rebuilt; never a traceback ----------------

GARBAGE = b"{{{ not json \xff"
WRONG_SHAPE = json.dumps({"hops": [{"start": 1.0}]}).encode()  # valid JSON, not a list of hop records
DAMAGED = {"garbage": GARBAGE, "wrong_shape": WRONG_SHAPE}


def hop(n: int, first: int, last: int) -> dict:
    return {"hop": n, "start": 100.0 + n, "end": 101.0 + n, "first_update": first, "last_update": last}


def test_read_chain_names_what_is_wrong_and_keeps_the_hop_records(tmp_path: Path) -> None:
    path = tmp_path / "chain.json"
    assert read_chain(path).hops == [] and read_chain(path).problem is None  # no file: nothing wrong
    path.write_bytes(GARBAGE)
    assert read_chain(path).hops == [] and "is not JSON" in str(read_chain(path).problem)
    path.write_bytes(WRONG_SHAPE)
    assert read_chain(path).problem == "holds a JSON object, not a list of hop records"
    path.write_text(
        json.dumps([hop(0, 0, 4), 7, {"hop": 2}, {**hop(3, 4, 8), "last_update": "8"}, hop(4, 4, 8)])
    )
    read = read_chain(path)
    assert read.hops == [hop(0, 0, 4), hop(4, 4, 8)]
    assert read.problem is not None and read.problem.startswith("3 of its 5 entries are no hop records")
    assert "entry 1: a JSON number, not an object" in read.problem
    path.write_text(json.dumps([hop(0, 0, 4)]))
    assert read_chain(path).problem is None


def test_a_damaged_chain_is_kept_aside_and_rebuilt_from_the_checkpoints(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "chain.json"
    path.write_text(json.dumps([hop(0, 0, 4), "lost"]))
    chain = ChainLog(tmp_path)
    with caplog.at_level(logging.WARNING):
        aside = chain.keep_aside_if_damaged([(2, 50.0), (4, 60.0), (8, 70.0), (6, 65.0)])
    assert aside is not None and aside.name.startswith("chain.json.bad-")
    assert json.loads(aside.read_text()) == [hop(0, 0, 4), "lost"]  # the damaged file as it was
    hops = json.loads(path.read_text())
    assert hops[0] == hop(0, 0, 4)
    rebuilt = hops[1]
    assert (rebuilt["first_update"], rebuilt["last_update"], rebuilt["start"], rebuilt["end"]) == (
        4,
        8,
        70.0,
        70.0,
    )
    assert rebuilt["exit_reason"] == "unknown" and aside.name in rebuilt["rebuilt"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "\n" not in warnings[0] and aside.name in warnings[0], warnings
    # the file is sound now: nothing more to keep aside, and the next hop follows the rebuilt record
    again = ChainLog(tmp_path)
    assert again.keep_aside_if_damaged([(8, 70.0)]) is None and again.hops == hops
    again.open_hop("9", "n1", 8, 1)
    assert [h["hop"] for h in json.loads(path.read_text())] == [0, 1, 2]


def test_a_damaged_chain_that_cannot_be_moved_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    from hpctrain.errors import UserError

    (tmp_path / "chain.json").write_bytes(GARBAGE)

    def refused(src: object, dst: object) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(os, "replace", refused)
    with pytest.raises(UserError, match=r"is damaged \(is not JSON .*cannot be renamed to chain.json.bad-.*"):
        ChainLog(tmp_path).keep_aside_if_damaged([])
    assert (tmp_path / "chain.json").read_bytes() == GARBAGE


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("chain")
    done = hpctrain("train", "train.total_updates=4", "checkpoint.every=2", "train.eval_every=0", cwd=work)
    assert done.code == 0, done.err
    return work


def copy_run(finished_run: Path, tmp_path: Path, content: bytes) -> Path:
    shutil.copytree(finished_run / "logs", tmp_path / "logs")
    run = tmp_path / "logs" / "debug"
    (run / "chain.json").write_bytes(content)
    return run


@pytest.mark.parametrize("damage", sorted(DAMAGED))
def test_status_on_a_damaged_chain_says_so_in_one_line(
    finished_run: Path, tmp_path: Path, damage: str
) -> None:
    run = copy_run(finished_run, tmp_path, DAMAGED[damage])
    done = hpctrain("status", str(run), cwd=tmp_path)
    assert done.code == 0 and "Traceback" not in done.err, done.err
    said = [line for line in (done.out + done.err).splitlines() if "chain.json" in line]
    assert len(said) == 1 and said[0].startswith("chain.json is damaged ("), done.out + done.err
    assert "updates 4 of 4" in done.out
    assert (run / "chain.json").read_bytes() == DAMAGED[damage]  # status changes nothing
    table = hpctrain("status", str(tmp_path / "logs"), cwd=tmp_path)
    assert table.code == 0 and "Traceback" not in table.err, table.err


@pytest.mark.parametrize("damage", sorted(DAMAGED))
def test_train_keeps_a_damaged_chain_aside_and_continues(
    finished_run: Path, tmp_path: Path, damage: str
) -> None:
    run = copy_run(finished_run, tmp_path, DAMAGED[damage])
    done = hpctrain(
        "train", "train.total_updates=6", "checkpoint.every=2", "train.eval_every=0", cwd=tmp_path
    )
    assert done.code == 0 and "Traceback" not in done.err, done.err
    assert "resumed from" in done.out and "at update 4" in done.out, done.out
    kept = list(run.glob("chain.json.bad-*"))
    assert len(kept) == 1 and kept[0].read_bytes() == DAMAGED[damage]
    said = [line for line in done.err.splitlines() if "chain.json" in line]
    assert len(said) == 1 and "is damaged" in said[0] and kept[0].name in said[0], done.err
    hops = json.loads((run / "chain.json").read_text())
    assert [(h["first_update"], h["last_update"], h["exit_reason"]) for h in hops] == [
        (0, 4, "unknown"),  # hop 0, rebuilt from the checkpoints' sidecars
        (4, 6, "finished"),
    ]
    status = hpctrain("status", str(run), cwd=tmp_path)
    assert status.code == 0 and "chain.json is damaged" not in status.out, status.out
    assert "rebuilt from the checkpoints" in status.out
