"""The synthetic truth: a documented generative process for muon bundles, vectorised and importable.

A trained generator is compared with fresh samples of this process, so every law here is explicit:

Primaries (`sample_primaries`), columns PRIMARY_COLUMNS = [E_GeV, zenith_rad, mass_GeV, depth_m]:
- energy log-uniform over [1e3, 1e9] GeV;
- nucleus p, He, N, Fe with probabilities 0.4, 0.3, 0.15, 0.15 (mass in GeV from NUCLEI);
- cos(zenith) uniform over [COS_ZENITH_MIN, 1];
- depth uniform over the physicists' grid linspace(1000, 2800, 100) m (one row per (primary, depth) upstream).

Bundles (`sample_bundles`), muon columns MUON_COLUMNS = [E_GeV, x_m, y_m]:
- slant depth X = depth / cos(zenith) * ICE_DENSITY (metres water equivalent), threshold energy
  E_th = a/b (exp(b X) - 1) with a = 0.268 GeV/mwe, b = 4e-4 /mwe (continuous energy loss);
- Elbert mean N = K A / (E_th cos z) (E / (A E_th))^0.757 (1 - A E_th / E)^5.25 for E > A E_th, else 0,
  with K = 14.5 GeV, A the mass number;
- shower-to-shower fluctuation: the Poisson mean is N * exp(sigma g - sigma^2 / 2), g ~ N(0, 1), sigma = 0.6
  (mean preserving), so the tail reaches tens of thousands of muons at the highest energies;
- muon energy at depth E_mu = 1 GeV + Lomax(shape 1.7, scale 300 GeV), i.e.
  P(E_mu - 1 > e) = (1 + e/300)^-1.7, capped at E/A;
- lateral distance r = min(p_T H / (E_mu + E_th), 2000 m) (E_mu + E_th: the energy at production) with
  p_T ~ Gamma(2, 0.2 GeV) and production height H = 15 km / cos(zenith); phi uniform, x = r sin(phi),
  y = r cos(phi).
"""

from __future__ import annotations

import numpy as np

PRIMARY_COLUMNS = ("energy_GeV", "zenith_rad", "mass_GeV", "depth_m")
MUON_COLUMNS = ("energy_GeV", "x_m", "y_m")
E_MIN, E_MAX = 1e3, 1e9
COS_ZENITH_MIN = 0.3
DEPTHS_M = np.linspace(1000.0, 2800.0, 100)
# name: (mass number A, mass in GeV, probability)
NUCLEI = {
    "p": (1, 0.938272, 0.40),
    "He": (4, 3.727379, 0.30),
    "N": (14, 13.040202, 0.15),
    "Fe": (56, 52.089776, 0.15),
}
ICE_DENSITY = 0.917
ELOSS_A, ELOSS_B = 0.268, 4e-4
ELBERT_K, ELBERT_ALPHA, ELBERT_BETA = 14.5, 0.757, 5.25
FLUCTUATION_SIGMA = 0.6
MUON_E_SHAPE, MUON_E_SCALE = 1.7, 300.0
PT_SHAPE, PT_SCALE = 2.0, 0.2
PRODUCTION_HEIGHT_M = 15_000.0
R_MAX_M = 2000.0

_MASSES = np.array([v[1] for v in NUCLEI.values()])
_NUMBERS = np.array([v[0] for v in NUCLEI.values()], dtype=np.float64)
_PROBS = np.array([v[2] for v in NUCLEI.values()])


def sample_primaries(n: int, rng: np.random.Generator) -> np.ndarray:
    """(n, 4) float64 [E_GeV, zenith_rad, mass_GeV, depth_m] drawn from the documented priors."""
    energy = np.exp(rng.uniform(np.log(E_MIN), np.log(E_MAX), n))
    mass = _MASSES[rng.choice(len(_MASSES), size=n, p=_PROBS)]
    zenith = np.arccos(rng.uniform(COS_ZENITH_MIN, 1.0, n))
    depth = DEPTHS_M[rng.integers(0, len(DEPTHS_M), n)]
    return np.stack([energy, zenith, mass, depth], axis=1)


def mass_number(mass_gev: np.ndarray) -> np.ndarray:
    """Mass number A of each primary (nearest of the nuclei in NUCLEI)."""
    return _NUMBERS[np.abs(np.asarray(mass_gev)[:, None] - _MASSES[None, :]).argmin(axis=1)]


def threshold_energy(primaries: np.ndarray) -> np.ndarray:
    """(n,) muon energy in GeV needed at the surface to reach the depth along the shower axis."""
    slant_mwe = primaries[:, 3] / np.cos(primaries[:, 1]) * ICE_DENSITY
    return ELOSS_A / ELOSS_B * np.expm1(ELOSS_B * slant_mwe)


def mean_multiplicity(primaries: np.ndarray) -> np.ndarray:
    """(n,) Elbert mean number of muons at depth (before the shower-to-shower fluctuation)."""
    energy, cos_z = primaries[:, 0], np.cos(primaries[:, 1])
    a = mass_number(primaries[:, 2])
    e_th = threshold_energy(primaries)
    ratio = energy / (a * e_th)
    above = ratio > 1.0
    mean = np.zeros(len(primaries))
    r = ratio[above]
    mean[above] = (
        ELBERT_K * a[above] / (e_th[above] * cos_z[above]) * r**ELBERT_ALPHA * (1 - 1 / r) ** ELBERT_BETA
    )
    return mean


def sample_counts(primaries: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """(n,) int64 multiplicities: Poisson around the fluctuated Elbert mean."""
    mean = mean_multiplicity(primaries)
    fluct = np.exp(FLUCTUATION_SIGMA * rng.standard_normal(len(mean)) - FLUCTUATION_SIGMA**2 / 2)
    return rng.poisson(mean * fluct).astype(np.int64)


def sample_bundles(primaries: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Muons of each primary: (muons (sum counts, 3) float64 [E_GeV, x_m, y_m], counts (n,) int64)."""
    counts = sample_counts(primaries, rng)
    total = int(counts.sum())
    a = mass_number(primaries[:, 2])
    e_cap = np.repeat(primaries[:, 0] / a, counts)  # (total,)
    cos_z = np.repeat(np.cos(primaries[:, 1]), counts)
    e_th = np.repeat(threshold_energy(primaries), counts)
    # Lomax by inversion: e = scale (u^(-1/shape) - 1)
    u = rng.uniform(0.0, 1.0, total)
    energy = np.minimum(MUON_E_SCALE * (u ** (-1.0 / MUON_E_SHAPE) - 1.0) + 1.0, e_cap)
    pt = rng.gamma(PT_SHAPE, PT_SCALE, total)
    r = np.minimum(pt * PRODUCTION_HEIGHT_M / cos_z / (energy + e_th), R_MAX_M)
    return placed(energy, r, rng), counts


def placed(energy: np.ndarray, r: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Muons (len(r), 3) as (energy, x, y): each at distance r from the axis, at a uniform azimuth."""
    phi = rng.uniform(0.0, 2 * np.pi, len(r))
    return np.stack([energy, r * np.sin(phi), r * np.cos(phi)], axis=1)


def sample(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """n events of the truth: (primaries (n, 4), muons (sum counts, 3), counts (n,))."""
    primaries = sample_primaries(n, rng)
    muons, counts = sample_bundles(primaries, rng)
    return primaries, muons, counts
