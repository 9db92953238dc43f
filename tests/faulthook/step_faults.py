"""Faults in the task's update for tests: an out-of-memory error, a stalled rank, a loss spike.

`faulty_step(...)` wraps `SupervisedTask.train_step` (the regression task's): in-process tests set it with
monkeypatch; subprocesses get it from sitecustomize.py when `_HPCTRAIN_TEST_STEP_FAULT` holds its keyword
arguments as JSON (tests.conftest.step_fault). Calls are counted per process, retries included.
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch

from hpctrain.train.task import SupervisedTask

# What torch says on a GPU (its numbers are what the one-line message repeats).
OOM_MESSAGE = (
    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which 1.23 GiB "
    "is free. Including non-PyTorch memory, this process has 77.9 GiB memory in use."
)


def faulty_step(
    oom_after: int | None = None,
    oom_above: int = 0,
    stall_rank: int | None = None,
    stall_at: int | None = None,
    spike_at: list[int] | None = None,
    spike_factor: float = 50.0,
) -> Any:
    """A train_step that, from call `oom_after` + 1 on, runs out of memory on micro-batches of more than
    `oom_above` samples (as a real step does from some size up); on rank `stall_rank` sleeps for an hour at call
    `stall_at`; at the calls in `spike_at` multiplies the loss by `spike_factor` (the step takes it too)."""
    original = SupervisedTask.train_step
    calls = [0]
    rank = int(os.environ.get("RANK", "0"))

    def step(self: SupervisedTask, micro: Any, ctx: Any) -> Any:
        calls[0] += 1
        if oom_after is not None and calls[0] > oom_after and max(m.samples for m in micro) > oom_above:
            raise torch.OutOfMemoryError(OOM_MESSAGE)
        if stall_at is not None and rank == stall_rank and calls[0] == stall_at:
            time.sleep(3600)
        if spike_at and calls[0] in spike_at:
            loss = self.loss

            def spiked(model: Any, batch: Any) -> Any:
                value, metrics = loss(model, batch)
                return value * spike_factor, metrics

            self.loss = spiked  # type: ignore[method-assign]
            try:
                return original(self, micro, ctx)
            finally:
                del self.loss
        return original(self, micro, ctx)

    step.calls = calls  # type: ignore[attr-defined]
    return step
