"""Networks of the muon models: ragged sets as a flat muon tensor plus each muon's event index, never padded.

Units are the normalised ones of `physics` (primaries (B, 4), muons (M, 3) [log10(E/PeV), x/500, y/500]).
Segment sums and maxima use index_add_/scatter_reduce, whose outputs have host-known shapes, so nothing here
synchronises the GPU with the CPU unless the caller asks for sampled multiplicities.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from hpctrain.workloads.muons.models.flow import MuonFlow
from hpctrain.workloads.muons.spec import DEFAULT_MUON_CAP

PRIMARY_DIM, MUON_DIM = 4, 3


def event_index(counts: torch.Tensor, total: int) -> torch.Tensor:
    """(total,) int64 event of each muon; `total` (= counts.sum(), known on the host) avoids a sync."""
    events = torch.arange(counts.shape[0], device=counts.device)
    return torch.repeat_interleave(events, counts, output_size=total)


def multiplicity_feature(counts: torch.Tensor) -> torch.Tensor:
    """(B, 1) log10(N + 1): the multiplicity as the networks see it."""
    return torch.log10(counts.float() + 1.0).unsqueeze(1)


def segment_sum(values: torch.Tensor, index: torch.Tensor, n: int) -> torch.Tensor:
    """(n, F) per-event sums of values (M, F); events without muons get 0."""
    out = values.new_zeros((n, values.shape[1]))
    return out.index_add(0, index, values)


def segment_max(values: torch.Tensor, index: torch.Tensor, n: int) -> torch.Tensor:
    """(n, F) per-event maxima; events without muons get 0 (never a -inf/-1e9 sentinel)."""
    out = values.new_zeros((n, values.shape[1]))
    expanded = index.unsqueeze(1).expand_as(values)
    # include_self=False: the initial zeros only survive in rows no muon reaches (the empty events)
    return out.scatter_reduce(0, expanded, values, reduce="amax", include_self=False)


def pool(values: torch.Tensor, index: torch.Tensor, counts: torch.Tensor, how: str) -> torch.Tensor:
    """(B, F) permutation-invariant summary of each event's muon features (M, F)."""
    n = counts.shape[0]
    if how == "max":
        return segment_max(values, index, n)
    summed = segment_sum(values, index, n)
    if how == "sum":
        return summed
    return summed / counts.clamp_min(1).unsqueeze(1).to(values.dtype)


def mlp(sizes: list[int], act: type[nn.Module], norm: bool = False, last_act: bool = False) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(nn.Linear(a, b))
        if i < len(sizes) - 2 or last_act:
            if norm:
                layers.append(nn.LayerNorm(b))
            layers.append(act())
    return nn.Sequential(*layers)


class MuonScaler(nn.Module):
    """Muon features <-> the networks' scale: z = asinh((v - center) / scale), per feature.

    Normalised x, y spread over decades (a few cm to 2 km over 500 m): the asinh keeps the core near unit scale
    and compresses the tail, so neither network works on values of 1e-3 or on a tail-dominated std. The
    statistics are set once from the first training batch (`fit`) and saved as buffers with the generator."""

    center: torch.Tensor
    scale: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("center", torch.zeros(MUON_DIM))
        self.register_buffer("scale", torch.ones(MUON_DIM))

    @torch.no_grad()
    def fit(self, muons: torch.Tensor) -> None:
        """center = median, scale = median absolute deviation (floored) of muons (M, 3); no-op if M < 2."""
        if muons.shape[0] < 2:
            return
        center = muons.median(0).values
        self.center.copy_(center)
        self.scale.copy_((muons - center).abs().median(0).values.clamp_min(1e-4))

    def forward(self, muons: torch.Tensor) -> torch.Tensor:
        return torch.asinh((muons - self.center) / self.scale)

    def inverse(self, z: torch.Tensor) -> torch.Tensor:
        return self.center + self.scale * torch.sinh(z.clamp(-15.0, 15.0))


