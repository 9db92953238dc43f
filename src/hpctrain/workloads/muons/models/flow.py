"""A conditional spline flow for the muons of an event: log energy, then log lateral distance given it, and a
uniform azimuth.

Per muon (normalised units of `physics`: [log10(E/PeV), x/500, y/500]) the flow works on
    a = (log10(E/PeV) - c_a) / s_a,    b = (log10(r) - c_b) / s_b,    r = hypot(x, y),  phi = atan2(y, x),
standardised with statistics of the first training batch (buffers, saved with the module), and models
    p(a | event) p(b | a, event),  phi ~ U(0, 2 pi) (a bundle is azimuthally symmetric about the shower axis).
Each factor is an affine map (loc, log scale) after a monotone rational-quadratic spline (Durkan et al. 2019,
"Neural Spline Flows", with linear tails: the identity outside [-TAIL, TAIL]) of a standard normal. The
spline parameters come from the event's context (per event, gathered to its muons); the lateral distance's
loc and scale also see the muon's energy (a small per-muon net), since r ~ p_T H / E at production.

With `leading` the event's most energetic muon (the leading one) has a density of its own, and every other
muon's energy is modelled below it, as the gap u = log(a_lead - a + GAP_FLOOR) given (context, a_lead): a
bundle is then "one leading muon, and the rest under it", which is how the maximum of a bundle and its energy
share come out right when the leading muon has a harder spectrum than the others (truth v2, real showers). The
leading muon is found by energy, whatever the order of the file; a generated event lists it first.

Both directions are closed-form, so the same module samples (differentiably: the WGAN's generator) and gives
log densities (the likelihood-trained generator, and the WGAN's optional likelihood term).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

TAIL = 5.0  # standardised units
MIN_WIDTH = MIN_HEIGHT = MIN_SLOPE = 1e-3
R_MIN = 1e-7  # normalised lateral distance floor (0.05 mm): log10(0) is not a number
GAP_FLOOR = 1e-3  # standardised units: a muon's energy gap below the leading one is at least this (log of 0)
# softplus(_ONE) + MIN_SLOPE == 1: the spline's end slopes match the identity tails
_ONE = math.log(math.expm1(1.0 - MIN_SLOPE))
LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)


def _knots(unnormalised: torch.Tensor, minimum: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(knot positions (N, K + 1) from -TAIL to TAIL, bin sizes (N, K)) from unnormalised sizes (N, K)."""
    k = unnormalised.shape[-1]
    sizes = minimum + (1.0 - minimum * k) * torch.softmax(unnormalised, -1)
    inner = (torch.cumsum(sizes, -1) * (2.0 * TAIL) - TAIL)[..., :-1]
    edge = inner.new_full((*inner.shape[:-1], 1), TAIL)
    knots = torch.cat([-edge, inner, edge], -1)
    return knots, knots[..., 1:] - knots[..., :-1]


def _bins(locs: torch.Tensor, x: torch.Tensor, event: torch.Tensor) -> torch.Tensor:
    """(M,) the bin of each x (M,) among its event's knots locs (B, K + 1), in 0..K-1: ONE search of the
    events' interior knots laid end to end (event e shifted by e * 3 TAIL, in float64: exact enough for
    millions of events), not a search per row of a (M, K + 1) copy."""
    events, k = locs.shape[0], locs.shape[1] - 1
    if k == 1:
        return torch.zeros_like(event)
    offsets = torch.arange(events, device=locs.device, dtype=torch.float64) * (3.0 * TAIL)
    interior = (locs[:, 1:-1].double() + offsets.unsqueeze(1)).flatten()  # sorted: knots rise, events apart
    position = torch.searchsorted(interior, x.double() + offsets[event])
    return (position - event * (k - 1)).clamp(0, k - 1)


