"""`2lpt` maps: a slab of a 3-D universe evolved with second-order Lagrangian perturbation theory, projected.

The process (docs/fields.md), for each map:
- a 3-D Gaussian field on a periodic grid of N x N x N/4 cells of side L/N (L = data.box_size, so the slab is L/4
  deep), with the 3-D power spectrum P(k) = A k^n_s T_BBKS(k / (Omega_m h))^2 normalised to the standard sigma_8
  (rms of the field in spheres of 8 Mpc/h: sigma_8^2 = int dk k^2 P(k) W(k R8)^2 / (2 pi^2));
- one particle per cell displaced by 2LPT (Bouchet et al. 1995, A&A 296, 575; the form of Scoccimarro 1998, MNRAS
  299, 1097 and Crocce, Pueblas & Scoccimarro 2006, MNRAS 373, 369): x = q - grad(phi1) + D2 grad(phi2) with
  laplacian(phi1) = delta, laplacian(phi2) = sum_{i<j} (phi1_ii phi1_jj - phi1_ij^2) and D2 = -3/7 (Einstein-de
  Sitter; the Omega_m dependence of D2/D1^2 is below 1%);
- the particles' density contrast on the grid by cloud-in-cell, averaged through the slab's depth: the map.
On large scales the map's power is the linear P(k_perp, k_z = 0) / depth; the density's skewness is the
perturbative one, S3 = <delta^3> / <delta^2>^2 = 34/7 + gamma_1 for a top-hat of radius R, gamma_1 = d ln
sigma^2(R) / d ln R (= 34/7 - (n + 3) for a power law of index n; Juszkiewicz, Bouchet & Colombi 1993, ApJ 412,
L9; Bernardeau 1994, ApJ 433, 1), which 2LPT reproduces at leading order and the first order alone (Zel'dovich:
4 + gamma_1) does not. tests/workloads/fields/test_two_lpt.py checks both.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from hpctrain.workloads.fields.cosmology import D2_OVER_D1SQ, R8, map_rng, spectrum_shape, tophat_window

DEPTH_SHARE = 4  # the slab is box_size / 4 deep (N / 4 cells)
CHUNK = 32  # maps evolved at once (the 3-D work arrays of a chunk of 64^2 x 16 cells: ~10 MB each)
_LOG_K = np.linspace(np.log(1e-4), np.log(50.0), 512)
_K = np.exp(_LOG_K)


def power_spectrum_3d(omega_m: Any, sigma_8: Any, k: Any) -> np.ndarray:
    """P(k) in (Mpc/h)^3 of the 3-D field; parameters (...,) broadcast against k to (..., *k.shape)."""
    om = np.asarray(omega_m, dtype=np.float64)
    s8 = np.asarray(sigma_8, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    unit = np.trapezoid(
        _K**3 * spectrum_shape(_K, om[..., None]) * tophat_window(_K * R8) ** 2, _LOG_K, axis=-1
    )
    expand = (Ellipsis,) + (None,) * k.ndim
    return (s8**2 * 2 * np.pi**2 / unit)[expand] * spectrum_shape(k, om[expand])


def wavenumbers_3d(shape: tuple[int, int, int], cell: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """kx (N, 1, 1), ky (1, N, 1), kz (1, 1, Nz//2 + 1) in h/Mpc, in the layout of numpy's rfftn."""
    nx, ny, nz = shape
    kx = 2 * np.pi * np.fft.fftfreq(nx, d=cell)
    ky = 2 * np.pi * np.fft.fftfreq(ny, d=cell)
    kz = 2 * np.pi * np.fft.rfftfreq(nz, d=cell)
    return kx[:, None, None], ky[None, :, None], kz[None, None, :]


def linear_modes_3d(white: np.ndarray, params: np.ndarray, cell: float) -> np.ndarray:
    """The Gaussian field's modes (B, N, N, Nz//2+1) from the rfftn of unit white noise in real space (same
    shape) and params (B, 2): each mode times sqrt(P(k) / cell^3); k = 0 is zero."""
    shape = (white.shape[1], white.shape[2], 2 * (white.shape[3] - 1))
    kx, ky, kz = wavenumbers_3d(shape, cell)
    k = np.sqrt(kx**2 + ky**2 + kz**2)
    amplitude = np.sqrt(power_spectrum_3d(params[:, 0], params[:, 1], k) / cell**3)  # (B, N, N, Nz//2+1)
    amplitude[:, 0, 0, 0] = 0.0
    return white * amplitude.astype(np.float32)


def displacements(modes: np.ndarray, cell: float, second_order: bool = True) -> np.ndarray:
    """Displacements (B, 3, N, N, Nz) in Mpc/h from the linear modes (B, N, N, Nz//2+1): 1st + 2nd order LPT
    (`second_order` False: the Zel'dovich approximation alone)."""
    shape = (modes.shape[1], modes.shape[2], 2 * (modes.shape[3] - 1))
    ks = wavenumbers_3d(shape, cell)
    k2 = ks[0] ** 2 + ks[1] ** 2 + ks[2] ** 2
    k2[0, 0, 0] = 1.0  # its mode is zero anyway
    inv_k2 = (1.0 / k2).astype(np.float32)

    def real(x: np.ndarray) -> np.ndarray:
        return np.fft.irfftn(x, s=shape, axes=(1, 2, 3)).astype(np.float32)

    # psi1 = -grad(phi1) = i k delta / k^2
    psi = np.stack([real(1j * k.astype(np.float32) * modes * inv_k2) for k in ks], axis=1)
    if not second_order:
        return psi
    # phi1_ij = k_i k_j delta / k^2; the source of phi2: the sum over i < j of phi_ii phi_jj - phi_ij^2
    phi = {
        (i, j): real((ks[i] * ks[j]).astype(np.float32) * modes * inv_k2)
        for i in range(3)
        for j in range(i, 3)
    }
    source = np.zeros_like(phi[0, 0])
    for i, j in ((0, 1), (0, 2), (1, 2)):
        source += phi[i, i] * phi[j, j] - phi[i, j] ** 2
    source_k = np.fft.rfftn(source, axes=(1, 2, 3))
    # psi2 = D2 grad(phi2), laplacian(phi2) = source: psi2 = -D2 i k source / k^2
    for axis, k in enumerate(ks):
        psi[:, axis] += real(-D2_OVER_D1SQ * 1j * k.astype(np.float32) * source_k * inv_k2)
    return psi


def cic_density_3d(displacement: np.ndarray, cell: float) -> np.ndarray:
    """Cloud-in-cell density contrast (B, N, N, Nz) of one particle per cell moved by `displacement` (B, 3, ...)."""
    batch, _, *shape = displacement.shape
    grid = np.meshgrid(*(np.arange(n, dtype=np.float64) for n in shape), indexing="ij")
    cells = int(np.prod(shape))
    flat_index = np.zeros((batch, *shape), dtype=np.int64)
    base = (np.arange(batch) * cells).reshape(batch, 1, 1, 1)
    floors, fracs = [], []
    for axis in range(3):
        pos = grid[axis] + displacement[:, axis] / cell  # (B, N, N, Nz) in cells
        low = np.floor(pos)
        floors.append(low.astype(np.int64))
        fracs.append(pos - low)
    counts = np.zeros(batch * cells)
    strides = (shape[1] * shape[2], shape[2], 1)
    for corner in range(8):
        offsets = [(corner >> axis) & 1 for axis in range(3)]
        weight = np.ones_like(fracs[0])
        flat_index[:] = base
        for axis, step in enumerate(offsets):
            weight = weight * (fracs[axis] if step else 1 - fracs[axis])
            flat_index += ((floors[axis] + step) % shape[axis]) * strides[axis]
        counts += np.bincount(flat_index.ravel(), weight.ravel(), minlength=batch * cells)
    return counts.reshape(batch, *shape) - 1.0


def slab_shape(size: int) -> tuple[int, int, int]:
    return size, size, max(2, size // DEPTH_SHARE)


def draw_3d(
    seed: int, split: str, indices: Sequence[int], size: int, prior: Sequence[tuple[float, float]]
) -> tuple[np.ndarray, np.ndarray]:
    """Parameters (B, 2) uniform in the prior box and unit white noise (B, N, N, N/4) in real space, from each
    map's own stream (seed, split, index)."""
    lo = np.array([p[0] for p in prior])
    width = np.array([p[1] - p[0] for p in prior])
    shape = slab_shape(size)
    params = np.empty((len(indices), len(prior)), dtype=np.float64)
    white = np.empty((len(indices), *shape), dtype=np.float32)
    for row, index in enumerate(indices):
        rng = map_rng(seed, split, index)
        params[row] = lo + width * rng.random(len(prior))
        rng.standard_normal(dtype=np.float32, out=white[row])
    return params, white


def density_2lpt(
    white: np.ndarray, params: np.ndarray, box_size: float, second_order: bool = True
) -> np.ndarray:
    """The 2LPT density contrast (B, N, N, Nz) of real-space white noise (B, N, N, Nz) on cells of box_size / N."""
    cell = box_size / white.shape[1]
    modes = linear_modes_3d(np.fft.rfftn(white, axes=(1, 2, 3)).astype(np.complex64), params, cell)
    return cic_density_3d(displacements(modes, cell, second_order), cell)


def maps_2lpt(white: np.ndarray, params: np.ndarray, box_size: float) -> np.ndarray:
    """Maps (B, N, N) float32: the 2LPT slabs averaged through their depth, CHUNK maps at a time."""
    out = np.empty(white.shape[:3], dtype=np.float32)
    for lo in range(0, len(white), CHUNK):
        hi = lo + CHUNK
        out[lo:hi] = density_2lpt(white[lo:hi], params[lo:hi], box_size).mean(axis=-1)
    return out
