"""The conditional spline flow of the muons (flow.py): an exact bijection with the right density, isotropic
azimuths, and a likelihood that learns a known spectrum."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from hpctrain.workloads.muons import physics
from hpctrain.workloads.muons.evaluation.quality import wasserstein_1d
from hpctrain.workloads.muons.models.flow import (
    TAIL,
    MuonFlow,
    _log_prob,
    _transform,
    first_of_events,
    leading_of_events,
    rq_spline,
    rq_spline_value,
)
from hpctrain.workloads.muons.models.losses import likelihood_losses
from hpctrain.workloads.muons.models.networks import Generator, event_index, gaussian_kl
from hpctrain.workloads.muons.truth import v1 as truth


def spline_params(n: int, bins: int, seed: int, spread: float = 1.5) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3 * bins - 1, generator=g, dtype=torch.float64) * spread


def test_spline_inverse_undoes_forward_and_log_slopes_are_exact():
    params = spline_params(4000, 8, 0)
    x = (
        torch.randn(4000, dtype=torch.float64, generator=torch.Generator().manual_seed(1)) * 3
    )  # some beyond TAIL
    y, log_slope = rq_spline(x, params)
    back, inverse_log_slope = rq_spline(y, params, inverse=True)
    assert torch.allclose(back, x, atol=1e-8)
    assert torch.allclose(log_slope + inverse_log_slope, torch.zeros_like(x), atol=1e-8)
    xg = x.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(rq_spline(xg, params)[0].sum(), xg)
    assert torch.allclose(grad.log(), log_slope, atol=1e-8)
    outside = x.abs() > TAIL
    assert outside.any() and torch.equal(y[outside], x[outside])  # identity tails
    assert (
        torch.diff(
            rq_spline(torch.linspace(-8, 8, 2001, dtype=torch.float64), params[:1].expand(2001, -1))[0]
        )
        > 0
    ).all()


def test_the_value_alone_equals_the_splines_value_bit_for_bit():
    """Sampling asks the spline for its value alone (no log-derivative): the same numbers, per row and per event,
    in and beyond the spline's range, with the same gradient."""
    x = torch.randn(3000, generator=torch.Generator().manual_seed(3)) * 3
    per_row = spline_params(3000, 16, 4).float().requires_grad_(True)
    assert torch.equal(rq_spline_value(x, per_row), rq_spline(x, per_row)[0])
    event = torch.sort(torch.randint(0, 40, (3000,), generator=torch.Generator().manual_seed(5))).values
    per_event = spline_params(40, 16, 6).float().requires_grad_(True)
    value, (full, _) = rq_spline_value(x, per_event, event), rq_spline(x, per_event, event=event)
    assert torch.equal(value, full) and (x.abs() > TAIL).any()
    (g_value,) = torch.autograd.grad(value.square().sum(), per_event)
    (g_full,) = torch.autograd.grad(full.square().sum(), per_event)
    assert torch.equal(g_value, g_full) and g_value.abs().sum() > 0


def test_density_integrates_to_one_and_matches_samples():
    params = spline_params(1, 8, 2).float()
    loc, log_scale = torch.tensor(0.4), torch.tensor(-0.3)
    grid = torch.linspace(-15, 15, 60001)
    density = _log_prob(
        grid, params.expand(len(grid), -1), loc.expand(len(grid)), log_scale.expand(len(grid))
    ).exp()
    step = float(grid[1] - grid[0])
    assert float(density.sum()) * step == pytest.approx(1.0, abs=2e-3)
    z = torch.randn(200_000, generator=torch.Generator().manual_seed(3))
    samples = _transform(z, params.expand(len(z), -1), loc.expand(len(z)), log_scale.expand(len(z)))
    # the samples' CDF at a few points equals the integrated density
    cdf = torch.cumsum(density, 0) * step
    for q in (-1.0, 0.0, 0.5, 1.5):
        at = int(torch.searchsorted(grid, torch.tensor(q)))
        assert float((samples <= q).float().mean()) == pytest.approx(float(cdf[at]), abs=5e-3)


