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
