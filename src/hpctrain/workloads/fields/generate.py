"""Vectorised FFT generators of 2-D matter fields whose parameters (Omega_m, sigma_8) are known exactly.

The process (docs/fields.md):
- power spectrum P(k) = A k^n_s T_BBKS(k / (Omega_m h))^2 with h = 0.7, n_s = 0.96, k in h/Mpc, and A such
  that the field smoothed with a top-hat of radius 8 Mpc/h has rms sigma_8 (the 2-D integral,
  W = 3(sin x - x cos x)/x^3);
- `gaussian`: white noise (drawn in Fourier space) times sqrt(P), back to real space (the k=0 mode is zero);
- `lognormal`: exp(g - var(g)/2) - 1 of that Gaussian map g (mean 0, >= -1), var(g) the grid's exact variance;
- `lpt`: one particle per pixel displaced by 1st + 2nd order Lagrangian perturbation theory from the same
  initial field (D1 = 1, D2 = -3/7), binned to a density contrast map with cloud-in-cell (a 2-D toy);
- `2lpt`: a slab of a 3-D universe evolved with 2LPT, projected (two_lpt.py).
Each map's random stream is derived from (seed, split, global map index): maps never depend on which worker,
rank or batch draws them, the splits never overlap, and a resumed run sees the same maps.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from hpctrain.fsutil import atomic_path, atomic_write_text
from hpctrain.workloads.fields.cosmology import (
    D2_OVER_D1SQ,
    R8,
    SPLITS,
    map_rng,
    spectrum_shape,
    tophat_window,
)
from hpctrain.workloads.fields.two_lpt import draw_3d, maps_2lpt

# lpt: a 2-D toy (3-D coefficients on a plane); 2lpt: a slab of a 3-D 2LPT universe, projected (two_lpt.py)
KINDS = ("gaussian", "lognormal", "lpt", "2lpt")
PARAMETERS = ("omega_m", "sigma_8")
# Integration grid of the sigma_8 normalisation (the integrand is < 1e-7 of its peak outside; error ~1e-7).
_LOG_K = np.linspace(np.log(1e-4), np.log(20.0), 256)


_K = np.exp(_LOG_K)  # (K,)
_SIGMA8_WEIGHT = _K**2 * tophat_window(_K * R8) ** 2 / (2 * np.pi)  # (K,)


def _unit_sigma8_sq(omega_m: np.ndarray) -> np.ndarray:
    """sigma_8^2 of the unnormalised shape: int d^2k/(2 pi)^2 shape W^2 = int k^2 shape W^2 dlnk / (2 pi)."""
    return np.trapezoid(_SIGMA8_WEIGHT * spectrum_shape(_K, omega_m[..., None]), _LOG_K, axis=-1)  # (...,)


def power_spectrum(omega_m: Any, sigma_8: Any, k: Any) -> np.ndarray:
    """P(k) in (Mpc/h)^2 of the 2-D field; parameters (...,) broadcast against k to (..., *k.shape)."""
    om = np.asarray(omega_m, dtype=np.float64)
    s8 = np.asarray(sigma_8, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    expand = (Ellipsis,) + (None,) * k.ndim  # parameters (...,) -> (..., 1, ..., 1)
    norm = (s8**2 / _unit_sigma8_sq(om))[expand]
    return norm * spectrum_shape(k, om[expand])


def wavenumbers(size: int, box_size: float) -> tuple[np.ndarray, np.ndarray]:
    """kx (size, 1) and ky (1, size//2 + 1) in h/Mpc, in the layout of numpy's rfft2."""
    kx = 2 * np.pi * np.fft.fftfreq(size, d=box_size / size)
    ky = 2 * np.pi * np.fft.rfftfreq(size, d=box_size / size)
    return kx[:, None], ky[None, :]


def _rfft_weights(size: int) -> np.ndarray:
    """How often each rfft2 column counts in the full grid (1 for ky=0 and Nyquist, 2 otherwise)."""
    w = np.full(size // 2 + 1, 2.0)
    w[0] = w[-1] = 1.0
    return w


def rfft2(x: np.ndarray) -> np.ndarray:
    """Real FFT over the last two axes, float32 -> complex64.

    NumPy's pocketfft gives every map the same bits whatever the batch around it; torch's MKL FFT does not
    (a map's last bits would depend on the batch, the number of threads and the memory alignment)."""
    return np.fft.rfft2(np.asarray(x, dtype=np.float32))


def irfft2(x: np.ndarray, size: int) -> np.ndarray:
    """Inverse of `rfft2` for maps (..., size, size), complex64 -> float32."""
    return np.fft.irfft2(np.asarray(x, dtype=np.complex64), s=(size, size))


def draw(
    seed: int, split: str, indices: Sequence[int], size: int, prior: Sequence[tuple[float, float]]
) -> tuple[np.ndarray, np.ndarray]:
    """Parameters (B, 2) uniform in the prior box and white noise (B, N, N//2+1), map by map streams.

    The noise is drawn directly in Fourier space (the rfft2 of unit white noise: complex normal modes of
    variance N^2, Hermitian along the ky = 0 and Nyquist columns), which saves a forward FFT per map."""
    lo = np.array([p[0] for p in prior])
    width = np.array([p[1] - p[0] for p in prior])
    params = np.empty((len(indices), len(prior)), dtype=np.float64)
    parts = np.empty((len(indices), size, size // 2 + 1, 2), dtype=np.float32)  # (real, imaginary) pairs
    for row, index in enumerate(indices):
        rng = map_rng(seed, split, index)
        params[row] = lo + width * rng.random(len(prior))
        rng.standard_normal(dtype=np.float32, out=parts[row])
    modes = parts.view(np.complex64)[..., 0]  # (B, N, N//2+1), no copy
    modes *= np.float32(size / np.sqrt(2))
    # Self-conjugate columns: b(kx) = (a(kx) + conj(a(-kx))) / sqrt(2) keeps the variance, makes b Hermitian.
    flip = (-np.arange(size)) % size
    for col in (0, size // 2):
        column = modes[:, :, col]
        modes[:, :, col] = (column + column[:, flip].conj()) / np.float32(np.sqrt(2))
    return params, modes


@cache
def _grid(size: int, box_size: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The distinct |k| of the rfft2 grid (U,), where each grid point finds its value (N, N//2+1), and how
    many modes of the full grid share each value (U,). P is evaluated on the ~N^2/7 distinct values only."""
    kx, ky = wavenumbers(size, box_size)
    k2 = np.rint((kx**2 + ky**2) * (box_size / (2 * np.pi)) ** 2).astype(np.int64)  # integers i^2 + j^2
    values, inverse = np.unique(k2, return_inverse=True)
    counts = np.bincount(inverse.ravel(), np.broadcast_to(_rfft_weights(size), k2.shape).ravel())
    return np.sqrt(values) * (2 * np.pi / box_size), inverse.reshape(k2.shape), counts


def linear_modes(white: np.ndarray, params: np.ndarray, box_size: float) -> np.ndarray:
    """The Gaussian field's Fourier modes (B, N, N//2+1) from white noise (same shape), params (B, 2)."""
    size = white.shape[-2]
    k, inverse, _ = _grid(size, box_size)
    amplitude = np.sqrt(power_spectrum(params[:, 0], params[:, 1], k)) * (size / box_size)  # (B, U)
    amplitude[:, 0] = 0.0  # k = 0: the mean density of the box is the mean of the universe
    return white * amplitude.astype(np.float32)[:, inverse]


def _gaussian_variance(params: np.ndarray, size: int, box_size: float) -> np.ndarray:
    """Exact variance (B,) of the discrete Gaussian map: sum over all grid modes of P / L^2."""
    k, _, counts = _grid(size, box_size)
    p = power_spectrum(params[:, 0], params[:, 1], k)
    p[:, 0] = 0.0
    return p @ counts / box_size**2


def lpt_displacements(modes: np.ndarray, box_size: float) -> np.ndarray:
    """1st + 2nd order displacements (B, 2, N, N) in Mpc/h from the linear modes (B, N, N//2+1)."""
    size = modes.shape[-2]
    kx, ky = wavenumbers(size, box_size)
    k2 = kx**2 + ky**2
    k2[0, 0] = 1.0  # the k=0 mode is zero anyway
    inv_k2 = (1.0 / k2).astype(np.float32)
    # Potential phi with laplacian(phi) = delta; psi1 = -grad(phi) = i k delta / k^2.
    psi1 = [irfft2(1j * kk.astype(np.float32) * modes * inv_k2, size) for kk in (kx, ky)]
    # phi_ij = k_i k_j delta / k^2; source of the 2nd order potential: phi_xx phi_yy - phi_xy^2.
    pxx, pyy, pxy = (
        irfft2(a.astype(np.float32) * b * modes * inv_k2, size) for a, b in ((kx, kx), (ky, ky), (kx, ky))
    )
    source = rfft2(pxx * pyy - pxy**2)
    # laplacian(phi2) = source; psi2 = D2 grad(phi2) = -D2 i k source / k^2.
    psi2 = [irfft2(-D2_OVER_D1SQ * 1j * kk.astype(np.float32) * source * inv_k2, size) for kk in (kx, ky)]
    return np.stack([psi1[0] + psi2[0], psi1[1] + psi2[1]], axis=1)


def cic_density(displacement: np.ndarray, box_size: float) -> np.ndarray:
    """CIC density contrast (B, N, N) of one particle per pixel moved by `displacement` (B, 2, N, N)."""
    batch, _, size, _ = displacement.shape
    grid = np.arange(size, dtype=np.float64)
    pos_x = grid[:, None] + displacement[:, 0] * (size / box_size)  # (B, N, N) in pixels
    pos_y = grid[None, :] + displacement[:, 1] * (size / box_size)
    ix, iy = np.floor(pos_x), np.floor(pos_y)
    fx, fy = pos_x - ix, pos_y - iy
    ix, iy = ix.astype(np.int64) % size, iy.astype(np.int64) % size
    base = (np.arange(batch) * size * size)[:, None, None]
    counts = np.zeros(batch * size * size)
    for dx, wx in ((0, 1 - fx), (1, fx)):
        for dy, wy in ((0, 1 - fy), (1, fy)):
            cell = base + ((ix + dx) % size) * size + (iy + dy) % size
            counts += np.bincount(cell.ravel(), (wx * wy).ravel(), minlength=batch * size * size)
    return counts.reshape(batch, size, size) - 1.0  # one particle per pixel on average


def fields_from_noise(kind: str, noise: np.ndarray, params: np.ndarray, box_size: float) -> np.ndarray:
    """Maps (B, N, N) float32 of `kind` from Fourier white noise (B, N, N//2+1) (see `draw`) and parameters
    (B, 2) = (Omega_m, sigma_8)."""
    if kind not in KINDS or kind == "2lpt":
        raise ValueError(f"kind={kind!r} is not a 2-D field kind; choose from {', '.join(KINDS[:3])}")
    size = noise.shape[-2]
    modes = linear_modes(noise, params, box_size)
    if kind == "lpt":
        return cic_density(lpt_displacements(modes, box_size), box_size).astype(np.float32)
    gauss = irfft2(modes, size)
    if kind == "gaussian":
        return gauss.astype(np.float32)
    var = _gaussian_variance(params, size, box_size)[:, None, None]
    return np.expm1(gauss - var / 2).astype(np.float32)


def generate_maps(
    kind: str,
    indices: Sequence[int],
    seed: int,
    split: str,
    size: int,
    box_size: float,
    prior: Sequence[tuple[float, float]],
) -> tuple[np.ndarray, np.ndarray]:
    """Maps (B, size, size) float32 and their parameters (B, 2) float32 for these global map indices."""
    if split not in SPLITS:
        raise ValueError(f"split={split!r} is not one of {', '.join(SPLITS)}")
    if kind == "2lpt":
        params, white = draw_3d(seed, split, indices, size, prior)
        return maps_2lpt(white, params, box_size), params.astype(np.float32)
    params, noise = draw(seed, split, indices, size, prior)
    return fields_from_noise(kind, noise, params, box_size), params.astype(np.float32)


def measured_power_spectrum(
    maps: np.ndarray, box_size: float, bins: int = 16
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Azimuthally averaged P(k) of maps (B, N, N): mean k (bins,), P (B, bins), modes per bin (bins,)."""
    size = maps.shape[-1]
    kx, ky = wavenumbers(size, box_size)
    k = np.sqrt(kx**2 + ky**2).ravel()
    power = np.abs(np.fft.rfft2(maps.astype(np.float64))) ** 2 * (box_size / size) ** 2 / size**2
    power = power.reshape(len(maps), -1)
    weight = np.broadcast_to(_rfft_weights(size), (size, size // 2 + 1)).ravel()
    edges = np.linspace(2 * np.pi / box_size, np.pi * size / box_size, bins + 1)
    which = np.digitize(k, edges) - 1
    keep = (which >= 0) & (which < bins)
    modes = np.bincount(which[keep], weight[keep], minlength=bins)
    sums = np.stack([np.bincount(which[keep], (p * weight)[keep], minlength=bins) for p in power])
    kmean = np.bincount(which[keep], (k * weight)[keep], minlength=bins) / np.maximum(modes, 1)
    return kmean, sums / np.maximum(modes, 1), modes


# ---- shards on disk ---------------------------------------------------------------------------------------


def write_split(
    out: Path,
    split: str,
    n: int,
    *,
    kind: str,
    seed: int,
    size: int,
    box_size: float,
    prior: Sequence[tuple[float, float]],
    fmt: str = "hdf5",
    shard_size: int = 1024,
    batch: int = 256,
    share: tuple[int, int] = (0, 1),
) -> dict[str, Any]:
    """Write maps 0..n-1 of a split as shards in out/<split>/ and meta.json (written last); returns it.

    share=(k, K): write only the shards whose number is k modulo K (array task k of K). A shard is the same
    whichever task writes it (map streams depend on (seed, split, index) only); meta.json is written by the task
    that finds every shard present, so a reader sees the split only once it is whole (meta["complete"])."""
    if fmt not in ("hdf5", "npy"):
        raise ValueError(f"format={fmt!r}: choose hdf5 or npy")
    folder = out / split
    folder.mkdir(parents=True, exist_ok=True)
    meta: dict[str, Any] = {
        "kind": kind,
        "split": split,
        "seed": seed,
        "size": size,
        "box_size": box_size,
        "prior": {name: list(p) for name, p in zip(PARAMETERS, prior)},
        "parameters": list(PARAMETERS),
        "format": fmt,
        "n": n,
        "shards": [],
    }
    task, tasks = share
    for number, start in enumerate(range(0, n, shard_size)):
        stop = min(start + shard_size, n)
        name = f"shard-{number:05d}"
        if number % tasks != task:
            meta["shards"].append({"files": _shard_files(name, fmt), "n": stop - start, "first_index": start})
            continue
        maps = np.empty((stop - start, size, size), dtype=np.float32)
        params = np.empty((stop - start, len(PARAMETERS)), dtype=np.float32)
        for lo in range(start, stop, batch):
            hi = min(lo + batch, stop)
            maps[lo - start : hi - start], params[lo - start : hi - start] = generate_maps(
                kind, range(lo, hi), seed, split, size, box_size, prior
            )
        files = _write_shard(folder, name, fmt, maps, params, np.arange(start, stop), meta)
        meta["shards"].append({"files": files, "n": stop - start, "first_index": start})
    complete = all((folder / f).exists() for shard in meta["shards"] for f in shard["files"].values())
    wrote = any(number % tasks == task for number in range(len(meta["shards"])))
    if complete and (wrote or not (folder / "meta.json").exists()):
        # last: it names complete shards (two tasks finishing together write the same text); a task without a
        # shard of its own never replaces a meta.json it finds
        atomic_write_text(folder / "meta.json", json.dumps(meta, indent=1))
    return {**meta, "complete": complete}


def split_files(
    out: Path, split: str, n: int, fmt: str, shard_size: int, share: tuple[int, int]
) -> list[Path]:
    """The files `write_split` with these settings writes: this share's shards and, when it has any, the split's
    meta.json (there already, a whole split is there: the task that writes the last shard writes it)."""
    task, tasks = share
    folder = out / split
    files = [
        folder / name
        for number in range(len(range(0, n, shard_size)))
        if number % tasks == task
        for name in _shard_files(f"shard-{number:05d}", fmt).values()
    ]
    return [*files, folder / "meta.json"] if files else []


def _shard_files(name: str, fmt: str) -> dict[str, str]:
    """The file names of shard `name` (what _write_shard returns), for shards another task writes."""
    if fmt == "hdf5":
        return {"maps": f"{name}.h5"}
    return {key: f"{name}-{key}.npy" for key in ("maps", "params", "index")}


def _write_shard(
    folder: Path,
    name: str,
    fmt: str,
    maps: np.ndarray,
    params: np.ndarray,
    index: np.ndarray,
    meta: dict[str, Any],
) -> dict[str, str]:
    """One shard under a temporary name, then renamed, so a reader never sees half a file."""
    if fmt == "hdf5":
        import h5py

        final = folder / f"{name}.h5"
        with atomic_path(final) as tmp, h5py.File(tmp, "w") as h5:
            h5.create_dataset("maps", data=maps, chunks=(1, *maps.shape[1:]))
            h5.create_dataset("params", data=params)
            h5.create_dataset("index", data=index)
            for key in ("kind", "split", "seed", "size", "box_size"):
                h5.attrs[key] = meta[key]
            h5.attrs["parameters"] = json.dumps(meta["parameters"])
        return {"maps": final.name}
    files = {}
    for key, array in (("maps", maps), ("params", params), ("index", index)):
        final = folder / f"{name}-{key}.npy"
        with atomic_path(final) as tmp, open(tmp, "wb") as fh:  # a file object: np.save adds no ".npy"
            np.save(fh, array)
        files[key] = final.name
    return files