def test_flow_samples_isotropic_bundles_and_scores_them():
    torch.manual_seed(0)
    flow = MuonFlow(context=6, hidden=16, bins=4)
    counts = torch.tensor([0, 3000, 1, 2000])
    index = event_index(counts, int(counts.sum()))
    context = torch.randn(4, 6)
    with torch.no_grad():
        muons = flow.sample(context, index, torch.randn(len(index), MuonFlow.NOISE))
    assert muons.shape == (5001, 3) and torch.isfinite(muons).all()
    phi = torch.atan2(muons[:, 2], muons[:, 1])
    assert abs(float(torch.cos(phi).mean())) < 0.05 and abs(float(torch.sin(phi).mean())) < 0.05
    with torch.no_grad():
        log_p = flow.log_prob(muons, context, index)
        moved_log_p = flow.log_prob(muons + torch.tensor([3.0, 0.0, 0.0]), context, index)
    assert log_p.shape == (5001,) and torch.isfinite(log_p).all()
    # an energy far from where the flow puts it is less likely than one where it does
    assert float(moved_log_p.mean()) < float(log_p.mean()) - 1.0


def test_the_spline_runs_in_fp32_under_bf16_autocast(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under bf16 autocast (the GPU presets) the networks run in bf16, the spline's arithmetic in fp32: in bf16
    its softmax, cumsum, divisions and logs made the default muon_flow's loss NaN after ~1100 updates (quality
    bench, CPU). Sampling and scoring agree with fp32 to the networks' bf16 rounding."""
    from hpctrain.workloads.muons.models import flow as flow_module

    seen: list[torch.dtype] = []
    for name in ("rq_spline", "rq_spline_value"):  # scoring's, sampling's
        real = getattr(flow_module, name)

        def recording(x: torch.Tensor, params: torch.Tensor, *args, real=real, **kwargs):  # type: ignore[no-untyped-def]
            seen.extend([x.dtype, params.dtype])
            return real(x, params, *args, **kwargs)

        monkeypatch.setattr(flow_module, name, recording)
    torch.manual_seed(0)
    flow = MuonFlow(context=6, hidden=16, bins=4)
    for net in (flow.event_net, flow.lateral_net):  # away from the identity start
        torch.nn.init.normal_(net[-1].weight, std=0.3)
    counts = torch.tensor([5, 300, 40])
    index = event_index(counts, int(counts.sum()))
    context, noise = torch.randn(3, 6), torch.randn(int(counts.sum()), MuonFlow.NOISE)
    with torch.no_grad():
        muons = flow.sample(context, index, noise)
        exact = flow.log_prob(muons, context, index)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            sampled = flow.sample(context, index, noise)
            scored = flow.log_prob(muons, context, index)
    assert seen and set(seen) == {torch.float32}
    assert sampled.dtype == scored.dtype == torch.float32
    assert torch.allclose(sampled, muons, rtol=0.02, atol=0.01) and torch.allclose(scored, exact, atol=0.05)


