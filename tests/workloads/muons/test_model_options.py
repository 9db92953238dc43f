"""The critic's per-muon score (model.muon_score): every muon of the batch counts equally in the mean score."""

from __future__ import annotations

import torch

from hpctrain.workloads.muons.models.networks import Critic, event_index


def test_muon_score_weighs_every_muon_equally() -> None:
    torch.manual_seed(0)
    critic = Critic(16, "mean", muon_score=True)
    counts = torch.tensor([1, 9, 0, 2])  # (B,) very unequal events, one empty
    total = int(counts.sum())
    index = event_index(counts, total)
    muons = torch.randn(total, 3, requires_grad=True)
    primaries = torch.randn(4, 4)
    critic(muons, index, primaries, counts).mean().backward()
    assert muons.grad is not None
    # through the muon head alone, d mean(scores) / d muon is the same function for every muon (weight 1/M):
    # compare with the plain critic whose pooled-mean path gives a muon of an event of N muons 1/(B N)
    plain = Critic(16, "mean", muon_score=False)
    plain.load_state_dict({k: v for k, v in critic.state_dict().items() if not k.startswith("muon_head")})
    same = muons.detach().clone().requires_grad_(True)
    plain(same, index, primaries, counts).mean().backward()
    head_grad = muons.grad - same.grad  # (M, 3) the muon head's share
    features = critic.point_net(
        critic.point_muon(muons) + critic.point_primary(primaries).index_select(0, index)
    )
    expected = torch.autograd.grad(critic.muon_head(features).sum() / total, muons)[0]
    assert torch.allclose(head_grad, expected, atol=1e-6)
    empty = Critic(16, "max", muon_score=True)(
        torch.zeros(0, 3), index[:0], primaries, torch.zeros(4, dtype=torch.long)
    )
    assert empty.shape == (4,) and torch.isfinite(empty).all()


def test_isotropic_generator_turns_each_muon_and_keeps_energy_and_radius() -> None:
    from hpctrain.workloads.muons.models.networks import Generator

    torch.manual_seed(1)
    plain = Generator(4, 3, 16, [8], cap=50)
    iso = Generator(4, 3, 16, [8], cap=50, isotropic=True)
    iso.load_state_dict(plain.state_dict())
    iso.scaler.scale.fill_(0.01)  # a non-trivial scaler: the turn happens in normalised units
    plain.scaler.scale.fill_(0.01)
    counts = torch.tensor([40, 60])
    index = event_index(counts, 100)
    primaries = torch.randn(2, 4)
    z_global, z_local = iso.noise(2, 100, torch.device("cpu"))
    assert z_local.shape == (100, 4)  # one more column: the azimuth, never seen by the networks
    a = plain.scaler.inverse(plain(primaries, counts, index, z_global, z_local[:, :3])[0])
    b = iso.scaler.inverse(iso(primaries, counts, index, z_global, z_local)[0])
    assert torch.allclose(a[:, 0], b[:, 0], atol=1e-5)  # energy untouched
    assert torch.allclose(a[:, 1:].norm(dim=1), b[:, 1:].norm(dim=1), rtol=1e-3, atol=1e-6)  # radius kept
    angle = torch.atan2(b[:, 2], b[:, 1])
    assert angle.std() > 1.5  # spread around the axis (uniform: std pi / sqrt(3) ~ 1.8)
