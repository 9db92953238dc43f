"""Activation memory: explicit activation checkpointing of a network's blocks where it is not compiled (the
compiler's own activation-memory budget is set in train/compile/policy.py)."""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


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