def test_likelihood_training_learns_the_truth_spectrum_given_the_primary():
    """Fit the flow head of a generator by likelihood on truth bundles: the muon energy and lateral distance
    of fresh primaries' bundles then match the truth far better than at the start."""
    rng = np.random.default_rng(5)
    primaries, muons, counts = truth.sample(800, rng)
    torch.manual_seed(0)
    gen = Generator(0, 1, 32, [16], cap=2000, head="flow", flow_bins=8)
    prim = physics.normalize_primaries(torch.as_tensor(primaries, dtype=torch.float32))
    norm = physics.normalize_muons(torch.as_tensor(muons, dtype=torch.float32))
    c = torch.as_tensor(counts)
    index = event_index(c, int(c.sum()))
    gen.fit_scalers(norm)
    none = prim.new_zeros((len(prim), 0))

    def sample_w1() -> tuple[float, float]:
        with torch.no_grad():
            fake = gen.scaler.inverse(gen(prim, c, index, none, torch.randn(len(index), 3)).muons)
        e_fake, e_true = fake[:, 0].numpy(), norm[:, 0].numpy()
        r_fake = np.log10(np.hypot(fake[:, 1].numpy(), fake[:, 2].numpy()))
        r_true = np.log10(np.hypot(norm[:, 1].numpy(), norm[:, 2].numpy()))
        return wasserstein_1d(e_fake, e_true), wasserstein_1d(r_fake, r_true)

    before = sample_w1()
    opt = torch.optim.Adam(gen.parameters(), lr=1e-2)
    for _ in range(120):
        out = gen(prim, c, index, none, none, real=norm, sample=False)
        loss = -out.real_log_prob.mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    after = sample_w1()
    assert after[0] < 0.05 and after[1] < 0.05, (before, after)
    assert after[0] < before[0] and after[1] < before[1]
    assert math.isfinite(float(loss.detach()))


def _shared_latent_events(events: int, per_event: int, seed: int) -> tuple[torch.Tensor, ...]:
    """Toy bundles whose muons share an event latent s: log energy 0.4 s + 0.15 e, log lateral distance
    -0.3 s + 0.1 e' (normalised units), uniform azimuth; (primaries, muons, counts). Every event has the
    same primary and N: nothing but the latent tells bundles apart (a network could learn s from distinct
    primaries, as a lookup of the training events)."""
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(events, generator=g).repeat_interleave(per_event)
    m = events * per_event
    log_e = -3.0 + 0.4 * s + 0.15 * torch.randn(m, generator=g)
    r = 10 ** (-1.5 - 0.3 * s + 0.1 * torch.randn(m, generator=g))
    phi = 2 * math.pi * torch.rand(m, generator=g)
    muons = torch.stack([log_e, r * torch.cos(phi), r * torch.sin(phi)], 1)
    return torch.tensor([[0.5, 0.2, -0.1, 0.3]]).repeat(events, 1), muons, torch.full((events,), per_event)


def _per_event_means(
    gen: Generator, prim: torch.Tensor, counts: torch.Tensor
) -> tuple[np.ndarray, np.ndarray]:
    """Per generated event: (mean log energy, mean log10 lateral distance)."""
    index = event_index(counts, int(counts.sum()))
    with torch.no_grad():
        fake = gen.scaler.inverse(gen(prim, counts, index).muons)
    log_r = torch.log10(torch.hypot(fake[:, 1], fake[:, 2]))
    n = counts.float()
    mean_e = torch.zeros(len(counts)).index_add(0, index, fake[:, 0]) / n
    mean_r = torch.zeros(len(counts)).index_add(0, index, log_r) / n
    return mean_e.numpy(), mean_r.numpy()


@pytest.mark.parametrize("encoder", [False, True])
def test_the_latent_encoder_lets_likelihood_learn_what_a_bundle_shares(encoder: bool):
    """Trained by likelihood with latents from the prior, the flow ignores the event latent: its bundles' mean
    log energies vary by little more than the 1/sqrt(N) noise of the muons' marginal (~0.09). With the encoder
    (negative ELBO) the same training learns the latent: the means spread towards the truth's 0.40."""
    prim, muons, counts = _shared_latent_events(400, 25, seed=3)
    index = event_index(counts, int(counts.sum()))
    torch.manual_seed(0)
    gen = Generator(4, 1, 32, [8], cap=100, head="flow", flow_bins=6, latent_encoder=encoder)
    gen.fit_scalers(muons)
    opt = torch.optim.Adam(gen.parameters(), lr=3e-3)
    for _ in range(100):
        _, loss = likelihood_losses(gen, prim, counts, index, muons, torch.randn(len(prim), 4))
        opt.zero_grad()
        loss.backward()
        opt.step()
    true_spread = float(np.std(muons[:, 0].reshape(-1, 25).mean(1).numpy()))
    spread = float(np.std(_per_event_means(gen, prim, counts)[0]))
    assert 0.37 < true_spread < 0.43
    if encoder:
        assert 0.25 < spread < 0.5, spread
    else:
        assert spread < 0.15, spread


