"""The cosmology every field generator shares (generate.py in 2-D, two_lpt.py in 3-D): the BBKS transfer function,
the spectral shape, the top-hat window, the constants, and each map's own random stream."""

from __future__ import annotations

import numpy as np

H = 0.7  # Hubble parameter in units of 100 km/s/Mpc (BBKS shape parameter Gamma = Omega_m h)
N_S = 0.96  # primordial spectral index
R8 = 8.0  # Mpc/h, radius of the sigma_8 top-hat
D2_OVER_D1SQ = -3.0 / 7.0  # second-order growth factor relative to D1^2
SPLITS = {"train": 0, "val": 1, "test": 2}


def bbks_transfer_sq(k: np.ndarray, omega_m: np.ndarray | float) -> np.ndarray:
    """Square of the Bardeen et al. (1986) transfer function, k in h/Mpc."""
    q = np.maximum(k, 1e-12) / (np.asarray(omega_m) * H)
    # 1 + 3.89 q + (16.1 q)^2 + (5.46 q)^3 + (6.71 q)^4 in Horner form: powers are slow on large grids.
    poly = 1 + q * (3.89 + q * (16.1**2 + q * (5.46**3 + q * 6.71**4)))
    return (np.log1p(2.34 * q) / (2.34 * q)) ** 2 / np.sqrt(poly)


def tophat_window(x: np.ndarray) -> np.ndarray:
    """3(sin x - x cos x)/x^3, with its series near 0 where the formula cancels."""
    x = np.asarray(x, dtype=np.float64)
    small = x < 1e-3
    safe = np.where(small, 1.0, x)
    return np.where(small, 1 - x**2 / 10, 3 * (np.sin(safe) - safe * np.cos(safe)) / safe**3)


def spectrum_shape(k: np.ndarray, omega_m: np.ndarray) -> np.ndarray:
    return np.maximum(k, 0.0) ** N_S * bbks_transfer_sq(k, omega_m)


def map_rng(seed: int, split: str, index: int) -> np.random.Generator:
    """The random stream of one map: a function of (seed, split, global index) only."""
    return np.random.default_rng([int(seed), SPLITS[split], int(index)])
