"""Truth v2: the synthetic truth with event-wide structure (truth v1, `v1.py`, is kept unchanged).

Given the primary and N, v1's muons are independent and identically distributed and their energy spectrum at
depth is the same everywhere: a generator that ignores everything but N passes its per-feature judge. v2 keeps
v1's primaries and Elbert mean multiplicity and adds (laws and sources in docs/muons.md, "Truth v2"):

- an event latent s ~ N(0, 1) shared by the bundle's muons: the production height is
  H = (H0 + H_A ln A) / cos z * exp(HEIGHT_SIGMA s) and the muons' energies at depth are scaled by
  exp(-ENERGY_SIGMA s) (an early, high shower: softer muons, wider bundle), and the multiplicity's
  fluctuation draws on it too: g = RHO s + sqrt(1 - RHO^2) e;
- a multiplicity fluctuation whose width depends on the mass: sigma_A = FLUCT_SIGMA_P * A^-1/4 (a nucleus is
  ~A superposed nucleon showers, so its relative fluctuation is smaller);
- a muon energy spectrum that depends on the slant depth X: the surface energies follow the integral power law
  P(E_s > e) = (e / E_th)^-GAMMA above the threshold E_th(X) and below the cut-off E/A (applied at the surface),
  propagated to depth by the continuous loss dE/dX = -(a + b E):
  E = (E_s + a/b) exp(-b X) - a/b = (t - 1) a/b (1 - exp(-b X)) with t = E_s / E_th, plus 1 GeV;
- a leading muon (the first of each non-empty event): the same law with the harder index LEADING_GAMMA;
- lateral distance r = min(p_T H / E_s, R_MAX) with the muon's surface energy, p_T ~ Gamma(2, 0.2 GeV).
"""

from __future__ import annotations

import numpy as np

from hpctrain.workloads.muons.truth.v1 import (
    ELOSS_A,
    ELOSS_B,
    ICE_DENSITY,
    PT_SCALE,
    PT_SHAPE,
    R_MAX_M,
    mass_number,
    mean_multiplicity,
    placed,
    sample_primaries,
    threshold_energy,
)

VERSION = "v2"
GAMMA = 1.7  # integral index of the surface muon spectrum (that of the cosmic rays, Gaisser ch. 6)
LEADING_GAMMA = 0.8  # the leading muon's harder spectrum
FLUCT_SIGMA_P = 0.6  # the proton's width of log N; sigma_A = FLUCT_SIGMA_P * A^-1/4
RHO = 0.5  # share of the event latent in the multiplicity's fluctuation
HEIGHT_SIGMA = 0.25  # log production height per unit of the latent
ENERGY_SIGMA = 0.3  # log muon energy at depth per unit of the latent (opposite sign)
HEIGHT_M, HEIGHT_PER_LN_A_M = 15_000.0, 1_500.0  # heavier nuclei interact higher


def fluctuation_sigma(a: np.ndarray) -> np.ndarray:
    """(n,) width of the multiplicity's log-normal fluctuation for mass numbers `a`."""
    return FLUCT_SIGMA_P * np.asarray(a, dtype=np.float64) ** -0.25


def _truncated_pareto(u: np.ndarray, gamma: np.ndarray | float, t_max: np.ndarray) -> np.ndarray:
    """t >= 1 with P(t > x) proportional to x^-gamma - t_max^-gamma, by inversion of uniforms u."""
    return (1.0 - u * (1.0 - t_max**-gamma)) ** (-1.0 / gamma)


def sample_latent_counts(primaries: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(latent s (n,), counts (n,) int64): Poisson around the Elbert mean fluctuated by g = RHO s + ..."""
    n = len(primaries)
    latent = rng.standard_normal(n)
    g = RHO * latent + np.sqrt(1.0 - RHO**2) * rng.standard_normal(n)
    sigma = fluctuation_sigma(mass_number(primaries[:, 2]))
    mean = mean_multiplicity(primaries) * np.exp(sigma * g - sigma**2 / 2)
    return latent, rng.poisson(mean).astype(np.int64)


def sample_bundles(primaries: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Muons of each primary: (muons (sum counts, 3) float64 [E_GeV, x_m, y_m], counts (n,) int64)."""
    latent, counts = sample_latent_counts(primaries, rng)
    total = int(counts.sum())
    a = mass_number(primaries[:, 2])
    cos_z = np.cos(primaries[:, 1])
    slant = primaries[:, 3] / cos_z * ICE_DENSITY
    e_th = threshold_energy(primaries)
    # Elbert's mean is 0 unless E > A E_th, so every muon's event has t_max > 1
    t_max = np.repeat(np.maximum(primaries[:, 0] / (a * e_th), 1.0 + 1e-9), counts)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    gamma = np.full(total, GAMMA)
    gamma[starts[counts > 0]] = LEADING_GAMMA
    t = _truncated_pareto(rng.uniform(0.0, 1.0, total), gamma, t_max)
    s = np.repeat(latent, counts)
    scale = np.repeat(ELOSS_A / ELOSS_B * -np.expm1(-ELOSS_B * slant), counts)
    energy = 1.0 + (t - 1.0) * scale * np.exp(-ENERGY_SIGMA * s)
    e_surface = t * np.repeat(e_th, counts)
    height = np.repeat((HEIGHT_M + HEIGHT_PER_LN_A_M * np.log(a)) / cos_z, counts) * np.exp(HEIGHT_SIGMA * s)
    pt = rng.gamma(PT_SHAPE, PT_SCALE, total)
    r = np.minimum(pt * height / e_surface, R_MAX_M)
    return placed(energy, r, rng), counts


def sample(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """n events of truth v2: (primaries (n, 4), muons (sum counts, 3), counts (n,))."""
    primaries = sample_primaries(n, rng)
    muons, counts = sample_bundles(primaries, rng)
    return primaries, muons, counts
