"""Muon networks and losses: ragged shapes, empty and huge events, permutation invariance, GP pairing, caps."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from hpctrain.workloads.muons.evaluation.evaluate import ks_statistic, wasserstein_1d
from hpctrain.workloads.muons.models.losses import gradient_penalty, pair_muons
from hpctrain.workloads.muons.models.networks import Critic, Generator, MultiplicityHead, event_index, pool


def make(counts: list[int], seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    c = torch.tensor(counts, dtype=torch.int64)
    prim = torch.randn(len(counts), 4, generator=g)
    muons = torch.randn(int(c.sum()), 3, generator=g)
    return prim, muons, c, event_index(c, int(c.sum()))


@pytest.fixture
def nets() -> tuple[Generator, Critic]:
    torch.manual_seed(0)
    return Generator(4, 3, 16, [8], cap=50), Critic(16, "max")


@pytest.mark.parametrize("counts", [[0, 3, 0, 5], [0, 0, 0], [2000, 0, 1], [1]])
def test_shapes_with_empty_and_huge_events(nets, counts):
    gen, critic = nets
    prim, _, c, idx = make(counts)
    fake, log_mu, log_r = gen(prim, c, idx)[:3]
    assert fake.shape == (sum(counts), 3) and log_mu.shape == log_r.shape == (len(counts),)
    scores = critic(fake, idx, prim, c)
    assert scores.shape == (len(counts),) and torch.isfinite(scores).all()


@pytest.mark.parametrize("how", ["max", "mean", "sum"])
def test_empty_events_pool_to_zero_without_a_sentinel(how):
    values = torch.tensor([[-5.0, -7.0], [-1.0, -2.0], [3.0, 4.0]])  # all negative in event 1: max stays < 0
    counts = torch.tensor([0, 2, 0, 1])
    pooled = pool(values, event_index(counts, 3), counts, how)
    assert torch.equal(pooled[0], torch.zeros(2)) and torch.equal(pooled[2], torch.zeros(2))
    expected = {"max": [-1.0, -2.0], "mean": [-3.0, -4.5], "sum": [-6.0, -9.0]}[how]
    assert pooled[1].tolist() == expected


def test_empty_event_score_ignores_other_events(nets):
    _, critic = nets
    prim, muons, c, idx = make([0, 4, 2])
    first = critic(muons, idx, prim, c)[0]
    second = critic(muons * 10 + 3, idx, prim, c)[0]
    assert torch.equal(first, second)


@pytest.mark.parametrize("how", ["max", "mean", "sum"])
def test_critic_is_permutation_invariant(how):
    torch.manual_seed(1)
    critic = Critic(16, how)
    prim, muons, c, idx = make([3, 0, 6, 1])
    scores = critic(muons, idx, prim, c)
    # shuffle muons inside each event
    perm = torch.cat(
        [torch.randperm(3), torch.tensor([], dtype=torch.int64), 3 + torch.randperm(6), torch.tensor([9])]
    )
    assert torch.allclose(critic(muons[perm], idx, prim, c), scores, atol=1e-6)
    # shuffle muons ACROSS the flat tensor, with their event index: still the same sets
    perm = torch.randperm(len(muons))
    assert torch.allclose(critic(muons[perm], idx[perm], prim, c), scores, atol=1e-6)


def test_pairs_take_the_ith_real_with_the_ith_fake_muon():
    pairs = pair_muons(torch.tensor([2, 0, 3, 1]), torch.tensor([1, 2, 4, 0]))
    assert pairs.per_event.tolist() == [1, 0, 3, 0]
    assert pairs.event.tolist() == [0, 2, 2, 2]
    assert pairs.real_index.tolist() == [0, 2, 3, 4]  # real offsets 0, 2, 2, 5
    assert pairs.fake_index.tolist() == [0, 3, 4, 5]  # fake offsets 0, 1, 3, 7


def test_same_counts_pairing_matches_the_general_one_and_subsamples():
    counts = torch.tensor([3, 0, 5, 2])
    fast = pair_muons(counts, counts, same_counts=True, real_total=10)
    slow = pair_muons(counts, counts)
    for name in ("real_index", "fake_index", "event", "per_event"):
        assert torch.equal(getattr(fast, name), getattr(slow, name))
    torch.manual_seed(0)
    few = pair_muons(counts, counts, max_pairs=4, same_counts=True, real_total=10)
    assert len(few.event) == 4 and int(few.per_event.sum()) == 4
    assert torch.equal(few.real_index, few.real_index.sort().values)
    assert torch.equal(few.event, fast.event[few.real_index])  # each kept pair keeps its event


def test_gradient_penalty_matches_a_per_event_loop(nets):
    _, critic = nets
    critic = critic.double()
    prim, real, c, _ = make([2, 0, 3])
    prim, real = prim.double(), real.double()
    fake_counts = torch.tensor([3, 1, 2])
    fake = torch.randn(6, 3, dtype=torch.float64)
    pairs = pair_muons(c, fake_counts)
    torch.manual_seed(5)
    gp = gradient_penalty(critic, real, fake, prim, c, fake_counts, pairs)
    torch.manual_seed(5)
    alpha = torch.rand(3, 1).double()
    # reference: one event at a time, pairing by position
    terms = []
    real_off, fake_off = [0, 2, 2], [0, 3, 4]
    for e, k in enumerate([2, 0, 2]):
        if k == 0:
            continue
        r = real[real_off[e] : real_off[e] + k]
        f = fake[fake_off[e] : fake_off[e] + k]
        x = (alpha[e] * r + (1 - alpha[e]) * f).requires_grad_(True)
        mult = alpha[e] * c[e] + (1 - alpha[e]) * fake_counts[e]
        s = critic(x, torch.zeros(k, dtype=torch.int64), prim[e : e + 1], torch.tensor([k]), mult)
        (g,) = torch.autograd.grad(s.sum(), x)
        terms.append((g.norm() - 1) ** 2)
    assert torch.allclose(gp, torch.stack(terms).mean(), rtol=1e-6)
    gp.backward()  # double backward into the critic's parameters (not the output bias: d score/d x lacks it)
    assert critic.point_muon.weight.grad is not None and critic.decision[0].weight.grad is not None


def test_multiplicity_likelihood_and_cap():
    torch.manual_seed(0)
    head = MultiplicityHead([8], cap=40)
    prim = torch.randn(5, 4)
    log_mu, log_r = head(prim)
    counts = torch.tensor([0, 1, 7, 30, 2])
    mu, r = log_mu.exp(), log_r.exp()
    reference = torch.distributions.NegativeBinomial(total_count=r, probs=mu / (mu + r)).log_prob(
        counts.float()
    )
    assert torch.allclose(-head.nll(log_mu, log_r, counts), reference, atol=1e-4)
    with torch.no_grad():  # force a huge predicted mean: samples must stop at the cap
        head.net[-1].bias.copy_(torch.tensor([14.0, 2.0]))
    drawn = head.sample(torch.randn(1000, 4))
    assert int(drawn.max()) == 40 and drawn.dtype == torch.int64
    assert int(head.sample(torch.randn(10, 4), cap=3).max()) <= 3
    gen = Generator(4, 3, 16, [8], cap=25)
    with torch.no_grad():
        gen.multiplicity.net[-1].bias.copy_(torch.tensor([14.0, 2.0]))
    counts, muons = gen.generate(torch.randn(50, 4))
    assert int(counts.max()) == 25 and muons.shape == (int(counts.sum()), 3)


def test_multiplicity_fluctuates_like_a_negative_binomial():
    torch.manual_seed(0)
    head = MultiplicityHead([8], cap=10_000)
    with torch.no_grad():
        for p in head.net.parameters():
            p.zero_()
        head.net[-1].bias.copy_(torch.tensor([math.log(50.0), math.log(5.0)]))  # mean 50, var 50 + 50^2/5
    drawn = head.sample(torch.zeros(20000, 4)).double()
    assert abs(drawn.mean().item() - 50) < 1.5
    assert abs(drawn.var().item() / 550 - 1) < 0.1


def test_distances():
    rng = np.random.default_rng(0)
    a, b = rng.normal(0, 1, 4000), rng.normal(0, 1, 4000)
    assert wasserstein_1d(a, b) < 0.06 and ks_statistic(a, b) < 0.04
    assert abs(wasserstein_1d(a, a + 0.5) - 0.5) < 1e-9
    assert abs(ks_statistic(np.array([0.0, 1.0]), np.array([2.0, 3.0])) - 1.0) < 1e-12
    assert math.isnan(wasserstein_1d(a, np.zeros(0)))
