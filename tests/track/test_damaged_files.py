"""Damaged small files of a run folder are read as what they are, by every verb that reads them (U3, U5, U7):
metrics.jsonl lines that are JSON but no record, chain.json / summary.json / run.lock holding NaN, 1e300 or
the wrong kinds, a malformed wandb.json (one whose `dir` is `/`), a config.yaml alias bomb, a stale run.lock
whose pid now belongs to another process. Never a traceback, never a search outside the run folder."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpctrain.commands.status import collect, render
from hpctrain.track.chain import read_chain, read_json, read_summary
from hpctrain.track.metrics_file import MetricsFile, read_metrics
from hpctrain.track.run_state import lock_holder
from hpctrain.track.runs import read_config, tail_records
from hpctrain.track.sync import find_offline_runs
from hpctrain.train.runlock import LockRecord, RunLock
from tests.conftest import hpctrain

# Values that parse as JSON but are no record of their file.
NOT_OBJECTS = ["[1, 2]", "42", '"text"', "null", "true", "NaN", "1e300"]
BOMB = "a: &a [x,x,x,x,x,x,x,x,x]\n" + "".join(
    f"{c}: &{c} [{', '.join([f'*{p}'] * 9)}]\n" for p, c in zip("abcdef", "bcdefg")
)


def finished_run(folder: Path) -> Path:
    """A small finished run folder, as the trainer leaves it (written directly: no training needed)."""
    folder.mkdir(parents=True)
    now = time.time()
    hop = {"hop": 0, "job_id": None, "nodes": "n1", "world_size": 1, "deadline": None, "start": now - 60,
           "end": now - 10, "first_update": 0, "last_update": 20, "exit_reason": "finished",
           "train_seconds": 40.0, "goodput": 0.8}  # fmt: skip
    (folder / "chain.json").write_text(json.dumps([hop]))
    summary = {"status": "finished", "reason": "finished", "step": 20, "total_updates": 20, "hops": 1}
    (folder / "summary.json").write_text(json.dumps(summary))
    (folder / "config.yaml").write_text("train:\n  total_updates: 20\ncheckpoint:\n  best_metric: val_loss\n")
    records = [{"step": s, "loss": 1.0 / s, "time": now - 60 + s} for s in range(1, 21)]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return folder


@pytest.mark.parametrize("line", [*NOT_OBJECTS, '{"step": "5"}', '{"step": 1e300}', '{"step": true}'])
def test_a_metrics_line_that_is_no_record_is_dropped_as_a_torn_one(tmp_path: Path, line: str) -> None:
    run = finished_run(tmp_path / "r")
    path = run / "metrics.jsonl"
    path.write_text(path.read_text() + line + "\n")
    assert len(read_metrics(path)) == 20  # report
    assert len(tail_records(path).records) == 20  # status
    MetricsFile(
        path, resume_step=10
    ).close()  # train, resuming: the records after update 10 go, and that line
    assert [r["step"] for r in read_metrics(path)] == list(range(1, 11))
    assert line not in path.read_text().splitlines()


@pytest.mark.parametrize(
    "hop",
    [
        '{"start": NaN, "end": 1e300}',
        '{"start": 1.0, "end": 1e300, "last_update": 5}',
        '{"start": 1.0, "end": Infinity}',
        '{"start": 1.0, "last_update": 1e300}',
        '{"start": 1.0, "last_update": 100000000000000000000000000000000000000}',
        '{"start": -5.0}',
        "[1, 2]",
    ],
)
def test_chain_json_numbers_out_of_bounds_are_no_hop_records(tmp_path: Path, hop: str) -> None:
    run = finished_run(tmp_path / "r")
    (run / "chain.json").write_text(f"[{hop}]")
    chain = read_chain(run / "chain.json")
    assert chain.hops == [] and chain.problem and "entry 0" in chain.problem
    text = render(collect(run))  # status: the page, saying the file is damaged; no exception
    assert "chain.json is damaged" in text


def test_summary_with_values_of_the_wrong_kind_is_read_without_them(tmp_path: Path) -> None:
    run = finished_run(tmp_path / "r")
    (run / "summary.json").write_text(
        '{"status": ["x"], "step": NaN, "total_updates": 1e300, "hops": "1", "best": Infinity, "goodput": 0.5}'
    )
    assert read_summary(run) == {"goodput": 0.5}
    render(collect(run))
    for text in NOT_OBJECTS:
        (run / "summary.json").write_text(text)
        assert read_summary(run) == {} and read_json(run / "summary.json", {}) == {}
        render(collect(run))


@pytest.mark.parametrize(
    "record",
    [
        {"pid": 10**30, "started": 1.0, "heartbeat": 1.0},
        {"pid": 1, "started": float("nan"), "heartbeat": 1e300},
        {"pid": "1", "started": 1.0, "heartbeat": 1.0},
    ],
)
def test_a_damaged_lock_record_is_no_holder(tmp_path: Path, record: dict) -> None:
    run = finished_run(tmp_path / "r")
    (run / "run.lock").write_text(json.dumps({**record, "host": socket.gethostname(), "job_id": None}))
    assert LockRecord.read(run / "run.lock") is None
    assert lock_holder(run, time.time()) is None
    assert collect(run)["status"] == "finished"


def test_a_malformed_wandb_json_finds_the_runs_inside_the_folder_only(tmp_path: Path) -> None:
    """A `dir` of `/` (or of any folder above the run) is one listing of that folder's wandb/, never a search of
    everything under it: an offline run of our id deeper down is not found."""
    run = finished_run(tmp_path / "r")
    mine = run / "wandb" / "offline-run-20240101_000000-abc123"
    mine.mkdir(parents=True)
    decoy = tmp_path / "other" / "deep" / "wandb" / "offline-run-20240102_000000-abc123"
    decoy.mkdir(parents=True)
    for record in (
        {"hops": [{"dir": "/", "run_id": "abc123"}, {"dir": str(tmp_path), "run_id": "abc123"}]},
        {"hops": 5},
        {"hops": [1, {"dir": 5}, {"run_id": []}, {"dir": "/", "run_id": "../../x"}]},
        [1, 2],
        "NaN",
    ):
        (run / "wandb.json").write_text(json.dumps(record) if not isinstance(record, str) else record)
        found = [r.folder for r in find_offline_runs(run)]
        assert found == [mine.resolve()], record


def test_sync_and_status_on_damaged_files_are_lines_not_tracebacks(tmp_path: Path) -> None:
    run = finished_run(tmp_path / "r")
    (run / "wandb.json").write_text('{"hops": [{"dir": 5}]}')
    (run / "wandb_sync.json").write_text('{"synced": []}')
    (run / "metrics.jsonl").write_text("[1, 2]\n")
    (run / "chain.json").write_text('[{"start": NaN}]')
    for args in (["sync", str(run), "--dry-run"], ["status", str(run)], ["status", str(tmp_path)]):
        done = hpctrain(*args, cwd=tmp_path)
        assert done.code == 0 and "Traceback" not in done.err, (args, done.err)


def test_a_config_alias_bomb_in_a_run_folder_is_read_as_no_config(tmp_path: Path) -> None:
    """U5: status and report --compare read config.yaml with the loader's bounds (300 bytes made a 71 MB page)."""
    run = finished_run(tmp_path / "r")
    (run / "config.yaml").write_text(BOMB)
    assert len(BOMB) < 400
    assert read_config(run) == {}
    done = hpctrain("status", str(run), "--json", cwd=tmp_path)
    assert done.code == 0 and len(done.out) < 20_000, len(done.out)
    finished_run(tmp_path / "s")
    out = tmp_path / "cmp"
    done = hpctrain("report", "--compare", str(run), str(tmp_path / "s"), "--out", str(out), cwd=tmp_path)
    assert done.code == 0, done.err
    assert sum(p.stat().st_size for p in out.rglob("*") if p.is_file()) < 5_000_000