def _spline_rows(
    x: torch.Tensor, params: torch.Tensor, inverse: bool, event: torch.Tensor | None
) -> tuple[torch.Tensor, ...]:
    """Per row of x: (x clamped to the spline's range, whether x is inside it, and its bin's x0, y0, width,
    height, slopes d0 and d1, delta = height / width, bend = d0 + d1 - 2 delta)."""
    if event is None:
        event = torch.arange(x.shape[0], device=x.device)
    k = (params.shape[-1] + 1) // 3
    xk, widths = _knots(params[..., :k], MIN_WIDTH)
    yk, heights = _knots(params[..., k : 2 * k], MIN_HEIGHT)
    slopes = MIN_SLOPE + F.softplus(F.pad(params[..., 2 * k :], (1, 1), value=_ONE))  # (B, K + 1)
    inside = (x > -TAIL) & (x < TAIL)
    xc = x.clamp(-TAIL, TAIL)  # evaluated everywhere (no data-dependent shapes), chosen by `inside`
    idx = _bins(yk if inverse else xk, xc, event)
    knot = event * (k + 1) + idx  # (N,) into the flattened (B, K + 1) knots
    bin_ = event * k + idx  # (N,) into the flattened (B, K) sizes
    x0, y0 = xk.flatten()[knot], yk.flatten()[knot]
    w, h = widths.flatten()[bin_], heights.flatten()[bin_]
    d0, d1 = slopes.flatten()[knot], slopes.flatten()[knot + 1]
    delta = h / w
    return xc, inside, x0, y0, w, h, d0, d1, delta, d0 + d1 - 2.0 * delta


def _forward_value(
    t: torch.Tensor,
    y0: torch.Tensor,
    h: torch.Tensor,
    d0: torch.Tensor,
    delta: torch.Tensor,
    bend: torch.Tensor,
) -> torch.Tensor:
    """The forward spline's y at the position t in (0, 1) of x in its bin."""
    return y0 + h * (delta * t * t + d0 * t * (1.0 - t)) / (delta + bend * t * (1.0 - t))


def rq_spline(
    x: torch.Tensor, params: torch.Tensor, inverse: bool = False, event: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Monotone rational-quadratic spline on [-TAIL, TAIL], the identity outside.

    x (N,); params (N, 3K - 1): K unnormalised widths, K heights, K - 1 interior slopes; or, with `event`
    (N,), params (B, 3K - 1) per event and x's event of each row: the knots are made once per event (softmax,
    cumsum, softplus on B rows) and each row gathers the six numbers of its bin. Returns (y (N,),
    log |dy/dx| (N,)); with `inverse`, the inverse map and ITS log-derivative."""
    xc, inside, x0, y0, w, h, d0, d1, delta, bend = _spline_rows(x, params, inverse, event)
    if inverse:
        dy = xc - y0
        qa = dy * bend + h * (delta - d0)
        qb = h * d0 - dy * bend
        qc = -delta * dy
        t = (2.0 * qc) / (-qb - torch.sqrt((qb * qb - 4.0 * qa * qc).clamp_min(0.0)))
        out = t * w + x0
    else:
        t = (xc - x0) / w
        out = _forward_value(t, y0, h, d0, delta, bend)
    tt = t * (1.0 - t)
    log_slope = 2.0 * torch.log(delta) + torch.log(d1 * t * t + 2.0 * delta * tt + d0 * (1.0 - t) ** 2)
    log_slope = log_slope - 2.0 * torch.log(delta + bend * tt)
    if inverse:
        log_slope = -log_slope
    return torch.where(inside, out, x), torch.where(inside, log_slope, torch.zeros_like(log_slope))


def rq_spline_value(x: torch.Tensor, params: torch.Tensor, event: torch.Tensor | None = None) -> torch.Tensor:
    """rq_spline's forward y alone, equal to it bit for bit: sampling needs no log-derivative (its three logs
    and ten products were ~1/3 of each spline's time)."""
    xc, inside, x0, y0, w, h, d0, _, delta, bend = _spline_rows(x, params, False, event)
    return torch.where(inside, _forward_value((xc - x0) / w, y0, h, d0, delta, bend), x)


