"""The muon judge's classifier two-sample test, its features, FPD/KPD, and truth v2 with its file version."""

from __future__ import annotations

import numpy as np
import pytest

from hpctrain.errors import UserError
from hpctrain.workloads.muons.data_verbs import synthetic_events
from hpctrain.workloads.muons.evaluation import event_features, two_sample
from hpctrain.workloads.muons.events import layouts
from hpctrain.workloads.muons.truth import v1 as truth
from hpctrain.workloads.muons.truth import v2 as truth_v2
from hpctrain.workloads.muons.truth import versions as truth_versions


def test_auc_matches_known_cases() -> None:
    labels = np.r_[np.ones(3), np.zeros(3)]
    assert two_sample.auc(np.array([4.0, 5, 6, 1, 2, 3]), labels) == 1.0
    assert two_sample.auc(np.array([1.0, 2, 3, 4, 5, 6]), labels) == 0.0
    assert two_sample.auc(np.ones(6), labels) == 0.5


def test_frechet_distance_of_gaussians_matches_the_formula() -> None:
    rng = np.random.default_rng(0)
    a = rng.normal(0.0, 1.0, (200_000, 2))
    b = rng.normal([1.0, 0.0], [2.0, 1.0], (200_000, 2))
    # |dmu|^2 + sum (sigma_a - sigma_b)^2 for diagonal covariances: 1 + (1 - 2)^2 = 2
    assert abs(two_sample.frechet_distance(a, b) - 2.0) < 0.05
    assert abs(two_sample.frechet_distance(a, a)) < 1e-9


def test_kernel_distance_is_near_zero_for_one_distribution_and_not_for_two() -> None:
    rng = np.random.default_rng(1)
    a, b = rng.normal(size=(4000, 3)), rng.normal(size=(4000, 3))
    assert abs(two_sample.kernel_distance(a, b)) < 0.02
    assert two_sample.kernel_distance(a, b + 0.5) > 0.1


def test_event_features_of_a_known_event() -> None:
    muons = np.array([[100.0, 3.0, 4.0], [10.0, -3.0, -4.0], [1.0, 0.0, 1.0]])
    f = event_features.event_features(muons, np.array([0, 3]), np.random.default_rng(0))
    name = dict(zip(event_features.NAMES, range(len(event_features.NAMES))))
    assert np.all(f[0, 1:] == event_features.EMPTY) or f[0, name["corr_loge_logr"]] == 0.0
    assert np.isclose(f[1, name["log10_n1"]], np.log10(4))
    assert np.isclose(f[1, name["leading_log10_e"]], 2.0)
    assert np.isclose(f[1, name["leading_fraction"]], 100 / 111)
    assert np.isclose(f[1, name["log10_e_q50"]], 1.0)
    assert np.isclose(f[1, name["pair_log10_d_min"]], np.log10(np.hypot(3, 3)))


def test_truth_v2_has_event_wide_structure() -> None:
    rng = np.random.default_rng(2)
    prim = truth.sample_primaries(4000, rng)
    prim[:, 0] = 1e7
    muons, counts = truth_v2.sample_bundles(prim, rng)
    ev = np.repeat(np.arange(len(counts)), counts)
    mean_loge = np.bincount(ev, np.log10(muons[:, 0]), len(counts)) / np.maximum(counts, 1)
    deep = prim[:, 3] / np.cos(prim[:, 1]) > 4000
    shallow = prim[:, 3] / np.cos(prim[:, 1]) < 1500
    ok = counts >= 5
    # the spectrum at depth hardens with slant depth (v1's does not depend on it)
    assert np.median(mean_loge[ok & deep]) > np.median(mean_loge[ok & shallow]) + 0.1
    assert np.all(muons[:, 0] >= 1.0)
    # heavier nuclei fluctuate less
    assert truth_v2.fluctuation_sigma(np.array([56]))[0] < truth_v2.fluctuation_sigma(np.array([1]))[0]


def test_files_record_the_truth_version(tmp_path) -> None:
    for layout in ("parquet", "hdf5"):
        path = str(tmp_path / f"v2.{'h5' if layout == 'hdf5' else 'parquet'}")
        data = synthetic_events(50, 0, 0, "v2")
        layouts.write_events(path, data, layout, 100, {truth_versions.TRUTH_KEY: "v2"})
        assert truth_versions.file_version(path) == "v2"
        old = str(tmp_path / f"old.{'h5' if layout == 'hdf5' else 'parquet'}")
        layouts.write_events(old, data, layout, 100)
        assert truth_versions.file_version(old) == "v1"
        assert len(layouts.read_all(path)[1]) == 50


