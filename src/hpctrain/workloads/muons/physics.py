"""Normalisation of primaries and muons as the physicists use it, its inverse, and the bad-value guards.

Primaries [E_GeV, zenith_rad, mass_GeV, depth_m] -> [log10(E/1e6), cos(zenith), log10(mass), depth/1000];
muons [E_GeV, x_m, y_m] -> [log10(E/1e6), x/500, y/500]. The logarithms are only taken of values checked to be
positive and finite (`bad_events`); `normalize_*` clamp to a floor anyway, so nothing becomes -inf or NaN.
"""

from __future__ import annotations

import numpy as np
import torch

ENERGY_SCALE = 1e6  # GeV -> PeV
DEPTH_SCALE = 1000.0  # m -> km
XY_SCALE = 500.0  # m
TINY = 1e-30  # floor under log10 arguments (only reached by values the guards let through on purpose)


def _t(values: np.ndarray | torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(values)) if isinstance(values, np.ndarray) else values


def normalize_primaries(raw: np.ndarray | torch.Tensor) -> torch.Tensor:
    """(B, 4) physical -> (B, 4) normalised."""
    raw = _t(raw)
    out = torch.empty_like(raw)
    out[:, 0] = torch.log10(raw[:, 0].clamp_min(TINY) / ENERGY_SCALE)
    out[:, 1] = torch.cos(raw[:, 1])
    out[:, 2] = torch.log10(raw[:, 2].clamp_min(TINY))
    out[:, 3] = raw[:, 3] / DEPTH_SCALE
    return out


def denormalize_primaries(norm: np.ndarray | torch.Tensor) -> torch.Tensor:
    """(B, 4) normalised -> (B, 4) physical (zenith from arccos of the clamped cosine)."""
    norm = _t(norm)
    out = torch.empty_like(norm)
    out[:, 0] = torch.pow(10.0, norm[:, 0]) * ENERGY_SCALE
    out[:, 1] = torch.arccos(norm[:, 1].clamp(-1.0, 1.0))
    out[:, 2] = torch.pow(10.0, norm[:, 2])
    out[:, 3] = norm[:, 3] * DEPTH_SCALE
    return out


def normalize_muons(raw: np.ndarray | torch.Tensor) -> torch.Tensor:
    """(M, 3) physical -> (M, 3) normalised."""
    raw = _t(raw)
    out = torch.empty_like(raw)
    out[:, 0] = torch.log10(raw[:, 0].clamp_min(TINY) / ENERGY_SCALE)
    out[:, 1:] = raw[:, 1:] / XY_SCALE
    return out


def denormalize_muons(norm: np.ndarray | torch.Tensor) -> torch.Tensor:
    """(M, 3) normalised (e.g. generated) -> (M, 3) physical."""
    norm = _t(norm)
    out = torch.empty_like(norm)
    out[:, 0] = torch.pow(10.0, norm[:, 0]) * ENERGY_SCALE
    out[:, 1:] = norm[:, 1:] * XY_SCALE
    return out


def bad_events(primaries: np.ndarray, muons: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """(B,) bool: events whose primary energy or mass is not positive and finite, whose other primary values
    are not finite, or with a muon whose energy is not positive and finite or whose x, y are not finite.

    primaries (B, 4) physical, muons (M, 3) physical, offsets (B + 1,) into the muons."""
    # `not (v > 0)` is also true for NaN; `< inf` removes +inf
    bad = ~(
        (primaries[:, 0] > 0)
        & (primaries[:, 0] < np.inf)
        & (primaries[:, 2] > 0)
        & (primaries[:, 2] < np.inf)
    )
    bad |= ~np.isfinite(primaries[:, 1]) | ~np.isfinite(primaries[:, 3])
    # fast path: one reduction each proves every muon fine (a non-finite value makes the sum non-finite)
    if len(muons) and not (np.isfinite(muons.sum(dtype=np.float64)) and muons[:, 0].min() > 0):
        muon_bad = ~((muons[:, 0] > 0) & (muons[:, 0] < np.inf)) | ~np.isfinite(muons[:, 1:]).all(axis=1)
        if muon_bad.any():
            # per event: any bad muon, from a cumulative count at the offsets
            cum = np.concatenate([[0], np.cumsum(muon_bad)])
            bad |= (cum[offsets[1:]] - cum[offsets[:-1]]) > 0
    return bad
