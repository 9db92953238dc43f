"""The field generators: requested power spectra, the documented transforms, split disjointness, shards."""

from __future__ import annotations

import argparse
import hashlib

import numpy as np
import pytest

from hpctrain.workloads.fields.data_verbs import generate, generate_args
from hpctrain.workloads.fields.dataset import GeneratedFields, ShardFields
from hpctrain.workloads.fields.generate import (
    R8,
    draw,
    fields_from_noise,
    generate_maps,
    measured_power_spectrum,
    power_spectrum,
    tophat_window,
    wavenumbers,
)

PRIOR = [(0.1, 0.5), (0.6, 1.0)]
SIZE, BOX, MAPS = 64, 1000.0, 48


def binned_theory(omega_m: float, sigma_8: float, bins: int = 16) -> np.ndarray:
    """The requested P averaged over the very modes that fall in each measurement bin."""
    kx, ky = wavenumbers(SIZE, BOX)
    k = np.sqrt(kx**2 + ky**2)
    theory = power_spectrum(omega_m, sigma_8, k)[None]  # (1, N, N//2+1)
    # Measuring a "map" whose |FFT|^2 is the theory gives the mode-weighted bin average; feed it through the
    # same estimator by building a real map with those amplitudes and unit phases is not possible, so re-bin:
    edges = np.linspace(2 * np.pi / BOX, np.pi * SIZE / BOX, bins + 1)
    weight = np.full(SIZE // 2 + 1, 2.0)
    weight[0] = weight[-1] = 1.0
    weight = np.broadcast_to(weight, k.shape).ravel()
    which = np.digitize(k.ravel(), edges) - 1
    keep = (which >= 0) & (which < bins)
    num = np.bincount(which[keep], (theory.ravel() * weight)[keep], minlength=bins)
    return num / np.bincount(which[keep], weight[keep], minlength=bins)


def same_params(omega_m: float, sigma_8: float, seed: int = 3) -> tuple[np.ndarray, np.ndarray]:
    params = np.tile([[omega_m, sigma_8]], (MAPS, 1))
    _, noise = draw(seed, "train", range(MAPS), SIZE, PRIOR)
    return params, noise


def assert_spectrum(maps: np.ndarray, omega_m: float, sigma_8: float) -> None:
    _, measured, modes = measured_power_spectrum(maps, BOX)
    expected = binned_theory(omega_m, sigma_8)
    # Each complex mode (counted twice in `modes`) has an exponential |delta_k|^2: relative error 1/sqrt(n).
    sigma = 1 / np.sqrt(modes / 2 * len(maps))
    ratio = measured.mean(0) / expected
    assert np.all(np.abs(ratio - 1) < 5 * sigma), (ratio, sigma)
    assert abs(np.average(ratio, weights=modes) - 1) < 0.03


def test_sigma_8_is_the_normalisation():
    log_k = np.linspace(np.log(1e-6), np.log(1e3), 20_000)  # finer and wider than the generator's own grid
    k = np.exp(log_k)
    for omega_m, sigma_8 in ((0.15, 0.7), (0.4, 0.95)):
        integrand = k**2 * power_spectrum(omega_m, sigma_8, k) * tophat_window(k * R8) ** 2 / (2 * np.pi)
        assert np.trapezoid(integrand, log_k) == pytest.approx(sigma_8**2, rel=1e-5)
    # The shape moves with Omega_m: more large-scale power for a lower matter density at fixed sigma_8.
    assert power_spectrum(0.1, 0.8, 0.01) > 3 * power_spectrum(0.5, 0.8, 0.01)


@pytest.mark.parametrize(("omega_m", "sigma_8"), [(0.15, 0.7), (0.45, 0.95)])
def test_gaussian_maps_have_the_requested_power_spectrum(omega_m: float, sigma_8: float):
    params, noise = same_params(omega_m, sigma_8)
    maps = fields_from_noise("gaussian", noise, params, BOX)
    assert maps.shape == (MAPS, SIZE, SIZE) and maps.dtype == np.float32
    assert_spectrum(maps, omega_m, sigma_8)
    assert abs(maps.mean()) < 1e-5  # k = 0 is zero


def test_lognormal_is_the_exponential_of_the_same_gaussian_field():
    params, noise = same_params(0.3, 0.8)
    gauss = fields_from_noise("gaussian", noise, params, BOX).astype(np.float64)
    logn = fields_from_noise("lognormal", noise, params, BOX).astype(np.float64)
    assert logn.min() > -1
    assert abs(logn.mean()) < 0.05  # mean density contrast 0 by construction (exp(g - var/2))
    shift = gauss - np.log1p(logn)  # = var(g)/2, the same constant in every pixel of a map
    assert np.allclose(shift, shift[:, :1, :1], atol=1e-4)
    assert np.allclose(shift[:, 0, 0], gauss.var(axis=(1, 2)) / 2, rtol=0.3)
    assert_spectrum(np.log1p(logn) - np.log1p(logn).mean(axis=(1, 2), keepdims=True), 0.3, 0.8)


def test_lpt_density_follows_the_linear_field_on_large_scales():
    # At a small amplitude the displaced particles trace the linear field: the spectrum and the phases agree
    # at low k (the cloud-in-cell kernel and the second order matter only on small scales).
    params, noise = same_params(0.3, 0.05)
    lpt = fields_from_noise("lpt", noise, params, BOX)
    gauss = fields_from_noise("gaussian", noise, params, BOX)
    _, measured, _ = measured_power_spectrum(lpt, BOX)
    ratio = measured.mean(0)[:6] / binned_theory(0.3, 0.05)[:6]
    assert np.all(np.abs(ratio - 1) < 0.2), ratio
    kx, ky = wavenumbers(SIZE, BOX)
    k = np.sqrt(kx**2 + ky**2)
    low = (k > 0) & (k < 0.08)  # scales of 40+ pixels (the lattice's CIC deposit is not smooth below a pixel)
    a, b = np.fft.rfft2(lpt)[:, low], np.fft.rfft2(gauss)[:, low]
    assert np.real(a * b.conj()).sum() / np.sqrt((abs(a) ** 2).sum() * (abs(b) ** 2).sum()) > 0.95
    # At sigma_8 = 0.8 the particles cluster: a density contrast >= -1 with a long positive tail.
    params, noise = same_params(0.3, 0.8)
    strong = fields_from_noise("lpt", noise, params, BOX)
    assert strong.min() >= -1 - 1e-6 and strong.max() > 3
    assert abs(strong.mean()) < 1e-4  # particles are conserved


def test_maps_depend_only_on_seed_split_and_index():
    one, p_one = generate_maps("gaussian", [5, 9], 7, "val", 32, BOX, PRIOR)
    many, p_many = generate_maps("gaussian", range(12), 7, "val", 32, BOX, PRIOR)
    assert np.array_equal(one, many[[5, 9]]) and np.array_equal(p_one, p_many[[5, 9]])
    assert np.all(
        (p_many[:, 0] >= 0.1) & (p_many[:, 0] <= 0.5) & (p_many[:, 1] >= 0.6) & (p_many[:, 1] <= 1.0)
    )


def test_splits_never_overlap():
    digests: dict[str, set[str]] = {}
    params = {}
    for split in ("train", "val", "test"):
        maps, params[split] = generate_maps("gaussian", range(200), 11, split, 16, BOX, PRIOR)
        digests[split] = {hashlib.sha256(m.tobytes()).hexdigest() for m in maps}
        assert len(digests[split]) == 200  # no repeats within a split either
    assert not digests["train"] & digests["val"]
    assert not digests["train"] & digests["test"]
    assert not digests["val"] & digests["test"]
    assert not np.isin(params["train"][:, 0], params["val"][:, 0]).any()


@pytest.mark.parametrize("fmt", ["hdf5", "npy"])
def test_generate_writes_shards_that_read_back_as_the_on_the_fly_maps(tmp_path, fmt: str):
    parser = argparse.ArgumentParser()
    generate_args(parser)
    args = parser.parse_args(
        [
            "--out",
            str(tmp_path),
            "--kind-of-field",
            "lognormal",
            "--maps",
            "10",
            "--n-val",
            "3",
            "--n-test",
            "0",
            "--size",
            "16",
            "--seed",
            "4",
            "--format",
            fmt,
            "--shard-size",
            "4",
        ]
    )
    assert generate(args) == 0
    assert not (tmp_path / "test").exists()
    on_disk = ShardFields(tmp_path / "train")
    assert len(on_disk) == 10 and len(on_disk.shards) == 3 and on_disk.prior == PRIOR
    fly = GeneratedFields("lognormal", "train", 10, 4, 16, BOX, PRIOR)
    indices = [9, 0, 4, 3]
    disk_maps, disk_params = on_disk.__getitems__(indices)
    fly_maps, fly_params = fly.__getitems__(indices)
    assert disk_maps.shape == (4, 1, 16, 16) and disk_params.shape == (4, 2)
    assert np.array_equal(disk_maps.numpy(), fly_maps.numpy())
    assert np.array_equal(disk_params.numpy(), fly_params.numpy())
    assert len(ShardFields(tmp_path / "val")) == 3
    with pytest.raises(ValueError, match="even"):  # UserError: one line, exit 2 from the CLI
        generate(parser.parse_args(["--out", str(tmp_path / "x"), "--size", "15"]))


def test_the_data_verb_generates_and_inspects(tmp_path):
    from tests.conftest import hpctrain

    made = hpctrain(
        "data",
        "generate",
        "--kind",
        "fields",
        "--out",
        "maps",
        "--kind-of-field",
        "lpt",
        "--n",
        "6",
        "--n-val",
        "2",
        "--n-test",
        "2",
        "--size",
        "16",
        "--format",
        "npy",
        cwd=tmp_path,
    )
    assert made.code == 0, made.err
    assert "train: 6 lpt maps 16x16" in made.out
    assert sorted(p.name for p in (tmp_path / "maps").iterdir()) == ["test", "train", "val"]
    shown = hpctrain("data", "inspect", "--kind", "fields", "maps", "--events", "2", cwd=tmp_path)
    assert shown.code == 0, shown.err
    assert shown.out.count("  map ") == 6 and "6 lpt maps" in shown.out  # 2 maps from each of 3 splits
    bad = hpctrain("data", "generate", "--kind", "fields", "--out", "x", "--size", "15", cwd=tmp_path)
    assert bad.code == 2 and "--size=15" in bad.err