def test_a_model_is_judged_against_the_truth_its_training_files_record(tmp_path) -> None:
    """`hpctrain evaluate RUN` picks the truth from the training files (data.paths): v2 files give v2, files
    without a version v1; files of both versions are one line asking for --truth; none readable here (remote,
    moved away) is v1, saying it was assumed."""
    data = synthetic_events(20, 0, 0, "v2")
    (tmp_path / "v2").mkdir()
    (tmp_path / "old").mkdir()
    for i in range(2):
        layouts.write_events(
            str(tmp_path / "v2" / f"f{i}.parquet"), data, "parquet", 100, {truth_versions.TRUTH_KEY: "v2"}
        )
    layouts.write_events(str(tmp_path / "old" / "f.h5"), data, "hdf5", 100)
    assert truth_versions.training_version([str(tmp_path / "v2")]) == ("v2", "the training files' truth")
    assert truth_versions.training_version([str(tmp_path / "v2" / "*.parquet")])[0] == "v2"
    assert truth_versions.training_version([f"file://{tmp_path / 'old'}"])[0] == "v1"
    with pytest.raises(UserError, match=r"different truth versions: v1 \(.*f\.h5\), v2 .*--truth$"):
        truth_versions.training_version([str(tmp_path / "old"), str(tmp_path / "v2")])
    version, why = truth_versions.training_version(["pelican://127.0.0.1:1/x", str(tmp_path / "gone")])
    assert version == "v1" and why.startswith("assumed")
    with pytest.raises(UserError, match="unknown truth version 'v3'; choose from v1, v2"):
        truth_versions.get("v3")


def _shuffled(
    bundle: tuple[np.ndarray, np.ndarray], rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    muons, counts = bundle
    ev = np.repeat(np.arange(len(counts)), counts)
    order = np.lexsort((rng.random(len(ev)), ev))
    out = muons.copy()
    out[:, 1:] = muons[order, 1:]
    return out, counts


def test_judge_accepts_a_fresh_draw_and_rejects_shuffled_positions() -> None:
    rng = np.random.default_rng(3)
    prim = truth.sample_primaries(3000, rng)
    true, fresh, null = (truth.sample_bundles(prim, rng) for _ in range(3))
    good = two_sample.judge(prim, true, fresh, [null], folds=3)
    assert good.accepted("all")
    bad = two_sample.judge(prim, true, _shuffled(true, rng), [null], folds=3)
    assert not bad.accepted("all")
    assert bad.auc["E8-9"] > 0.8


def test_judge_rejects_both_stand_ins_on_both_truths() -> None:
    for version in ("v1", "v2"):
        sampler = truth_versions.get(version)
        rng = np.random.default_rng(3)
        prim = truth.sample_primaries(3000, rng)
        true, fresh, null = (sampler.sample_bundles(prim, rng) for _ in range(3))
        blind = prim.copy()
        blind[:, 2:] = truth.sample_primaries(len(prim), rng)[:, 2:]  # mass and depth from the prior
        assert two_sample.judge(prim, true, fresh, [null], folds=3).accepted("all"), version
        for stand_in in (_shuffled(true, rng), sampler.sample_bundles(blind, rng)):
            assert not two_sample.judge(prim, true, stand_in, [null], folds=3).accepted("all"), version


def test_a_few_pairs_give_an_uninformative_judgement_not_an_error() -> None:
    """Held-out evaluation takes from 2 events on: one or two pairs cannot fill the folds or the covariances."""
    rng = np.random.default_rng(4)
    for n in (1, 2, 3):
        prim = truth.sample_primaries(n, rng)
        judged = two_sample.judge(
            prim, truth.sample_bundles(prim, rng), truth.sample_bundles(prim, rng), swaps=1
        )
        assert judged.auc["all"] == 0.5 and judged.accepted("all") and len(judged.null) == 1
    assert np.isnan(two_sample.frechet_distance(np.zeros((1, 2)), np.zeros((5, 2))))
