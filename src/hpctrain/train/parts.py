"""What a checkpoint holds: the trainer's stateful parts, a dict of name -> object with state_dict/load_state_dict
(Lightning Fabric's `fabric.save(path, {"model": m, ...})`, torchtitan's `Stateful`), and the snapshot built from
them.

Names (docs/architecture.md): the *parts* are the live objects (networks, optimizers, GradScaler, counters, data
position, task, budget timings, trackers); a *snapshot* is the dict of their state_dicts (plus every rank's RNG
state and the config) that one checkpoint file holds; the *counters* (counters.py) are the trainer's counts.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from hpctrain.config.dump import config_hash, dump_config
from hpctrain.config.schema import ConfigBase
from hpctrain.errors import UserError
from hpctrain.runtime import dist
from hpctrain.runtime.seeding import rng_state
from hpctrain.train.checkpoint import FORMAT_VERSION, strip_prefixes


class Stateful(Protocol):
    """A part: its state_dict goes into the snapshot; resume.py puts it back in place (load_state_dict, with the
    checks each part needs)."""

    def state_dict(self) -> Any: ...


class Group:
    """Named networks or optimizers as one part: its state is {name: state_dict}."""

    def __init__(self, members: dict[str, Any]) -> None:
        self.members = members

    def state_dict(self) -> dict[str, Any]:
        return {name: m.state_dict() for name, m in self.members.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name, member in self.members.items():
            member.load_state_dict(state[name])


Parts = dict[str, Stateful]
"""modules, optimizers, scaler (only with fp16), counters, data, task, budget, trackers, oom, spikes."""

SAVED_ONLY = ("trackers",)  # restored elsewhere: the trackers are built after the resume, from the counters


def snapshot(parts: Parts, cfg: ConfigBase, config_changes: list[dict[str, Any]]) -> dict[str, Any]:
    """The dict one checkpoint holds. A collective inside (every rank's RNG state): every rank builds it."""
    out: dict[str, Any] = {"format": FORMAT_VERSION, "scaler": None}
    out.update({name: part.state_dict() for name, part in parts.items()})
    optimizers = parts["optimizers"]
    assert isinstance(optimizers, Group)
    out["optimizer_types"] = {name: type(o).__name__ for name, o in optimizers.members.items()}
    out["rng"] = _gather_rng()  # one entry per rank: its length is the world size that wrote it
    out["config"] = dump_config(cfg)
    out["config_hash"] = config_hash(cfg)
    out["config_changes"] = config_changes
    return out


def _gather_rng() -> list[dict[str, Any]]:
    """Every rank's RNG state (each rank draws its own dropout/sampling stream)."""
    return dist.gather_objects(rng_state(), "RNG states")


def load_weights(modules: dict[str, nn.Module], saved: dict[str, Any], found_in: Path) -> None:
    """Each network's weights from a checkpoint's (or an export's) `modules`, by name (DDP/compile prefixes
    stripped). Weights missing, or not fitting the network this hpctrain builds for the config (another
    version's layers), are one UserError line naming `found_in`."""
    for name, module in modules.items():
        weights = saved.get(name)
        if not isinstance(weights, dict):
            raise UserError(f"{found_in}: holds no weights of network {name!r} (it holds {sorted(saved)})")
        try:
            module.load_state_dict(strip_prefixes(weights))
        except RuntimeError as exc:
            why = " ".join(line.strip() for line in str(exc).strip().splitlines()[:2])[:300]
            raise UserError(
                f"{found_in}: the weights of network {name!r} do not fit the network this hpctrain builds for "
                f"its config ({why})"
            ) from None


def params_sha256(modules: dict[str, nn.Module]) -> str:
    """SHA-256 over every network's state dict, networks by name, tensors in key order."""
    digest = hashlib.sha256()
    for name in sorted(modules):
        for key, tensor in modules[name].state_dict().items():
            digest.update(f"{name}.{key}".encode())
            data = tensor.detach().cpu().contiguous().reshape(-1)
            digest.update(data.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()