def test_a_stale_lock_whose_pid_now_runs_another_process_is_no_holder(tmp_path: Path) -> None:
    """U7: a finished run's stale run.lock names a pid that now belongs to another process (here: one started
    after the lock was taken); status calls the run finished, and a new start takes the lock over."""
    run = finished_run(tmp_path / "r")
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        taken = time.time() - 30  # the lock's holder took it 30 s ago and died; the pid went to the stranger
        old = {"pid": stranger.pid, "host": socket.gethostname(), "job_id": None, "started": taken,
               "heartbeat": taken + 5}  # fmt: skip
        (run / "run.lock").write_text(json.dumps(old))
        assert lock_holder(run, time.time()) is None
        info = collect(run)
        assert info["status"] == "finished", info["evidence"]
        # a record with the holder's identity (boot and start ticks) that the pid's process does not match
        (run / "run.lock").write_text(json.dumps({**old, "started": time.time(), "identity": "boot:1"}))
        assert lock_holder(run, time.time()) is None
        lock = RunLock(run)
        assert lock._alive(LockRecord.read(run / "run.lock")) is False  # type: ignore[arg-type]
        # the process itself, with its own identity: a holder
        from hpctrain.fsutil import process_identity

        (run / "run.lock").write_text(json.dumps({**old, "identity": process_identity(stranger.pid)}))
        assert lock_holder(run, time.time()) is not None
        mine = {**old, "pid": os.getpid(), "started": time.time(), "identity": None}
        (run / "run.lock").write_text(json.dumps(mine))
        assert lock_holder(run, time.time()) is not None  # older records without identity: its start time
    finally:
        stranger.kill()
        stranger.wait()
