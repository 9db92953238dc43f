"""The critic's per-muon score (model.muon_score): every muon of the batch counts equally in the mean score."""

from __future__ import annotations

import torch

from hpctrain.workloads.muons.networks import Critic, event_index


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