def _transform(
    z: torch.Tensor,
    spline: torch.Tensor,
    loc: torch.Tensor,
    log_scale: torch.Tensor,
    event: torch.Tensor | None = None,
) -> torch.Tensor:
    """Base normal z (N,) -> standardised value: loc + exp(log_scale) * spline(z) (spline per row, or per
    event with `event`, as rq_spline)."""
    y = rq_spline_value(z, spline, event=event)
    return loc + log_scale.exp() * y


def _log_prob(
    v: torch.Tensor,
    spline: torch.Tensor,
    loc: torch.Tensor,
    log_scale: torch.Tensor,
    event: torch.Tensor | None = None,
) -> torch.Tensor:
    """(N,) log density of standardised values v under `_transform` of a standard normal."""
    z, log_det = rq_spline((v - loc) * torch.exp(-log_scale), spline, inverse=True, event=event)
    return -0.5 * z * z - LOG_SQRT_2PI + log_det - log_scale


def first_of_events(index: torch.Tensor) -> torch.Tensor:
    """(M,) bool: the first muon of each event, for muons grouped by event (index (M,) non-decreasing)."""
    before = torch.cat([index.new_full((1,), -1), index[:-1]])
    return index != before


def leading_of_events(a: torch.Tensor, index: torch.Tensor, events: int) -> torch.Tensor:
    """(M,) bool: the most energetic muon of each event (the first of equals), from energies a (M,); no
    host synchronisation (segment maxima and minima by scatter_reduce)."""
    top = a.new_zeros(events).scatter_reduce(0, index, a, reduce="amax", include_self=False)
    position = torch.arange(a.shape[0], device=a.device)
    candidate = torch.where(a == top[index], position, a.shape[0])
    first = position.new_full((events,), a.shape[0]).scatter_reduce(0, index, candidate, reduce="amin")
    return position == first[index]


