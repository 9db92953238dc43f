"""The end of a process's first update, noticed with no per-update work: one post-step hook per optimizer that
removes itself after its first call. When every optimizer has stepped once (a GAN's update ends with its
generator's step) the update is done: `done()` runs once, e.g. to record the hop's start-up time."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def on_first_update(optimizers: dict[str, torch.optim.Optimizer], done: Callable[[], None]) -> None:
    pending: dict[str, Any] = {}

    def stepped(name: str) -> Callable[..., None]:
        def hook(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
            pending.pop(name).remove()
            if not pending:
                done()

        return hook

    for name, optimizer in optimizers.items():
        pending[name] = optimizer.register_step_post_hook(stepped(name))
