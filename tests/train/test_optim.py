"""LR schedules (the exponential-decay stage, per update and per epoch, chained after a warmup) and the optimizers' fused
kernels on the CPU."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from hpctrain.config.schema import OptimConfig, ScheduleConfig
from hpctrain.errors import UserError
from hpctrain.train.optim import LRSchedule, build_optimizer


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


@pytest.mark.parametrize("name", ["adam", "adamw", "sgd"])
def test_cpu_optimizers_take_the_fused_kernel_and_follow_the_looped_one(name: str) -> None:
    """On the CPU torch's default is a Python loop over the tensors; the trainer takes the fused kernel, which must
    make the same updates (to float rounding) and skip frozen parameters."""
    cfg = OptimConfig.model_validate({"name": name, "lr": 1e-2, "weight_decay": 0.01, "momentum": 0.9})
    torch.manual_seed(0)
    start = [torch.randn(7, 5), torch.randn(5), torch.randn(3, 3)]
    frozen = torch.nn.Parameter(torch.ones(2), requires_grad=False)
    params = [torch.nn.Parameter(t.clone()) for t in start]
    looped = [torch.nn.Parameter(t.clone()) for t in start]
    optimizer = build_optimizer([*params, frozen], cfg, cfg.lr)
    assert optimizer.defaults["fused"] is True
    assert all(p is not frozen for group in optimizer.param_groups for p in group["params"])
    kind = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}[name]
    extra = {"momentum": 0.9} if name == "sgd" else {}
    reference = kind(looped, lr=1e-2, weight_decay=0.01, foreach=False, **extra)
    for step in range(5):
        for a, b in zip(params, looped, strict=True):
            g = torch.sin(a.detach() * (step + 1))
            a.grad, b.grad = g.clone(), g.clone()
        optimizer.step()
        reference.step()
    for a, b, s in zip(params, looped, start, strict=True):
        assert not torch.equal(a.detach(), s)  # it moved
        torch.testing.assert_close(a.detach(), b.detach(), rtol=1e-5, atol=1e-6)
