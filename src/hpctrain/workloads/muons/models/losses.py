"""Wasserstein losses, critic-score normalisation and the gradient penalty on ragged muon sets.

The penalty interpolates REAL and FAKE muons paired inside each event (the i-th real with the i-th fake muon,
k = min(n_real, n_fake) pairs), with one alpha per event, and asks the gradient of each event's score with
respect to its interpolated muons to have norm 1.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from hpctrain.workloads.muons.models.networks import MultiplicityHead, segment_sum


def normalize_scores(scores: torch.Tensor, how: str, clamp: float) -> torch.Tensor:
    """(B,) critic scores after the configured normalisation (none | sqrt_batch_clamp | tanh)."""
    if how == "none":
        return scores
    if how == "sqrt_batch_clamp":
        # the original README's version: divide by sqrt(batch) and clamp (hit from the start there: see notes)
        return (scores / math.sqrt(max(scores.shape[0], 1))).clamp(-clamp, clamp)
    if how == "tanh":
        return clamp * torch.tanh(scores / clamp)
    raise ValueError(f"model.critic_output={how!r}: choose none, sqrt_batch_clamp or tanh")


def critic_loss(real: torch.Tensor, fake: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss = E[fake] - E[real], Wasserstein estimate E[real] - E[fake]) from (B,) scores."""
    distance = real.mean() - fake.mean()
    return -distance, distance


def generator_loss(fake: torch.Tensor) -> torch.Tensor:
    return -fake.mean()


@dataclass
class Pairs:
    """Muon pairs for the penalty: real_index, fake_index, event (P,) each; per_event (B,) pairs per event."""

    real_index: torch.Tensor
    fake_index: torch.Tensor
    event: torch.Tensor
    per_event: torch.Tensor


def pair_muons(
    real_counts: torch.Tensor,
    fake_counts: torch.Tensor,
    max_pairs: int = 0,
    same_counts: bool = False,
    real_total: int | None = None,
    generator: torch.Generator | None = None,
) -> Pairs:
    """Pair the i-th real with the i-th fake muon of each event; keep at most `max_pairs` random pairs.

    With `same_counts` (fake events have the real multiplicities) the pairs are the muons' own positions and
    `real_total` (known on the host) sizes everything: no GPU->CPU synchronisation. Otherwise the number of
    pairs is read once from the device."""
    b = real_counts.shape[0]
    device = real_counts.device
    if same_counts:
        assert real_total is not None, "same_counts needs real_total"
        total = real_total
        per_event = real_counts
        event = torch.repeat_interleave(torch.arange(b, device=device), per_event, output_size=total)
        real_index = fake_index = torch.arange(total, device=device)
    else:
        per_event = torch.minimum(real_counts, fake_counts)
        total = int(per_event.sum())
        event = torch.repeat_interleave(torch.arange(b, device=device), per_event, output_size=total)
        first = torch.cumsum(per_event, 0) - per_event  # (B,) first pair of each event
        rank = torch.arange(total, device=device) - first[event]  # (P,) position inside the event
        real_index = (torch.cumsum(real_counts, 0) - real_counts)[event] + rank
        fake_index = (torch.cumsum(fake_counts, 0) - fake_counts)[event] + rank
    if max_pairs and total > max_pairs:
        # sorted: events stay grouped
        keep = torch.randperm(total, device=device, generator=generator)[:max_pairs].sort().values
        real_index, fake_index, event = real_index[keep], fake_index[keep], event[keep]
        per_event = torch.zeros(b, dtype=torch.int64, device=device).index_add(
            0, event, torch.ones_like(event)
        )
    return Pairs(real_index, fake_index, event, per_event)


