"""LR schedules: the exponential-decay stage, per update and per epoch, chained after a warmup."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from hpctrain.config.schema import ScheduleConfig
from hpctrain.errors import UserError
from hpctrain.train.optim import LRSchedule


def schedule(*stages: dict) -> ScheduleConfig:
    return ScheduleConfig.model_validate({"stages": list(stages)})


def test_exponential_per_update_after_a_warmup() -> None:
    cfg = schedule(
        {"type": "linear", "num_updates": 10, "start_factor": 0.0, "end_factor": 1.0},
        {"type": "exponential", "num_updates": -1, "gamma": 0.99},
    )
    lr = LRSchedule(cfg, total_updates=500)
    assert lr.factor(5) == pytest.approx(0.5)
    assert lr.factor(10) == pytest.approx(1.0)  # decay starts where warmup ended
    assert lr.factor(110) == pytest.approx(0.99**100)
    assert lr.factor(499) == pytest.approx(0.99**489)
    assert lr.factor(10_000) == pytest.approx(0.99**489)  # past the end: where the stage ended


def test_exponential_per_epoch_steps_once_per_epoch() -> None:
    cfg = schedule(
        {"type": "exponential", "num_updates": -1, "gamma": 0.5, "gamma_every": "epoch", "start_factor": 2.0}
    )
    lr = LRSchedule(cfg, total_updates=100, updates_per_epoch=10)
    assert [lr.factor(u) for u in (0, 9, 10, 19, 20, 35)] == [2.0, 2.0, 1.0, 1.0, 0.5, 0.25]


def test_per_epoch_needs_a_known_epoch() -> None:
    cfg = schedule({"type": "exponential", "num_updates": -1, "gamma": 0.5, "gamma_every": "epoch"})
    with pytest.raises(UserError, match="gamma_every=epoch needs a data set of known size"):
        LRSchedule(cfg, total_updates=100, updates_per_epoch=None)


@pytest.mark.parametrize(
    "stage",
    [
        {"type": "exponential", "num_updates": 5},  # no gamma
        {"type": "linear", "num_updates": 5, "gamma": 0.9},  # gamma where it means nothing
        {"type": "exponential", "num_updates": 5, "gamma": 0},
        {"type": "exponential", "num_updates": 5, "gamma": 0.9, "gamma_every": "week"},
    ],
)
def test_bad_exponential_stages_are_refused(stage: dict) -> None:
    with pytest.raises(ValidationError):
        schedule(stage)
