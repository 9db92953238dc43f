"""Presets: named, importable bundles of settings applied on top of a YAML file.

Each function returns nested overrides; they touch only generic sections, so they combine with any workload.
The GPU presets ask for `train.device: cuda`: on a CPU-only torch (or a node without a GPU) the run stops at
once with one line saying how to install the CUDA build, instead of training on the CPU of a GPU allocation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from hpctrain.errors import UserError

# Cluster jobs run for hours: save every 30 minutes of wall time as well, so a crash, OOM, dead rank or lost node
# costs at most 30 minutes. A save takes seconds (measured ~0.8 s per 100 MB of state, i.e. weights + Adam
# moments, on a plain disk; docs/training.md): 5 s for a 50M-parameter model = 0.3% of 30 minutes. The trainer
# stretches the interval for big models so that saves never take more than 2% of the time.
SAVE_EVERY_MINUTES = 30.0


def debug() -> dict[str, Any]:
    """Seconds on a laptop CPU: tiny batches, frequent logs and evaluations."""
    return {
        "train": {"total_updates": 200, "eval_every": 100, "device": "cpu", "precision": "fp32"},
        "data": {"batch_size": 32, "num_workers": 0},
        "logging": {"log_every": 20},
        "checkpoint": {"every": 100},
        "slurm": {"nodes": 1, "gpus_per_node": 0, "time": "00:10:00", "signal_lead_seconds": 30},
    }


def single_gpu() -> dict[str, Any]:
    """One GPU, bf16 autocast, workers feeding it."""
    return {
        "train": {"device": "cuda", "precision": "bf16", "allow_tf32": True},
        "data": {"num_workers": 4},
        "checkpoint": {"every_minutes": SAVE_EVERY_MINUTES},
        "slurm": {"nodes": 1, "gpus_per_node": 1, "cpus_per_task": 8, "time": "04:00:00"},
    }


def multi_gpu() -> dict[str, Any]:
    """One node, four GPUs, one DDP task each."""
    return {
        "train": {"device": "cuda", "precision": "bf16"},
        "data": {"num_workers": 4},
        "checkpoint": {"every_minutes": SAVE_EVERY_MINUTES},
        "slurm": {"nodes": 1, "gpus_per_node": 4, "cpus_per_task": 8, "time": "04:00:00"},
    }


def multi_node() -> dict[str, Any]:
    """Two nodes of four GPUs; longer collective timeout for cross-node start-up."""
    return {
        "train": {"device": "cuda", "precision": "bf16"},
        "data": {"num_workers": 4},
        "checkpoint": {"every_minutes": SAVE_EVERY_MINUTES},
        "distributed": {"timeout_seconds": 600},
        "slurm": {"nodes": 2, "gpus_per_node": 4, "cpus_per_task": 8, "time": "08:00:00"},
    }


def none() -> dict[str, Any]:
    """Nothing on top of the YAML file: for an sbatch template, which otherwise implies its own preset."""
    return {}


PRESETS: dict[str, Callable[[], dict[str, Any]]] = {
    "debug": debug,
    "single_gpu": single_gpu,
    "multi_gpu": multi_gpu,
    "multi_node": multi_node,
    "none": none,
}


def flat(name: str) -> Iterator[tuple[str, Any]]:
    """The preset as (dotted key, value) pairs."""
    if name not in PRESETS:
        raise UserError(f"--preset {name!r} is unknown (allowed: {', '.join(PRESETS)})")

    def walk(prefix: str, node: dict[str, Any]) -> Iterator[tuple[str, Any]]:
        for key, value in node.items():
            if isinstance(value, dict):
                yield from walk(f"{prefix}{key}.", value)
            else:
                yield f"{prefix}{key}", value

    yield from walk("", PRESETS[name]())