def gradient_penalty(
    critic: torch.nn.Module,
    real_muons: torch.Tensor,
    fake_muons: torch.Tensor,
    primaries: torch.Tensor,
    real_counts: torch.Tensor,
    fake_counts: torch.Tensor,
    pairs: Pairs,
    score_norm: str = "none",
    clamp: float = 1000.0,
    generator: torch.Generator | None = None,
    penalty: Callable[..., torch.Tensor] | None = None,
) -> torch.Tensor:
    """Mean over events with pairs of (||d score / d interpolated muons|| - 1)^2 (a scalar with graph).

    `penalty` computes it from the interpolated muons: `penalty_of` (double backward, eager) by default, or
    a compiled `functional_penalty`; the random draws stay here, outside any compiled code."""
    b = primaries.shape[0]
    # one per event
    alpha = torch.rand(b, 1, device=primaries.device, generator=generator).to(real_muons.dtype)
    a = alpha[pairs.event]  # (P, 1)
    mixed = a * real_muons[pairs.real_index].detach() + (1 - a) * fake_muons[pairs.fake_index].detach()
    # the multiplicity the critic sees is interpolated too; pooling runs over the kept pairs
    multiplicity = alpha.squeeze(1) * real_counts.to(alpha.dtype) + (1 - alpha.squeeze(1)) * fake_counts.to(
        alpha.dtype
    )
    run = penalty_of if penalty is None else penalty
    return run(critic, mixed, pairs.event, primaries, pairs.per_event, multiplicity, score_norm, clamp)


def penalty_of(
    critic: torch.nn.Module,
    mixed: torch.Tensor,
    event: torch.Tensor,
    primaries: torch.Tensor,
    per_event: torch.Tensor,
    multiplicity: torch.Tensor,
    score_norm: str,
    clamp: float,
    functional: bool = False,
) -> torch.Tensor:
    """The penalty from the interpolated muons `mixed` (P, 3). By default the input gradient comes from
    autograd.grad with create_graph (double backward: eager only, a compiled critic's backward cannot be
    differentiated again). `functional`: from torch.func.grad, whose gradient is ordinary ops in a traced graph,
    so torch.compile compiles the whole penalty (forward, input gradient and the backward to the weights)."""

    def total(x: torch.Tensor) -> torch.Tensor:
        scores = critic(x, event, primaries, per_event, multiplicity)
        return normalize_scores(scores, score_norm, clamp).sum()

    if functional:
        grad = torch.func.grad(total)(mixed.detach())  # (P, 3)
    else:
        mixed = mixed.detach().requires_grad_(True)
        (grad,) = torch.autograd.grad(total(mixed), mixed, create_graph=True)  # (P, 3)
    return _penalty(grad, event, per_event)


# what a compiled critic's penalty goes through (the task compiles it once)
functional_penalty = functools.partial(penalty_of, functional=True)


def _penalty(grad: torch.Tensor, event: torch.Tensor, per_event: torch.Tensor) -> torch.Tensor:
    grad = torch.nan_to_num(grad)
    b = per_event.shape[0]
    squared = segment_sum(grad.pow(2).sum(1, keepdim=True), event, b).squeeze(1)  # (B,)
    norm = torch.sqrt(squared + 1e-12)
    has = (per_event > 0).to(norm.dtype)
    return ((norm - 1.0).pow(2) * has).sum() / has.sum().clamp_min(1.0)


def likelihood_losses(
    generator: torch.nn.Module,
    primaries: torch.Tensor,
    counts: torch.Tensor,
    index: torch.Tensor,
    muons: torch.Tensor,
    z_global: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(NB NLL per event, real muons' NLL per muon under the flow head), each a mean over the batch, from one
    call of the (possibly DDP-wrapped) generator that generates no muons. muons (M, 3) normalised, index (M,)
    their events, z_global (B, latent_global)."""
    no_muons = z_global.new_zeros((0, 3))
    out = generator(primaries, counts, index, z_global, no_muons, real=muons, sample=False)
    mult = MultiplicityHead.nll(out.log_mu.float(), out.log_r.float(), counts).mean()
    assert out.real_log_prob is not None
    return mult, real_muon_nll(out.real_log_prob, out.latent_kl)


def real_muon_nll(log_prob: torch.Tensor, latent_kl: torch.Tensor | None) -> torch.Tensor:
    """The real muons' NLL per muon (M,) -> (); with the latent encoder the negative ELBO per muon: the
    events' KL from the prior spread over the batch's muons (an upper bound on the NLL)."""
    muons = log_prob.shape[0]
    if latent_kl is None:
        return -log_prob.float().mean() if muons else log_prob.new_zeros((), dtype=torch.float32)
    return (latent_kl.float().sum() - log_prob.float().sum()) / max(muons, 1)