def _away_from_identity(flow: MuonFlow, seed: int) -> None:
    """Random last layers: the flow is no longer a standard normal in every conditional."""
    g = torch.Generator().manual_seed(seed)
    for net in (flow.event_net, flow.lateral_net, flow.gap_net):
        assert net is not None
        with torch.no_grad():
            net[-1].weight.copy_(torch.randn(net[-1].weight.shape, generator=g) * 0.3)
            net[-1].bias.copy_(torch.randn(net[-1].bias.shape, generator=g) * 0.3)


def test_a_generated_bundle_leads_with_its_most_energetic_muon():
    """With `leading`, each generated event lists its leading muon first and every other muon under it; the
    leading muon of real events is found by energy (the first of equals), wherever the file put it."""
    torch.manual_seed(0)
    flow = MuonFlow(context=6, hidden=16, bins=4, leading=True)
    _away_from_identity(flow, 1)
    counts = torch.tensor([0, 300, 1, 2, 40, 0])
    index = event_index(counts, int(counts.sum()))
    with torch.no_grad():
        muons = flow.sample(torch.randn(6, 6), index, torch.randn(len(index), MuonFlow.NOISE))
    assert torch.isfinite(muons).all()
    first = first_of_events(index)
    top = torch.zeros(6).scatter_reduce(0, index, muons[:, 0], reduce="amax", include_self=False)
    assert torch.equal(muons[first, 0], top[counts > 0])
    energies = torch.tensor([1.0, 3.0, 3.0, 2.0, 5.0, -1.0])
    events = torch.tensor([0, 0, 0, 0, 1, 1])
    lead = leading_of_events(energies, events, 2)
    assert lead.tolist() == [False, True, False, False, True, False]


def test_the_leading_flow_is_a_normalised_density_of_the_muons_under_the_leader():
    """The other muons' density (the gap below the leading muon, with its Jacobian) and the lateral distance's
    integrate to 1 over the standardised (energy, log distance) plane below a fixed leading muon."""
    torch.manual_seed(0)
    flow = MuonFlow(context=6, hidden=16, bins=4, leading=True)
    _away_from_identity(flow, 2)
    with torch.no_grad():
        flow.gap_center.fill_(-0.5)
        flow.gap_scale.fill_(0.8)
    a_lead = 1.3
    gaps = torch.logspace(-5, 2.2, 900, dtype=torch.float64)  # a = a_lead + floor - gap
    a = (a_lead + 1e-3 - gaps).flip(0)
    b = torch.linspace(-14.0, 14.0, 700, dtype=torch.float64)
    aa, bb = torch.meshgrid(a, b, indexing="ij")
    # normalised muons at those standardised values (centre 0, scale 1): log10 E = a, r = 10^b on the x axis
    grid = torch.stack([aa.flatten(), 10.0 ** bb.flatten(), torch.zeros(aa.numel(), dtype=torch.float64)], 1)
    leader = torch.tensor([[a_lead, 1.0, 0.0]], dtype=torch.float64)
    muons = torch.cat([leader, grid]).float()
    flow.polar = lambda m: torch.stack([m[:, 0], torch.log10(torch.hypot(m[:, 1], m[:, 2]))], 1)  # type: ignore[method-assign]
    index = torch.zeros(len(muons), dtype=torch.int64)
    with torch.no_grad():
        density = flow.log_prob(muons, torch.randn(1, 6), index)[1:].double().exp().reshape(aa.shape)
    total = torch.trapezoid(torch.trapezoid(density, b, dim=1), a)
    assert float(total) == pytest.approx(1.0, abs=0.02)


