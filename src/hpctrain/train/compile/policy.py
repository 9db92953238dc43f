"""What compiles, how and where: train.compile's mode per network, `auto` resolved, the background helper's
use (train.compile_background), and the one torch.compile call the training process and the helper share."""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch._functorch.config
from torch import nn

from hpctrain.errors import UserError


def compile_mode_of(setting: str | Mapping[str, str], name: str) -> str:
    """train.compile for network `name`: one mode for all networks, or the mapping's (networks not named: off)."""
    if isinstance(setting, str):
        return setting
    return str(setting.get(name, "off"))


def on_cuda(device_setting: str) -> bool:
    """Whether train.device puts the networks on a CUDA device (auto: when this torch sees one)."""
    return device_setting in ("auto", "cuda") and torch.cuda.is_available()


# `auto` compiles only in hops with at least this much time left: compiling the muon networks took 51-82 s on an
# H100 (bench/gpu.py, docs/performance.md), over 10 % of anything shorter.
AUTO_COMPILE_MIN_SECONDS = 600.0


def resolve_compile(mode: str, cuda: bool) -> str:
    """`auto` as what the GPU bench found to pay (bench/gpu.py, docs/performance.md): torch's default mode on
    CUDA, off on CPU (there the compile costs a minute of 2 cores and buys little); other modes as given."""
    if mode == "auto":
        return "default" if cuda else "off"
    return mode


def compile_in_background(setting: bool | None, cuda: bool, world_size: int) -> bool:
    """train.compile_background: whether the networks compile in a helper process while the hop trains eagerly
    (train/compile/ahead.py). null = on CUDA; never under DDP, where every rank would need the switch at the same
    update and a helper of its own."""
    if world_size > 1:
        return False
    return cuda if setting is None else setting


def check_compile_names(setting: str | Mapping[str, str], names: list[str], workload: str) -> None:
    """A per-network mapping must name networks of this workload: a typo would silently compile nothing."""
    if not isinstance(setting, str):
        unknown = sorted(set(setting) - set(names))
        if unknown:
            raise UserError(
                f"train.compile: {', '.join(unknown)} is not a network of {workload} (its networks: "
                f"{', '.join(names)}); give one mode, or a mode per network"
            )


def is_compiled(module: nn.Module) -> bool:
    """Whether `module` is torch.compile's wrapper (by its `_orig_mod`: no import of torch._dynamo, which a run
    that compiles nothing need not pay for)."""
    return hasattr(module, "_orig_mod")


def compile_network(
    module: nn.Module, mode: str, memory_budget: float | None, dynamic: bool | None = None
) -> nn.Module:
    """torch.compile(module) in `mode` ("default" = torch's own), with the activation-memory budget set.

    `dynamic=True` (ragged workloads: the number of muons changes every batch) compiles sizes as symbols from the
    first call: one graph for every batch, instead of a static one, a recompile at the second batch and another
    when the last batch of an epoch is short."""
    if memory_budget is not None:
        # The min-cut partitioner keeps at most this share of the activations and recomputes the rest.
        torch._functorch.config.activation_memory_budget = memory_budget
    if dynamic:
        # With dynamic=True Dynamo also makes every Python float it meets a symbol (LayerNorm's eps, LeakyReLU's
        # slope, module constants), fails to turn them into tensors, and restarts the whole trace with them as
        # constants: every compile traced twice (5.7 of a warm compile's 8.3 s on the CPU). They never change.
        torch._dynamo.config.specialize_float = True
    compiled = torch.compile(module, mode=None if mode == "default" else mode, dynamic=dynamic)
    return compiled  # type: ignore[return-value]


def short_hop(seconds_left: float | None) -> bool:
    """Whether a hop is too short for `auto` to compile (None: no deadline)."""
    return seconds_left is not None and seconds_left < AUTO_COMPILE_MIN_SECONDS
