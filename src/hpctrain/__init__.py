"""hpctrain: train PyTorch models on SLURM clusters across walltime limits without losing a step.

`hpctrain.load(run)` hands a trained model to a notebook or a script; `import hpctrain` itself imports no torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # `hpctrain train` imports this package before its stop handlers: nothing slow here
    from pathlib import Path

    from hpctrain.workloads.trained import Trained

__version__ = "0.1.0"
__all__ = ["load"]


def load(run_or_checkpoint: str | Path, which: str = "latest", device: Any = "cpu") -> Trained:
    """The trained networks of a run folder, a checkpoint file or an export folder (`hpctrain export`), ready to use.

    which: "latest" (the run's latest readable checkpoint), "best" (best.pt) or "step_N" (update N); each is
    loaded only verified (its sidecar's SHA-256; an export's files against export.json).
    device: where the networks go ("cpu", "cuda", "cuda:1", "mps", a torch.device); one this machine or this torch
    build has not is a UserError.

    Returns a `Trained`: `.models` (name -> network in eval mode; `.model` when there is one), `.config`,
    `.settings` (each network's constructor arguments), `.step`, `.checkpoint`, `.params_sha256`, and
    `.sampler` for the muon models: `.sampler.sample(n_events, seed)` (the bundles `hpctrain sample` writes) and
    `.sampler.generate(primaries, seed=...)` for primaries by named columns with units (energy_GeV, zenith_rad in
    radians with 0 = vertical, or cos_zenith, mass_GeV, depth_m) or an (n, 4) array in that order; muons come
    back as (energy GeV, x m, y m). A missing or unreadable checkpoint, a wrong `which` or `device` raises
    hpctrain.errors.UserError (a ValueError).
    """
    from hpctrain.workloads.trained import load as load_trained

    return load_trained(run_or_checkpoint, which, device)
