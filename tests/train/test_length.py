"""Another length on resume, judged by what it does to the LR of the updates already trained (train/length.py):
the schedule is the real LRSchedule, the numbers in the lines are its own."""

from __future__ import annotations

import math

from hpctrain.config.schema import ScheduleConfig
from hpctrain.train.length import LengthChange, first_moved, length_change
from hpctrain.train.optim import LRSchedule

COSINE = [{"type": "cosine", "num_updates": -1, "start_factor": 1.0, "end_factor": 0.01}]
WARMUP_COSINE = [{"type": "linear", "num_updates": 100, "start_factor": 0.1}, *COSINE]
# warmup, stable, decay: the decay's place moves with the length
WSD = [
    {"type": "linear", "num_updates": 10, "start_factor": 0.1},
    {"type": "constant", "num_updates": -1},
    {"type": "linear", "num_updates": 100, "start_factor": 1.0, "end_factor": 0.0},
]


def change(
    stages: list[dict], step: int, old_total: int, new_total: int, finished: bool = False
) -> LengthChange | None:
    cfg = ScheduleConfig.model_validate({"stages": stages})
    counters = {"step": step, "total_updates": old_total, "finished": finished}
    return length_change(counters, cfg, LRSchedule(cfg, new_total), {"main": 2.8e-3})


def cosine(update: int, total: int) -> float:
    return 0.01 + 0.99 * 0.5 * (1 + math.cos(math.pi * update / total))


def test_a_finished_cosine_run_asked_for_more_restarts_its_decay_and_needs_consent():
    found = change(COSINE, step=800, old_total=800, new_total=5000, finished=True)
    assert found is not None and found.needs_consent and found.first_moved == 1
    new_lr = 2.8e-3 * cosine(800, 5000)
    assert found.effect() == (
        f"the cosine decay restarts at update 800 from lr 2.8e-05 to {new_lr:.1e} "
        "(the cosine stage spans updates 0-5000 instead of 0-800)"
    )
    assert found.refusal("logs/muons", ["train.total_updates"], "800", "5000") == (
        f"logs/muons finished at update 800: train.total_updates 800 -> 5000 would rewrite its LR schedule: "
        f"{found.effect()}; pass checkpoint.accept_changes=[train.total_updates] to extend it anyway, or keep "
        "train.total_updates at 800"
    )
    assert found.note().startswith(
        "extending the finished run from 800 to 5000 updates (checkpoint.accept_changes): the cosine decay"
    )


def test_an_unfinished_run_shortened_under_a_cosine_is_refused_too():
    found = change(COSINE, step=400, old_total=800, new_total=600)
    assert found is not None and found.needs_consent
    before, after = 2.8e-3 * cosine(400, 800), 2.8e-3 * cosine(400, 600)
    assert found.effect() == (
        f"the LR at update 400 drops from lr {before:.1e} to {after:.1e} "
        "(the cosine stage spans updates 0-600 instead of 0-800)"
    )
    assert "reached update 400 of 800" in found.refusal("r", ["train.total_updates"], "800", "600")
    assert "to shorten it anyway" in found.refusal("r", ["train.total_updates"], "800", "600")


def test_a_length_that_leaves_the_updates_so_far_alone_goes_through_with_a_note():
    constant = change([], step=800, old_total=800, new_total=5000, finished=True)
    assert constant is not None and not constant.needs_consent
    assert constant.note() == (
        "extending the finished run from 800 to 5000 updates: the LR is constant, so the updates so far are those "
        "the new length makes; update 801 trains at lr 2.8e-03"
    )
    fixed = [{"type": "cosine", "num_updates": 800, "end_factor": 0.01}]  # no stage takes "the rest"
    ended = change(fixed, step=800, old_total=800, new_total=900, finished=True)
    assert ended is not None and not ended.needs_consent
    assert "no LR stage depends on the length" in ended.note() and "at lr 2.8e-05" in ended.note()
    # Still warming up: the cosine after the warmup is stretched, but no update so far had its LR from it.
    warming = change(WARMUP_COSINE, step=50, old_total=800, new_total=5000)
    assert warming is not None and not warming.needs_consent and warming.first_moved is None
    assert "the LR stages that depend on the length start after update 50" in warming.note()
    # The stable phase of warmup-stable-decay, either way: the decay moves, nothing trained did.
    for new_total in (2000, 500):
        stable = change(WSD, step=300, old_total=1000, new_total=new_total)
        assert stable is not None and not stable.needs_consent
        assert stable.note().startswith(f"the run's length changes from 1000 to {new_total} updates: ")
    # ... but not once the decay began.
    decaying = change(WSD, step=950, old_total=1000, new_total=2000)
    assert (
        decaying is not None and decaying.needs_consent and decaying.first_moved == 901
    )  # 900 starts the decay at the stable LR
    assert "the LR at update 950 rises from lr 1.4e-03 to 2.8e-03" in decaying.effect()


def test_a_finished_run_that_trains_nothing_more_and_the_same_length_need_nothing():
    early = change(COSINE, step=500, old_total=800, new_total=600, finished=True)  # stopped early at 500
    assert early is not None and not early.needs_consent and early.note() == ""
    assert change(COSINE, step=500, old_total=800, new_total=800) is None


def test_first_moved_skips_flat_pieces_and_finds_what_a_scan_of_every_update_finds():
    stage_sets = [
        COSINE,
        WARMUP_COSINE,
        WSD,
        [{"type": "exponential", "num_updates": -1, "gamma": 0.9}, {"type": "constant", "num_updates": 5}],
        [{"type": "constant", "num_updates": 8, "start_factor": 0.5}, {"type": "linear", "num_updates": -1}],
    ]
    for stages in stage_sets:
        cfg = ScheduleConfig.model_validate({"stages": stages})
        for old_total, new_total in [(30, 60), (60, 30), (120, 200), (5, 150)]:
            old, new = LRSchedule(cfg, old_total), LRSchedule(cfg, new_total)
            for step in range(0, max(old_total, new_total) + 1, 7):
                scanned = next((u for u in range(step) if old.factor(u) != new.factor(u)), None)
                assert first_moved(old, new, step) == scanned, (stages, old_total, new_total, step)
    # A long run in its stable phase (its flat piece is compared once, not update by update).
    cfg = ScheduleConfig.model_validate({"stages": WSD})
    assert first_moved(LRSchedule(cfg, 2_000_000), LRSchedule(cfg, 3_000_000), 1_999_000) is None
