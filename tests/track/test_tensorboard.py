"""TensorBoard event files, read back with TensorBoard's own reader."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from hpctrain.track.tensorboard import MAX_HIST_VALUES, TensorBoardTracker, cap_values


def _read(folder: Path) -> EventAccumulator:
    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0, "histograms": 0})
    acc.Reload()
    return acc


def test_two_hops_continue_steps_and_hide_a_killed_hops_tail(tmp_path: Path) -> None:
    first = TensorBoardTracker(tmp_path / "tb", None, resume_step=None, run="muons")
    assert re.fullmatch(r"muons-\d{8}-\d{6}", first.run_name)  # which run, and when its first hop began
    for step in range(10, 70, 10):  # hop 1 logs to 60, but its last checkpoint was at 40
        first.log_scalars(step, {"loss": float(step), "data_share": 0.1})
    first.flush()
    state = first.state_dict()
    first.close()

    second = TensorBoardTracker(tmp_path / "tb", None, resume_step=40, state=state)
    assert second.log_dir == first.log_dir  # the same run folder for every hop
    for step in range(50, 90, 10):
        second.log_scalars(step, {"loss": -float(step), "data_share": 0.2})
    second.close()

    acc = _read(first.log_dir)
    events = acc.Scalars("train/loss")
    assert [e.step for e in events] == [10, 20, 30, 40, 50, 60, 70, 80]
    assert [e.value for e in events] == [10, 20, 30, 40, -50, -60, -70, -80]  # hop 2's values after 40
    assert [e.step for e in acc.Scalars("time/data")] == [10, 20, 30, 40, 50, 60, 70, 80]
    assert len(list(first.log_dir.glob("events.out.tfevents.*"))) == 2


def test_histograms_are_capped_and_config_name_wins(tmp_path: Path) -> None:
    tracker = TensorBoardTracker(tmp_path / "tb", "myrun", resume_step=None, state={"run_name": "old"})
    assert tracker.log_dir == tmp_path / "tb" / "myrun"
    big = np.random.default_rng(0).normal(size=(300, 1000)).astype(np.float32)
    big[0, :10] = np.nan  # dropped, not a crash
    tracker.log_histograms(20, {"primary_energy": big})
    tracker.close()
    hist = _read(tracker.log_dir).Histograms("hist/primary_energy")
    assert [h.step for h in hist] == [20]
    assert hist[0].histogram_value.num == MAX_HIST_VALUES


def test_cap_values_leaves_the_global_rng_alone() -> None:
    np.random.seed(5)
    expected = np.random.rand()
    np.random.seed(5)
    assert cap_values(np.arange(100_000), 100, seed=3).size == 100
    assert np.random.rand() == expected


def test_flush_mirrors_the_event_files(tmp_path: Path) -> None:
    mirror = tmp_path / "mirror"
    tracker = TensorBoardTracker(tmp_path / "tb", "r1", resume_step=None, mirror_to=str(mirror))
    tracker.log_scalars(1, {"loss": 1.5})
    tracker.flush()
    copies = list((mirror / "r1").glob("events.out.tfevents.*"))
    assert copies and copies[0].stat().st_size > 0
    tracker.close()
    assert [e.value for e in _read(mirror / "r1").Scalars("train/loss")] == [1.5]
