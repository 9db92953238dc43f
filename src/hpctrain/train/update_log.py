"""The log line: the losses since the last one (device tensors, read only at a log step or a save, then checked
on every rank by the non-finite guard and the spike rule) and the figures rank 0 logs at a log step."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from hpctrain.runtime.env import ClusterEnv
from hpctrain.train.cadence import GuardVotes
from hpctrain.train.counters import Counters
from hpctrain.train.nonfinite import NonFiniteGuard
from hpctrain.train.outcome import Timers
from hpctrain.train.spikes import SpikeGuard
from hpctrain.train.task import StepOutput


class LossWindow:
    """The losses of the updates since the last log line. Appending is the only per-update work (no sync);
    `checked` reads them once on the host and hands them to the guards."""

    def __init__(self, guard: NonFiniteGuard, spikes: SpikeGuard) -> None:
        self.guard, self.spikes = guard, spikes
        self.losses: list[torch.Tensor] = []  # device tensors, never synced until read
        self.first = 1  # the update of losses[0]

    def add(self, loss: torch.Tensor) -> None:
        self.losses.append(loss.detach() if loss.requires_grad else loss)

    def checked(self) -> list[float]:
        """The losses on the host, checked: a non-finite one (the guard) or a spike (train.on_spike) raises or
        is noted by its update."""
        losses = torch.stack(self.losses).float().tolist()
        self.guard.check_losses(losses, self.first)
        self.spikes.observe(losses, self.first)
        return losses

    def check_for_save(self, modules: dict[str, nn.Module], step: int) -> None:
        """Before every save: the losses since the last check and the weights must be finite on every rank,
        else all ranks raise NonFinite (or Rewind, for a spike) instead of saving (one small collective per
        save)."""
        if self.losses:
            self.checked()  # a spike to rewind from is never saved
        self.guard.check_weights(modules, step)
        found = GuardVotes(self.guard.first_bad, self.spikes.found).agree()
        self.guard.raise_if(found.nonfinite)
        self.spikes.raise_if(found.spike)

    def restart(self, step: int) -> None:
        """The window begins after update `step` (a log line was written, or updates were undone)."""
        self.losses.clear()
        self.first = step + 1


class LogLine:
    """Rank 0's figures at a log step: the update's own, the mean loss, the rates since the last line, the time
    shares, the hardware's latest readings."""

    def __init__(self, env: ClusterEnv, device: torch.device) -> None:
        self.env, self.device = env, device
        self.last_step = 0  # the update of the last log line

    def scalars(
        self,
        out: StepOutput,
        losses: list[float],
        counters: Counters,
        timers: Timers,
        lr: float,
        grad_norms: dict[str, Any],
    ) -> dict[str, float]:
        shares, elapsed = timers.shares()
        updates = max(counters.step - max(self.last_step, counters.resumed_step or 0), 1)
        self.last_step = counters.step
        scalars = update_scalars(out, math.fsum(losses) / len(losses), grad_norms, lr)
        scalars.update(rates(out, updates, elapsed, self.env.world_size))
        scalars.update(shares)
        if self.device.type == "cuda":
            scalars["gpu_mem_peak_gb"] = torch.cuda.max_memory_allocated(self.device) / 2**30
        return scalars


def update_scalars(
    out: StepOutput, mean_loss: float, grad_norms: dict[str, Any], lr: float
) -> dict[str, float]:
    """The figures of one log line that the update itself gives: its loss, the mean loss since the last line,
    the task's metrics, gradient norms (one per optimizer, named when there are several) and the LR."""
    scalars = {"loss": float(out.loss), "loss_mean": mean_loss}
    scalars.update({k: float(v) for k, v in out.metrics.items()})
    for name, norm in grad_norms.items():
        scalars[f"grad_norm_{name}" if len(grad_norms) > 1 else "grad_norm"] = float(norm)
    scalars["lr"] = lr
    return scalars


def rates(out: StepOutput, updates: int, elapsed: float, world_size: int) -> dict[str, float]:
    """Updates, samples (and the task's extra counts, e.g. muons) per second over all ranks since the last
    log line."""
    per_update = out.samples * world_size
    scalars = {"updates_per_s": updates / elapsed, "samples_per_s": per_update * updates / elapsed}
    for key, count in out.extra_counts.items():
        scalars[f"{key}_per_s"] = count * world_size * updates / elapsed
    return scalars
