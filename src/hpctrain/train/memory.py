"""Compile modes and activation memory: torch.compile per network, the compiler's activation-memory budget, and
explicit activation checkpointing of a network's blocks where it is not compiled."""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from typing import Any

import torch
import torch._functorch.config
from torch import nn
from torch.utils.checkpoint import checkpoint

from hpctrain.errors import UserError

log = logging.getLogger(__name__)


def compile_mode_of(setting: str | Mapping[str, str], name: str) -> str:
    """train.compile for network `name`: one mode for all networks, or the mapping's (networks not named: off)."""
    if isinstance(setting, str):
        return setting
    return str(setting.get(name, "off"))


def check_compile_names(setting: str | Mapping[str, str], names: list[str], workload: str) -> None:
    """A per-network mapping must name networks of this workload: a typo would silently compile nothing."""
    if not isinstance(setting, str):
        unknown = sorted(set(setting) - set(names))
        if unknown:
            raise UserError(
                f"train.compile: {', '.join(unknown)} is not a network of {workload} (its networks: "
                f"{', '.join(names)}); give one mode, or a mode per network"
            )


def compile_network(module: nn.Module, mode: str, memory_budget: float | None) -> nn.Module:
    """torch.compile(module) in `mode` ("default" = torch's own), with the activation-memory budget set."""
    if memory_budget is not None:
        # The min-cut partitioner keeps at most this share of the activations and recomputes the rest.
        torch._functorch.config.activation_memory_budget = memory_budget
    return torch.compile(module, mode=None if mode == "default" else mode)  # type: ignore[return-value]


def blocks_of(module: nn.Module) -> list[nn.Module]:
    """The outermost nn.Sequential blocks holding parameters (the network itself when it is one): the unit
    recomputed in backward by activation checkpointing."""
    if isinstance(module, nn.Sequential):
        return [module]
    found: list[nn.Module] = []
    for child in module.children():
        if isinstance(child, nn.Sequential) and any(True for _ in child.parameters()):
            found.append(child)
        else:
            found.extend(blocks_of(child) if not isinstance(child, nn.Sequential) else [])
    return found


def checkpoint_blocks(blocks: list[nn.Module]) -> int:
    """Make each block recompute its activations in backward (non-reentrant: double backward, e.g. a gradient
    penalty, works through it). Keeps parameter names (state dicts unchanged). Returns the number of blocks."""
    for block in blocks:
        forward = block.forward

        @functools.wraps(forward)
        def recomputed(*args: Any, _forward: Any = forward, **kwargs: Any) -> Any:
            if not torch.is_grad_enabled():  # evaluation: nothing to save, nothing to recompute
                return _forward(*args, **kwargs)
            return checkpoint(_forward, *args, use_reentrant=False, **kwargs)

        block.forward = recomputed
    return len(blocks)


def recompute_wanted(gradient_checkpointing: bool, memory_budget: float | None, mode: str) -> bool:
    """Whether a network recomputes activations explicitly: train.gradient_checkpointing, or a memory budget
    below 1 on a network the compiler does not see (the budget's fallback)."""
    return gradient_checkpointing or (memory_budget is not None and memory_budget < 1 and mode == "off")
