"""Many runs: finding run folders under a folder, reading the end of a large metrics.jsonl, and each record's
`time` and `hop` (old records without them still read)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from hpctrain.track.metrics_file import MetricsFile, read_metrics, record_hop
from hpctrain.track.runs import find_runs, is_run_dir, tail_records


def _run(path: Path, marker: str = "chain.json") -> Path:
    path.mkdir(parents=True)
    (path / marker).write_text("[]")
    return path


def test_run_folders_are_found_two_levels_down_and_not_inside_runs(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    a = _run(logs / "a")
    _run(a / "old-20260101-000000")  # an earlier run moved aside inside a run folder: not a run of the table
    b = _run(logs / "sweep" / "lr1e-5", "config.yaml")
    c = _run(logs / "sweep" / "lr2e-5", "metrics.jsonl")
    _run(logs / "sweeps" / "s1" / "lr3e-5")  # three levels down: too deep
    _run(logs / ".hidden")
    (logs / "empty").mkdir()
    (logs / "notes.txt").write_text("x")
    assert find_runs(logs) == [a, b, c]
    assert find_runs(logs, depth=1) == [a]
    assert find_runs(logs / "sweeps", depth=2) == [logs / "sweeps" / "s1" / "lr3e-5"]
    assert is_run_dir(a) and not is_run_dir(logs) and not is_run_dir(logs / "notes.txt")
    assert find_runs(tmp_path / "missing") == []


def _lines(path: Path, count: int) -> list[dict]:
    records = []
    for step in range(1, count + 1):
        records.append({"step": step, "loss": 1.0 / step, "pad": "x" * 50})
        if step % 25 == 0:
            records.append({"step": step, "val_loss": 2.0 / step})
        if step == 800:
            records.append({"step": step, "test_loss": 0.5})  # once, about a fifth from the end
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return records


def test_the_tail_of_a_large_file_reads_back_only_as_far_as_needed(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    records = _lines(path, 1000)
    size = path.stat().st_size
    whole = tail_records(path, want=("val_loss",), block=size)
    assert whole.records == records and whole.whole and whole.kept_whole

    # every evaluation within the limit (their best is wanted), every record of the last block
    tail = tail_records(path, want=("val_loss",), all_of_want=True, block=2000, limit=size // 2)
    last = [r for r in tail.records if "loss" in r]
    assert not tail.whole and not tail.kept_whole
    assert last == [r for r in records if "loss" in r][-len(last) :] and 10 < len(last) < 40
    evals = [r["step"] for r in tail.records if "val_loss" in r]
    assert evals == list(range(evals[0], 1001, 25)) and 450 < evals[0] < 600  # all in the last half only
    assert [r["step"] for r in tail.records] == sorted(r["step"] for r in tail.records)  # in file order
    kept = tail_records(path, want=("val_loss",), all_of_want=True, block=2000, limit=size)
    assert not kept.whole and kept.kept_whole
    assert [r["step"] for r in kept.records if "val_loss" in r] == list(range(25, 1001, 25))

    # only the last value wanted: read back until it is found, not further
    found = tail_records(path, want=("test_loss",), block=2000, limit=size)
    assert [r["step"] for r in found.records if "test_loss" in r] == [800] and not found.kept_whole
    missing = tail_records(path, want=("nowhere",), block=2000, limit=size)
    assert missing.kept_whole and not missing.whole  # looked through the whole file

    with path.open("a") as fh:
        fh.write('{"step": 1001, "loss": 0.1, "pa')  # cut by a kill
    assert tail_records(path, block=500).records[-1] == records[-1]
    assert tail_records(tmp_path / "none.jsonl").records == []


def test_records_carry_their_time_and_hop_and_old_records_still_read(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    before = time.time()
    metrics = MetricsFile(
        path, None, {"hop": 3, "world_size": 2, "config_hash": "abc", "allowed_changes": {}}
    )
    metrics.log_scalars(1, {"loss": 1.0})
    metrics.log_scalars(2, {"loss": 0.5})
    metrics.close()
    first, second = read_metrics(path)
    assert first["hop_start"] == {"world_size": 2, "config_hash": "abc"} and "hop_start" not in second
    assert [first["hop"], second["hop"]] == [3, 3]
    assert before - 0.01 <= first["time"] <= second["time"] <= time.time() + 0.01

    old_first = {"step": 1, "loss": 1.0, "hop": {"hop": 2, "world_size": 1}}  # before `hop` was an int
    assert [record_hop(r) for r in (old_first, {"step": 2}, first, {"hop": True})] == [2, None, 3, None]