class MultiplicityHead(nn.Module):
    """Negative binomial NB(mean mu, dispersion r) of the muon count given the primary.

    Counts fluctuate like showers do: a Gamma(r, mu/r) mean fed to a Poisson; r -> inf is Poisson."""

    def __init__(self, hidden: list[int], cap: int) -> None:
        super().__init__()
        self.cap = int(cap) if cap > 0 else DEFAULT_MUON_CAP
        self.net = mlp([PRIMARY_DIM, *hidden, 2], nn.ELU)

    def forward(self, primaries: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(log mu (B,), log r (B,)), clamped to ranges where lgamma and exp stay finite."""
        out = self.net(primaries)
        return out[:, 0].clamp(-15.0, 15.0), out[:, 1].clamp(-6.0, 12.0)

    @staticmethod
    def nll(log_mu: torch.Tensor, log_r: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """(B,) negative log-likelihood of the counts under NB(mu, r)."""
        k = counts.to(log_mu.dtype)
        r = log_r.exp()
        log_total = torch.logaddexp(log_mu, log_r)  # log(mu + r)
        log_p = (
            torch.lgamma(k + r)
            - torch.lgamma(r)
            - torch.lgamma(k + 1.0)
            + r * (log_r - log_total)
            + k * (log_mu - log_total)
        )
        return -log_p

    @torch.no_grad()
    def sample(self, primaries: torch.Tensor, cap: int | None = None) -> torch.Tensor:
        """(B,) int64 counts drawn from the predicted NB (torch's global RNG), capped at `cap` (default: the
        head's cap)."""
        limit = self.cap if cap is None else cap
        log_mu, log_r = self(primaries.float())
        # gamma-Poisson mixture: rate ~ Gamma(shape r, scale mu/r), count ~ Poisson(rate)
        rate = torch._standard_gamma(log_r.double().exp()) * (log_mu - log_r).double().exp()
        rate = rate.clamp_max(float(limit) * 4.0)  # beyond the cap the value does not matter; keeps it finite
        return torch.poisson(rate).clamp_max(limit).long()


class GeneratorOutput(NamedTuple):
    """What the generator's forward gives: muons (M, 3) in the scaled space, the NB parameters (B,) each, and,
    when real muons were passed (flow head), their log density (M,) under the same event contexts (with the
    latent encoder: under latents drawn from its posterior, and that posterior's KL from the prior (B,))."""

    muons: torch.Tensor
    log_mu: torch.Tensor
    log_r: torch.Tensor
    real_log_prob: torch.Tensor | None = None
    latent_kl: torch.Tensor | None = None


class LatentEncoder(nn.Module):
    """q(z | an event's real muons, primary, N): a diagonal normal over the generator's event latent (a
    conditional VAE's encoder). With it the likelihood trains a bundle-wide latent: under a latent drawn from
    the prior the best density of real muons ignores the latent (every bundle's muons look independent given
    the primary and N), under the posterior it explains what the bundle's muons share."""

    def __init__(self, hidden: int, latent: int) -> None:
        super().__init__()
        half = max(hidden // 2, 1)
        # the per-muon net's first layer on cat(muon, primary[index]), split: the primary part runs per event
        self.point_muon = nn.Linear(MUON_DIM, half)
        self.point_primary = nn.Linear(PRIMARY_DIM, half, bias=False)
        self.point_net = nn.Sequential(nn.LeakyReLU(), mlp([half, hidden], nn.LeakyReLU, True, True))
        self.head = mlp([hidden + PRIMARY_DIM + 2, hidden, 2 * latent], nn.LeakyReLU)

    def forward(
        self, scaled: torch.Tensor, index: torch.Tensor, primaries: torch.Tensor, counts: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean, log variance), each (B, latent), from scaled muons (M, 3) and their events `index` (M,)."""
        first = self.point_muon(scaled) + self.point_primary(primaries).index_select(0, index)
        pooled = pool(self.point_net(first), index, counts, "mean")  # (B, H); empty events: 0
        empty = (counts == 0).to(pooled.dtype).unsqueeze(1)
        out = self.head(torch.cat([pooled, primaries, multiplicity_feature(counts), empty], 1))
        mean, log_var = out.chunk(2, 1)
        return mean, log_var.clamp(-12.0, 6.0)  # a bounded variance: exp() neither vanishes nor overflows


class LatentPrior(nn.Module):
    """p(z | primary, N): a diagonal normal over the event latent given what is known before the muons (a
    conditional VAE's prior). The multiplicity carries news of the shower (a bundle with more muons than its
    primary's mean came from an early, deep-developing shower), so the latent's prior is the one that N
    implies, not N(0, 1): sampling draws N first, then z from here, then the muons."""

    def __init__(self, hidden: int, latent: int) -> None:
        super().__init__()
        self.net = mlp([PRIMARY_DIM + 1, hidden, hidden, 2 * latent], nn.LeakyReLU)
        last = self.net[-1]
        assert isinstance(last, nn.Linear)
        nn.init.zeros_(last.weight)  # starts as N(0, 1)
        nn.init.zeros_(last.bias)

    def forward(self, primaries: torch.Tensor, counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean, log variance), each (B, latent)."""
        mean, log_var = self.net(torch.cat([primaries, multiplicity_feature(counts)], 1)).chunk(2, 1)
        return mean, log_var.clamp(-12.0, 6.0)


def gaussian_kl(
    mean: torch.Tensor, log_var: torch.Tensor, prior: tuple[torch.Tensor, torch.Tensor] | None
) -> torch.Tensor:
    """(B,) KL(N(mean, exp(log_var)) || prior) summed over the latent; prior (mean, log variance) or None =
    N(0, 1)."""
    if prior is None:
        return 0.5 * (mean.square() + log_var.exp() - log_var - 1.0).sum(1)
    p_mean, p_log_var = prior
    ratio = (log_var.exp() + (mean - p_mean).square()) * torch.exp(-p_log_var)
    return 0.5 * (ratio + p_log_var - log_var - 1.0).sum(1)


class Generator(nn.Module):
    """Multiplicity head, event context from (global latent, primary, multiplicity), then per-muon features
    from (context of the muon's event, per-muon latent)."""

    def __init__(
        self,
        latent_global: int,
        latent_local: int,
        hidden: int,
        mult_hidden: list[int],
        cap: int,
        isotropic: bool = False,
        head: str = "mlp",
        flow_bins: int = 8,
        latent_encoder: bool = False,
        latent_prior: bool = False,
        leading: bool = False,
    ) -> None:
        super().__init__()
        self.latent_global, self.latent_local = latent_global, latent_local
        # isotropic: each muon's (x, y) is turned by its own uniform azimuth, drawn as one more per-muon
        # latent column that the networks never see (so they cannot undo it)
        self.isotropic = isotropic
        self.multiplicity = MultiplicityHead(mult_hidden, cap)
        self.scaler = MuonScaler()
        half = max(hidden // 2, 1)
        self.global_net = mlp([latent_global + PRIMARY_DIM + 1, half, hidden], nn.LeakyReLU, True, True)
        # head "flow": the muons of an event from a conditional spline flow on the event context (flow.py):
        # log energy, log lateral distance given it, uniform azimuth; else an MLP on (context, latent)
        self.flow = MuonFlow(hidden, hidden, flow_bins, leading) if head == "flow" else None
        # training only: the real muons' density is taken under latents from this posterior (sampling draws
        # the latent from the prior and never runs it)
        self.encoder = (
            LatentEncoder(hidden, latent_global) if latent_encoder and self.flow is not None else None
        )
        # the latent's prior given (primary, N) (else N(0, 1)): sampling turns the standard normal latents
        # into draws from it
        self.prior = LatentPrior(hidden, latent_global) if latent_prior and self.encoder is not None else None
        if self.flow is None:
            # local_net's first layer on cat(context[index], z_local), split in two so the context part runs
            # per EVENT (B rows) and only its (B, half) result is gathered to the muons: fewer FLOPs
            self.local_context = nn.Linear(hidden, half)
            self.local_latent = nn.Linear(latent_local, half, bias=False)
            self.local_net = nn.Sequential(
                nn.LeakyReLU(), mlp([half, max(hidden // 4, 1), MUON_DIM], nn.LeakyReLU)
            )

    @torch.no_grad()
    def fit_scalers(self, muons: torch.Tensor, counts: torch.Tensor | None = None) -> None:
        """Set the scalers' statistics from normalised muons (M, 3) of a training batch (counts (B,): its
        events' multiplicities, for the leading muon's gaps)."""
        self.scaler.fit(muons)
        if self.flow is not None:
            index = None if counts is None else event_index(counts, muons.shape[0])
            self.flow.fit(muons, index, 0 if counts is None else counts.shape[0])

    def context(self, primaries: torch.Tensor, counts: torch.Tensor, z_global: torch.Tensor) -> torch.Tensor:
        """(B, hidden) event contexts from (global latent, primary, log10(N + 1))."""
        return self.global_net(torch.cat([z_global, primaries, multiplicity_feature(counts)], 1))

    def noise(
        self, events: int, muons: int, device: torch.device, generator: torch.Generator | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Latents (events, latent_global) and (muons, latent_local) from `generator` (default: global RNG)."""
        z_global = torch.randn(events, self.latent_global, device=device, generator=generator)
        if self.flow is not None:
            width = MuonFlow.NOISE
        else:
            width = self.latent_local + (1 if self.isotropic else 0)
        z_local = torch.randn(muons, width, device=device, generator=generator)
        return z_global, z_local

    def forward(
        self,
        primaries: torch.Tensor,
        counts: torch.Tensor,
        index: torch.Tensor,
        z_global: torch.Tensor | None = None,
        z_local: torch.Tensor | None = None,
        real: torch.Tensor | None = None,
        sample: bool = True,
        z_posterior: torch.Tensor | None = None,
        normalised: bool = False,
    ) -> GeneratorOutput:
        """Muons (M, 3) IN SCALED UNITS (`scaler.inverse` gives normalised muons) for events with these counts
        (index (M,) their event), and the NB parameters (log mu (B,), log r (B,)) for the multiplicity
        likelihood; with `real` (M', 3) normalised muons of the same events (flow head; index: the muons
        are those of `counts`), also their log density under the same contexts. Latents are drawn when not
        given (the trainer passes its own, from a checkpointed generator). `sample=False` (flow head, with
        `real`): no muons are generated (an empty (0, 3) tensor): likelihood training needs none. With the
        latent encoder, the real muons' density is taken under z = mean + sd * eps of their posterior, eps =
        `z_posterior` (default: `z_global` when nothing is sampled, else drawn), and its KL from the prior is
        returned. `z_global` is standard normal: with a conditional prior, generated events take
        z = prior mean + prior sd * z_global. `normalised` (sampling): the muons in normalised units instead
        (the flow head's own output, without a round trip through the scaled space's asinh and sinh)."""
        if not sample and (self.flow is None or real is None):
            raise ValueError("sample=False needs the flow head and real muons")
        if z_global is None or z_local is None:
            z_global, z_local = self.noise(
                primaries.shape[0], index.shape[0] if sample else 0, primaries.device
            )
        prior = self.prior(primaries, counts) if self.prior is not None else None
        z_drawn = z_global if prior is None else prior[0] + torch.exp(0.5 * prior[1]) * z_global
        # (B, H); not needed when only the real muons' posterior density is asked for
        context = self.context(primaries, counts, z_drawn) if sample or self.encoder is None else z_drawn
        log_mu, log_r = self.multiplicity(primaries)
        if self.flow is not None:
            muons = self.flow.sample(context, index, z_local) if sample else primaries.new_zeros((0, 3))
            muons = muons if normalised else self.scaler(muons)
            if real is None:
                return GeneratorOutput(muons, log_mu, log_r)
            if self.encoder is None:
                return GeneratorOutput(muons, log_mu, log_r, self.flow.log_prob(real, context, index))
            eps = z_posterior
            if eps is None:  # the prior's draw serves when it generated nothing, else a fresh one
                eps = torch.randn_like(z_global) if sample else z_global
            mean, log_var = self.encoder(self.scaler(real), index, primaries, counts)
            z_real = mean + torch.exp(0.5 * log_var) * eps
            kl = gaussian_kl(mean, log_var, prior)  # (B,) KL(q || the prior)
            real_context = self.context(primaries, counts, z_real)
            return GeneratorOutput(muons, log_mu, log_r, self.flow.log_prob(real, real_context, index), kl)
        if real is not None:
            raise ValueError("the log density of real muons needs model.muon_head=flow")
        latent = z_local[:, : self.latent_local]
        first = self.local_context(context).index_select(0, index) + self.local_latent(latent)  # (M, half)
        muons = self.local_net(first)  # (M, 3) scaled
        if self.isotropic and muons.shape[0]:
            muons = self._turn(muons, z_local[:, -1])
        return GeneratorOutput(self.scaler.inverse(muons) if normalised else muons, log_mu, log_r)

    def _turn(self, scaled: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """Rotate each muon's (x, y) about the shower axis by 2 pi Phi(z) (z ~ N(0, 1): a uniform azimuth),
        in normalised units (the scaler's centre is near 0, so the scaled space is not rotation-invariant)."""
        norm = self.scaler.inverse(scaled)  # (M, 3)
        phi = 2.0 * torch.pi * 0.5 * (1.0 + torch.erf(z / 2.0**0.5))  # (M,)
        cos, sin = torch.cos(phi), torch.sin(phi)
        x, y = norm[:, 1], norm[:, 2]
        turned = torch.stack([norm[:, 0], cos * x - sin * y, sin * x + cos * y], 1)
        return self.scaler(turned)

    @torch.no_grad()
    def generate(self, primaries: torch.Tensor, cap: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Sampled counts (B,) and normalised muons (sum counts, 3) for normalised primaries (syncs once, for
        the size)."""
        counts = self.multiplicity.sample(primaries, cap=cap)
        total = int(counts.sum())
        return counts, self(primaries, counts, event_index(counts, total), normalised=True).muons


class Critic(nn.Module):
    """Per-muon net over (muon, primary), pooling per event, and a decision net that sees the pooled
    features, the primary, log10(N + 1) and whether the event is empty; optionally (`muon_score`) plus a
    per-muon score weighted so that every muon of the batch counts equally."""

    def __init__(self, hidden: int, pooling: str, muon_score: bool = False) -> None:
        super().__init__()
        self.pooling = pooling
        # muon_score: a per-muon score added with weight B / (muons in the batch), so the batch mean of the
        # event scores includes the mean per-muon score over ALL muons: every muon counts equally (as in the
        # per-muon W1), instead of 1 / N of an event's pooled mean (see docs/muons.md, "Why the energy")
        self.muon_head = mlp([hidden, hidden // 2, 1], nn.LeakyReLU) if muon_score else None
        # point net's first layer on cat(muon, primary[index]), split: the primary part runs per event
        self.point_muon = nn.Linear(MUON_DIM, hidden // 2)
        self.point_primary = nn.Linear(PRIMARY_DIM, hidden // 2, bias=False)
        self.point_net = nn.Sequential(
            nn.LayerNorm(hidden // 2), nn.LeakyReLU(), mlp([hidden // 2, hidden], nn.LeakyReLU, True, True)
        )
        self.decision = mlp([hidden + PRIMARY_DIM + 2, hidden, hidden // 2, 1], nn.LeakyReLU)

    def forward(
        self,
        muons: torch.Tensor,
        index: torch.Tensor,
        primaries: torch.Tensor,
        counts: torch.Tensor,
        multiplicity: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """(B,) scores of events: muons (M, 3), index (M,) event of each muon, primaries (B, 4), counts (B,)
        muons per event; `multiplicity` (B,) the count the decision net sees (default `counts`; the gradient
        penalty passes an interpolated one)."""
        first = self.point_muon(muons) + self.point_primary(primaries).index_select(0, index)  # (M, H/2)
        features = self.point_net(first)  # (M, H)
        pooled = pool(features, index, counts, self.pooling)  # (B, H); empty events: 0
        empty = (counts == 0).to(pooled.dtype).unsqueeze(1)  # (B, 1): tells 'no muons' from 'features 0'
        mult = multiplicity_feature(counts if multiplicity is None else multiplicity).to(pooled.dtype)
        head = torch.cat([pooled, primaries, mult, empty], 1)
        scores = self.decision(head).squeeze(1)  # (B,)
        if self.muon_head is not None and muons.shape[0]:
            per_muon = self.muon_head(features)  # (M, 1)
            weight = counts.shape[0] / muons.shape[0]
            scores = scores + weight * segment_sum(per_muon, index, counts.shape[0]).squeeze(1)
        return scores
