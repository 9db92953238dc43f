"""Optimizers, LR scaling with the global batch, and chained LR schedules with cumulative milestones."""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from hpctrain.config.schema import OptimConfig, ScheduleConfig, ScheduleStage


def effective_lr(cfg: OptimConfig, global_batch: int) -> float:
    """The LR after scaling with the global batch (samples per update over all ranks)."""
    ratio = global_batch / cfg.base_batch_size
    if cfg.lr_scaling == "linear":
        return cfg.lr * ratio
    if cfg.lr_scaling == "sqrt":
        return cfg.lr * math.sqrt(ratio)
    return cfg.lr


def build_optimizer(
    params: Iterable[torch.nn.Parameter], cfg: OptimConfig, lr: float
) -> torch.optim.Optimizer:
    params = [p for p in params if p.requires_grad]
    if cfg.name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    cls = torch.optim.AdamW if cfg.name == "adamw" else torch.optim.Adam
    return cls(params, lr=lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay)


def stage_bounds(stages: list[ScheduleStage], total_updates: int) -> list[tuple[int, int]]:
    """(start, end) update of each stage: milestones are CUMULATIVE; the -1 stage takes what is left."""
    fixed = sum(s.num_updates for s in stages if s.num_updates != -1)
    rest = max(total_updates - fixed, 0)
    bounds, start = [], 0
    for stage in stages:
        length = rest if stage.num_updates == -1 else stage.num_updates
        bounds.append((start, start + length))
        start += length
    return bounds


class LRSchedule:
    """LR factor as a pure function of the update count: nothing to drift or forget across resumes."""

    def __init__(self, cfg: ScheduleConfig, total_updates: int) -> None:
        self.stages = cfg.stages
        self.bounds = stage_bounds(cfg.stages, total_updates)

    def factor(self, update: int) -> float:
        if not self.stages:
            return 1.0
        for stage, (start, end) in zip(self.stages, self.bounds):
            if update < end:
                progress = (update - start) / max(end - start, 1)
                a, b = stage.start_factor, stage.end_factor
                if stage.type == "constant":
                    return a
                if stage.type == "linear":
                    return a + (b - a) * progress
                return b + (a - b) * 0.5 * (1.0 + math.cos(math.pi * progress))
        return (
            self.stages[-1].end_factor if self.stages[-1].type != "constant" else self.stages[-1].start_factor
        )


def apply_lr(optimizer: torch.optim.Optimizer, base_lr: float, factor: float) -> float:
    lr = base_lr * factor
    for group in optimizer.param_groups:
        group["lr"] = lr
    return lr
