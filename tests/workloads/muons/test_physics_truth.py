from __future__ import annotations

import numpy as np
import torch

from hpctrain.workloads.muons import physics
from hpctrain.workloads.muons.truth import v1 as truth


def test_normalisation_inverse() -> None:
    rng = np.random.default_rng(0)
    prims, muons, _ = truth.sample(200, rng)
    p = torch.from_numpy(prims)
    m = torch.from_numpy(muons)
    norm = physics.normalize_primaries(p)
    assert torch.allclose(norm[:, 0], torch.log10(p[:, 0] / 1e6)) and torch.allclose(
        norm[:, 3], p[:, 3] / 1000
    )
    torch.testing.assert_close(physics.denormalize_primaries(norm), p)
    torch.testing.assert_close(physics.denormalize_muons(physics.normalize_muons(m)), m)


def test_bad_events_and_guards() -> None:
    prims = np.array(
        [
            [1e6, 0.1, 0.94, 1500],
            [0.0, 0.1, 0.94, 1500],
            [1e6, np.nan, 0.94, 1500],
            [1e6, 0.1, -1.0, 1500],
            [1e6, 0.1, 0.94, 1500],
        ],
        np.float32,
    )
    muons = np.array([[10.0, 1, 1], [np.inf, 0, 0], [5.0, np.nan, 0]], np.float32)
    offsets = np.array([0, 1, 1, 1, 1, 3])
    assert physics.bad_events(prims, muons, offsets).tolist() == [False, True, True, True, True]
    # even unchecked values never become -inf or NaN through the logarithms
    assert torch.isfinite(physics.normalize_primaries(prims[:2])[:, [0, 2]]).all()


def test_truth_is_deterministic_and_has_a_tail() -> None:
    a = truth.sample(500, np.random.default_rng(4))
    b = truth.sample(500, np.random.default_rng(4))
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    prims, muons, counts = a
    assert prims.shape == (500, 4) and muons.shape == (counts.sum(), 3)
    assert (prims[:, 0] >= truth.E_MIN).all() and (prims[:, 0] <= truth.E_MAX).all()
    assert set(np.unique(prims[:, 2])) <= {v[1] for v in truth.NUCLEI.values()}
    assert (muons[:, 0] > 0).all() and np.isfinite(muons).all()
    big = truth.sample_counts(
        truth.sample_primaries(300_000, np.random.default_rng(1)), np.random.default_rng(2)
    )
    assert big.max() > 10_000 and 0.2 < (big == 0).mean() < 0.6