def test_the_latent_prior_given_n_sets_where_generated_latents_come_from():
    """With a conditional prior, the KL is against it (checked against torch.distributions) and generated
    events draw their latent from it: a prior moved for large N moves what the decoder sees."""
    mean, log_var = torch.randn(5, 3), torch.randn(5, 3) * 0.3
    p_mean, p_log_var = torch.randn(5, 3), torch.randn(5, 3) * 0.3
    q = torch.distributions.Normal(mean, (0.5 * log_var).exp())
    p = torch.distributions.Normal(p_mean, (0.5 * p_log_var).exp())
    expected = torch.distributions.kl_divergence(q, p).sum(1)
    assert torch.allclose(gaussian_kl(mean, log_var, (p_mean, p_log_var)), expected, atol=1e-5)
    assert torch.allclose(
        gaussian_kl(mean, log_var, None),
        torch.distributions.kl_divergence(q, torch.distributions.Normal(0.0, 1.0)).sum(1),
        atol=1e-5,
    )
    gen = Generator(2, 1, 16, [8], cap=100, head="flow", flow_bins=4, latent_encoder=True, latent_prior=True)
    assert gen.prior is not None
    seen: list[torch.Tensor] = []
    gen.global_net.register_forward_hook(lambda _m, inputs, _o: seen.append(inputs[0][:, :2].clone()))
    prim = torch.zeros(2, 4)
    counts = torch.tensor([3, 3])
    index = event_index(counts, 6)
    z = torch.zeros(2, 2)
    with torch.no_grad():
        gen.prior.net[-1].bias.copy_(torch.tensor([2.0, -1.0, 0.0, 0.0]))  # mean (2, -1), variance 1
        gen(prim, counts, index, z, torch.randn(6, 3))
    assert torch.allclose(seen[-1], torch.tensor([[2.0, -1.0], [2.0, -1.0]]))


@pytest.mark.parametrize("leading", [False, True])
def test_a_leading_muon_with_a_harder_spectrum_is_learned(leading: bool):
    """Bundles of 6 muons, one of them from a harder spectrum: one density for every muon draws 0, 1 or more
    hard muons per bundle (a third of bundles have none), so the bundles' most energetic muon is off; the
    leading-muon flow learns it."""
    g = torch.Generator().manual_seed(4)
    events, per = 300, 6
    hard = -2.0 + 0.25 * torch.randn(events, 1, generator=g)
    soft = -3.5 + 0.3 * torch.randn(events, per - 1, generator=g)
    log_e = torch.cat([soft, hard], 1).flatten()  # the leader last: found by energy, not by place
    r = 10 ** (-1.5 + 0.2 * torch.randn(events * per, generator=g))
    phi = 2 * math.pi * torch.rand(events * per, generator=g)
    muons = torch.stack([log_e, r * torch.cos(phi), r * torch.sin(phi)], 1)
    prim, counts = torch.tensor([[0.5, 0.2, -0.1, 0.3]]).repeat(events, 1), torch.full((events,), per)
    index = event_index(counts, events * per)
    torch.manual_seed(0)
    gen = Generator(0, 1, 32, [8], cap=100, head="flow", flow_bins=8, leading=leading)
    gen.fit_scalers(muons, counts)
    opt = torch.optim.Adam(gen.parameters(), lr=1e-2)
    none = prim.new_zeros((events, 0))
    for _ in range(100):
        _, loss = likelihood_losses(gen, prim, counts, index, muons, none)
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        fake = gen.scaler.inverse(gen(prim, counts, index).muons)
    top_fake = torch.zeros(events).scatter_reduce(0, index, fake[:, 0], reduce="amax", include_self=False)
    top_true = hard.squeeze(1)
    w1 = wasserstein_1d(top_fake.numpy(), top_true.numpy())
    if leading:
        assert w1 < 0.1, w1
    else:
        assert w1 > 0.2, w1
