"""A device the user names (`hpctrain.load(run, device=...)`, `--device`), checked against this machine and this
torch build: a mistake is one UserError line naming it, never torch's AssertionError from deep inside `.to()`."""

from __future__ import annotations

from typing import Any

import torch

from hpctrain.errors import UserError

CHOICES = "cpu, cuda, cuda:N or mps"


def usable_device(name: Any, culprit: str) -> torch.device:
    """`name` (a string, a torch.device, or None: CUDA when there is one, else the CPU) as a torch.device this
    machine has; `culprit` is how the user gave it (`--device cuda`, `device='cuda'`), for the error line."""
    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = name if isinstance(name, torch.device) else torch.device(name)
    except (RuntimeError, TypeError, ValueError):
        raise UserError(f"{culprit}: no such device; choose {CHOICES}") from None
    if device.type == "cpu":
        return device
    if device.type == "cuda":
        if torch.version.cuda is None:
            raise UserError(
                f"{culprit}: the installed torch {torch.__version__} is a CPU-only build (no CUDA); use cpu, or "
                "install torch's CUDA build"
            )
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise UserError(
                f"{culprit}: this machine has no CUDA device visible (CUDA_VISIBLE_DEVICES?); use cpu"
            )
        if device.index is not None and device.index >= count:
            raise UserError(f"{culprit}: this machine has {count} CUDA device(s), cuda:0 to cuda:{count - 1}")
        return device
    if device.type == "mps":
        mps = getattr(torch.backends, "mps", None)
        if mps is None or not mps.is_available():
            raise UserError(f"{culprit}: this machine (or this torch build) has no mps device; use cpu")
        return device
    raise UserError(f"{culprit}: {device.type} devices are not supported; choose {CHOICES}")