class MuonFlow(nn.Module):
    """p(muons | event context): (M, 3) normalised muons from (B, C) contexts and 3 normal latents per muon."""

    NOISE = 3  # per muon: the energy's and the lateral distance's base normals, and the azimuth's

    center: torch.Tensor
    scale: torch.Tensor
    gap_center: torch.Tensor
    gap_scale: torch.Tensor

    def __init__(self, context: int, hidden: int, bins: int = 8, leading: bool = False) -> None:
        super().__init__()
        self.bins = bins
        self.leading = leading
        n_spline = 3 * bins - 1
        self.n_spline = n_spline
        # per event: energy spline + loc + log scale (with `leading`: the leading muon's), lateral spline
        self.event_net = nn.Sequential(
            nn.Linear(context, hidden), nn.SiLU(), nn.Linear(hidden, hidden), nn.SiLU(),
            nn.Linear(hidden, 2 * n_spline + 2),
        )  # fmt: skip
        # per muon: the lateral distance's loc and log scale from (event context, the muon's energy a, and
        # whether it leads); first layer split so the context part runs per event
        half = max(hidden // 2, 4)
        self.lateral_context = nn.Linear(context, half)
        self.lateral_energy = nn.Linear(2 if leading else 1, half, bias=False)
        self.lateral_net = nn.Sequential(nn.SiLU(), nn.Linear(half, half), nn.SiLU(), nn.Linear(half, 2))
        # with `leading`: per event, the other muons' gap below the leading one from (context, a_lead)
        self.gap_net: nn.Sequential | None = None
        if leading:
            self.gap_net = nn.Sequential(
                nn.Linear(context + 1, hidden), nn.SiLU(), nn.Linear(hidden, hidden), nn.SiLU(),
                nn.Linear(hidden, n_spline + 2),
            )  # fmt: skip
        for net in (self.event_net, self.lateral_net, self.gap_net):
            if net is None:
                continue
            # start at the identity (standard normals in the standardised space): a sensible first model
            last = net[-1]
            assert isinstance(last, nn.Linear)
            nn.init.zeros_(last.weight)
            nn.init.zeros_(last.bias)
        self.register_buffer("center", torch.zeros(2))
        self.register_buffer("scale", torch.ones(2))
        if leading:
            self.register_buffer("gap_center", torch.zeros(()))
            self.register_buffer("gap_scale", torch.ones(()))

    @staticmethod
    def polar(muons: torch.Tensor) -> torch.Tensor:
        """(M, 2) [log10(E/PeV), log10(r)] of normalised muons (M, 3)."""
        r = torch.hypot(muons[:, 1], muons[:, 2]).clamp_min(R_MIN)
        return torch.stack([muons[:, 0], torch.log10(r)], 1)

    @torch.no_grad()
    def fit(self, muons: torch.Tensor, index: torch.Tensor | None = None, events: int = 0) -> None:
        """Standardisation from normalised muons (M, 3): median and 1.4826 x MAD (floored); no-op if M < 2.
        With `leading`, also the gaps' from the muons' events (index (M,), `events` of them)."""
        if muons.shape[0] < 2:
            return
        v = self.polar(muons.float())
        center = v.median(0).values
        self.center.copy_(center)
        self.scale.copy_(((v - center).abs().median(0).values * 1.4826).clamp_min(1e-3))
        if self.leading and index is not None:
            a = (v[:, 0] - self.center[0]) / self.scale[0]
            lead = leading_of_events(a, index, events)
            top = a.new_zeros(events).scatter_reduce(0, index, a, reduce="amax", include_self=False)
            gaps = torch.log(top[index][~lead] - a[~lead] + GAP_FLOOR)
            if gaps.shape[0] >= 2:
                middle = gaps.median()
                self.gap_center.copy_(middle)
                self.gap_scale.copy_(((gaps - middle).abs().median() * 1.4826).clamp_min(1e-3))

    def _params(
        self, context: torch.Tensor, index: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The energy spline (B, n), loc and log scale (B,) per event; the lateral spline (B, n) per event; and
        the lateral net's context part (M, half) per muon. The spline parameters leave in fp32 whatever the
        autocast precision: the spline's softmax, cumsum, divisions and logs in bf16 made a NaN loss after ~1100
        updates of the default muon_flow (knot gaps rounded to 0); the cast is exact."""
        n = self.n_spline
        per_event = self.event_net(context).float()  # (B, 2n + 2)
        lateral_ctx = self.lateral_context(context).index_select(0, index)  # (M, half)
        loc, log_scale = per_event[:, n], per_event[:, n + 1].clamp(-5.0, 5.0)
        return per_event[:, :n], loc, log_scale, per_event[:, n + 2 :], lateral_ctx

    def _gap_params(
        self, context: torch.Tensor, a_lead: torch.Tensor, index: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The gap's spline (B, n) per event, loc and log scale (M,) per muon, from each event's (context,
        a_lead (B,))."""
        assert self.gap_net is not None
        n = self.n_spline
        net_in = torch.cat([context, a_lead.to(context.dtype).unsqueeze(1)], 1)
        out = self.gap_net(net_in).float()  # (B, n + 2)
        affine = out[:, n:].index_select(0, index)  # (M, 2)
        return out[:, :n], affine[:, 0], affine[:, 1].clamp(-5.0, 5.0)

    def _lateral_affine(
        self, lateral_ctx: torch.Tensor, a: torch.Tensor, lead: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        muon_in = a.unsqueeze(1) if lead is None else torch.stack([a, lead.to(a.dtype)], 1)
        # lateral_ctx + lateral_energy(muon_in) in one addmm: one (M, half) pass fewer
        weight = self.lateral_energy.weight
        first = torch.addmm(lateral_ctx, muon_in.to(weight.dtype), weight.t())
        out = self.lateral_net(first).float()  # (M, 2), fp32 as above
        return out[:, 0], out[:, 1].clamp(-5.0, 5.0)

    def _below_lead(self, u: torch.Tensor, a_lead: torch.Tensor) -> torch.Tensor:
        """Energies a under the leading a_lead from standardised gaps u (M,)."""
        return a_lead + GAP_FLOOR - torch.exp((self.gap_center + self.gap_scale * u).clamp(max=8.0))

    def sample(self, context: torch.Tensor, index: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """(M, 3) normalised muons for events with contexts (B, C); index (M,) event of each muon, grouped by
        event (with `leading`, the first of each event leads); noise (M, 3) standard normals. Differentiable
        in the parameters (a generator's forward)."""
        e_spline, e_loc, e_log_scale, l_spline, lateral_ctx = self._params(context, index)
        lead = None
        if self.leading:
            # the leading (first) muon's energy per EVENT (B rows, not M: the others' come from the gap), 0 for
            # events without muons; then every other muon under it
            events = context.shape[0]
            counts = index.new_zeros(events).index_add(0, index, torch.ones_like(index))
            first = (torch.cumsum(counts, 0) - counts).clamp(max=max(index.shape[0] - 1, 0))
            z_lead = noise[:, 0].index_select(0, first) if index.shape[0] else noise.new_zeros(events)
            a_lead = _transform(z_lead, e_spline, e_loc, e_log_scale)
            a_lead = torch.where(counts > 0, a_lead, 0.0)
            lead = first_of_events(index)
            g_spline, g_loc, g_log_scale = self._gap_params(context, a_lead, index)
            u = _transform(noise[:, 0], g_spline, g_loc, g_log_scale, index)
            a_top = a_lead[index]
            a = torch.where(lead, a_top, self._below_lead(u, a_top))
        else:
            a = _transform(noise[:, 0], e_spline, e_loc[index], e_log_scale[index], index)
        l_loc, l_log_scale = self._lateral_affine(lateral_ctx, a, lead)
        b = _transform(noise[:, 1], l_spline, l_loc, l_log_scale, index)
        log10_e = self.center[0] + self.scale[0] * a
        r = torch.pow(10.0, (self.center[1] + self.scale[1] * b).clamp(max=2.0))  # r <= 100 x 500 m
        phi = math.pi * torch.erf(noise[:, 2] / math.sqrt(2.0))  # uniform on (-pi, pi)
        return torch.stack([log10_e, r * torch.cos(phi), r * torch.sin(phi)], 1)

    def log_prob(self, muons: torch.Tensor, context: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """(M,) log density of normalised muons (M, 3) in the standardised (a, b) space (the azimuth's and the
        standardisation's constants left out: they do not depend on the parameters)."""
        v = (self.polar(muons) - self.center) / self.scale  # (M, 2)
        a = v[:, 0]
        e_spline, e_loc, e_log_scale, l_spline, lateral_ctx = self._params(context, index)
        log_p = _log_prob(a, e_spline, e_loc[index], e_log_scale[index], index)
        lead = None
        if self.leading:
            events = context.shape[0]
            lead = leading_of_events(a, index, events)
            a_lead = a.new_zeros(events).scatter_reduce(0, index, a, reduce="amax", include_self=False)
            gap = (a_lead[index] - a).clamp_min(0.0) + GAP_FLOOR
            u = (torch.log(gap) - self.gap_center) / self.gap_scale
            g_spline, g_loc, g_log_scale = self._gap_params(context, a_lead, index)
            # density of a: that of u times |du/da| = 1 / (gap_scale * gap)
            log_gap = _log_prob(u, g_spline, g_loc, g_log_scale, index)
            log_gap = log_gap - torch.log(gap) - torch.log(self.gap_scale)
            log_p = torch.where(lead, log_p, log_gap)
        l_loc, l_log_scale = self._lateral_affine(lateral_ctx, a, lead)
        return log_p + _log_prob(v[:, 1], l_spline, l_loc, l_log_scale, index)
