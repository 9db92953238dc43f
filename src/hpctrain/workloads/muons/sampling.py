"""Using a trained muon model: load it from a run folder or a checkpoint, generate bundles in batches.

Generated events come back in physical units as `layouts.Events`, so they are written in the current Parquet
layout by the same writer as the data (and `hpctrain data inspect` reads them).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from hpctrain.errors import UserError
from hpctrain.runtime.seeding import TRUTH_PRIMARIES, numpy_rng
from hpctrain.workloads.muons import layouts, physics
from hpctrain.workloads.muons.networks import Generator, MultiplicityHead, event_index

# (state, checkpoint file, run folder or None): what hpctrain.train.checkpoint.find_checkpoint returns.
Found = tuple[dict[str, Any], Path, Path | None]


@dataclass
class LoadedModel:
    cfg: Any
    modules: dict[str, nn.Module]
    step: int
    run_dir: Path | None
    checkpoint: Path
    device: torch.device

    @property
    def model_type(self) -> str:
        return str(self.cfg.model.type)


def load_model(
    path: str | Path, device: str | torch.device | None = None, found: Found | None = None
) -> LoadedModel:
    """The networks of a muon_wgan or muon_multiplicity checkpoint, in eval mode on `device` (default: CUDA
    when there is one). `found`: the checkpoint `path` names, when the caller has read it already."""
    from hpctrain.config.loading import validate
    from hpctrain.runtime.env import ClusterEnv
    from hpctrain.train.checkpoint import find_checkpoint, strip_prefixes
    from hpctrain.workloads.registry import config_model, task_factory

    state, file, run_dir = found if found is not None else find_checkpoint(path)
    cfg = validate(config_model(), state["config"])
    if cfg.model.type not in ("muon_wgan", "muon_multiplicity"):
        raise UserError(f"{file}: model.type={cfg.model.type!r} is not a muon model")
    dev = (
        torch.device(device)
        if device is not None
        else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    )
    task = task_factory(cfg.model.type)(cfg, ClusterEnv())
    modules = task.build_modules()
    for name, module in modules.items():
        module.load_state_dict(strip_prefixes(state["modules"][name]))
        module.to(dev).eval()
    step = int(state.get("counters", {}).get("step", 0))
    return LoadedModel(cfg, modules, step, run_dir, file, dev)


def read_primaries(path: str) -> tuple[np.ndarray, np.ndarray]:
    """(primaries (n, 4) physical, ids (n, 2)) of every event in a muon file of any layout (muons ignored)."""
    from hpctrain.workloads.muons.tools import _files

    parts_p, parts_i = [], []
    for file in _files(path):
        try:
            _, events = layouts.read_all(file)
        except layouts.LayoutError as err:
            raise UserError(str(err)) from None
        parts_p.append(events.primaries)
        parts_i.append(events.ids)
    return np.concatenate(parts_p), np.concatenate(parts_i)


@torch.no_grad()
def sample_counts(model: LoadedModel, primaries: np.ndarray, batch_size: int = 4096) -> np.ndarray:
    """(n,) sampled multiplicities for physical primaries (n, 4) (torch's global RNG: seed it first)."""
    head: MultiplicityHead = (
        model.modules["generator"].multiplicity  # type: ignore[assignment]
        if "generator" in model.modules
        else model.modules["multiplicity"]
    )
    out = []
    for start in range(0, len(primaries), batch_size):
        prim = physics.normalize_primaries(
            torch.as_tensor(primaries[start : start + batch_size], dtype=torch.float32)
        )
        out.append(head.sample(prim.to(model.device)).cpu().numpy())
    return np.concatenate(out) if out else np.zeros(0, np.int64)


@torch.no_grad()
def generate_events(
    model: LoadedModel,
    primaries: np.ndarray,
    ids: np.ndarray | None = None,
    batch_size: int = 4096,
    counts: np.ndarray | None = None,
) -> layouts.Events:
    """Generated bundles for physical primaries (n, 4) in batches of `batch_size` events; `counts` (n,) fixes
    the multiplicities instead of sampling them. Uses torch's global RNG: seed it first."""
    if "generator" not in model.modules:
        raise UserError(f"{model.checkpoint}: a {model.model_type} model generates no muons (use muon_wgan)")
    generator: Generator = model.modules["generator"]  # type: ignore[assignment]
    n = len(primaries)
    all_counts, all_muons = [], []
    for start in range(0, n, batch_size):
        prim = torch.as_tensor(primaries[start : start + batch_size], dtype=torch.float32)
        norm = physics.normalize_primaries(prim).to(model.device)
        if counts is None:
            c = generator.multiplicity.sample(norm)
        else:
            c = torch.as_tensor(counts[start : start + batch_size], dtype=torch.int64, device=model.device)
        total = int(c.sum())
        muons, _, _ = generator(norm, c, event_index(c, total))
        muons = generator.scaler.inverse(muons)
        all_counts.append(c.cpu().numpy())
        muons = muons.float().cpu()
        muons[:, 0] = muons[:, 0].clamp(
            -10.0, 6.0
        )  # finite, positive energies in the file (1e-4 GeV..1e12 GeV)
        all_muons.append(physics.denormalize_muons(muons).numpy())
    ids = np.stack([np.zeros(n, np.int64), np.arange(n, dtype=np.int64)], 1) if ids is None else ids
    return layouts.Events(
        np.asarray(primaries, np.float32),
        np.concatenate(all_muons).astype(np.float32) if all_muons else np.zeros((0, 3), np.float32),
        np.concatenate(all_counts).astype(np.int64) if all_counts else np.zeros(0, np.int64),
        np.asarray(ids, np.int64),
    )


def truth_primaries(n: int, seed: int) -> np.ndarray:
    from hpctrain.workloads.muons import truth

    return truth.sample_primaries(n, numpy_rng(seed, TRUTH_PRIMARIES))
