"""chain.json hops and goodput."""

from __future__ import annotations

import json
import time
from pathlib import Path

from hpctrain.track.chain import ChainLog, process_start_time


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
