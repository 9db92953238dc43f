"""Per-feature, per-bin quality of generated bundles against the statistical floor and a baseline.

A figure alone says nothing: a W1 of 0.02 may be perfect (two samples of the truth differ that much) or poor.
So every feature (quality_features.py: multiplicity, muon energy and its upper tail, lateral distance, energy
sum, the leading muon's energy and share, bundle centre and spread) is judged per bin of the primary (energy
x zenith, energy x mass, energy x depth) and over all bins together, against
- the FLOOR: the same figure between two independent samples of the truth of the same size (what a perfect
  generator would show); for the synthetic truth, fresh bundles for the same primaries, its mean over
  FLOOR_DRAWS independent draws, ours over as many draws of the generator (the same estimator on both
  sides); for held-out files, over FLOOR_DRAWS splits in two halves A and B (by parity, then at random): the
  floor is true B vs true A and ours is the generator's bundles FOR B'S PRIMARIES vs true A. Both sides then
  compare bundles for B's primaries with A's events; ours drawn for A's own primaries (as before) was spared
  the difference of the two halves' primaries that the floor carries, and looked better than a perfect
  generator would;
- the TOLERANCE, from the floor's own replicates instead of a fixed 2 x floor: the floor's draws (or splits)
  are truth-vs-truth replicates, their standard deviation s is the spread of one draw's figure; ours and the
  floor are each a mean of K draws, so for a perfect generator ours - floor has a standard deviation of
  s sqrt(2 / K). A bin is within the floor when ours <= floor + TOLERANCE_SIGMAS s sqrt(1/K_ours + 1/K_floor).
  s from 4 replicates can be far too small by chance, so it is at least the feature's median relative spread
  (over its bins) times the floor. A fixed 2 x floor was both too loose (high-statistics bins, where the floor
  is tight) and too strict (bins whose W1 comes from a few large events vary by 2-4 x between draws);
- the BASELINE: a lookup table of simulations: for each judged event, the bundle of the reference event
  (an independent truth sample, or the other half of held-out files) whose primary is nearest in
  standardised (log10 E, cos zenith, log10 mass, depth) space (scipy's cKDTree). A generator that cannot
  beat looking up the nearest simulated event adds nothing; the old baseline (counts from the marginal, muons
  from the pool of all events) ignored the primary and was beaten by construction.

The goal per feature and bin (bins with at least quality_features.min_values true values; fewer: shown, not
judged) and over all bins together: ours within the floor's tolerance, or ours <= 0.5 x baseline. A feature
meets the goal when all its bins and its all-bins figure do; nothing is averaged over features. `ratio` =
baseline/ours summed over the judged bins: > 1 where ours beats the lookup, defined for every judged feature.

Events above the muon cap: the generator clamps its multiplicity at the cap, so the truth is clamped the same
way (`clamp_to_cap`: an event above the cap keeps its first `cap` muons, N = cap) instead of being dropped: a
dropped event is one the generator cannot refuse to make (at 1e8-1e9 GeV 5 % of the events held a third of the
muons). The synthetic truths store a bundle's muons in random order (v1: independent muons; v2: the leading
muon first, then the others), so the first `cap` muons are a random subset that keeps v2's leading muon.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from hpctrain.data.stream.ragged import gather_ragged
from hpctrain.workloads.muons.evaluation.quality_features import (
    FEATURES,
    MIN_VALUES,
    R_FLOOR_M,
    TAILS,
    Grouped,
    bin_labels,
    features,
    ks_statistic,
    quantile_w1_and_ks,
    source,
    tail_w1_and_ks,
    w1_and_ks,
    wasserstein_1d,
)
from hpctrain.workloads.muons.evaluation.quality_judge import (
    BASELINE_FACTOR,
    TOLERANCE_SIGMAS,
    goal_word,
    judge,
    table,
)
from hpctrain.workloads.muons.events import layouts

# callers import these from here
__all__ = ["BASELINE_FACTOR", "FEATURES", "MIN_VALUES", "R_FLOOR_M", "TOLERANCE_SIGMAS", "bin_labels"]
__all__ += ["features", "goal_word", "ks_statistic", "table", "w1_and_ks", "wasserstein_1d"]

FLOOR_DRAWS = 4  # truth draws averaged into the floor (synthetic truth), or splits of held-out events


def distances(
    generated: layouts.Events, true: layouts.Events | Grouped, only: tuple[str, ...] = FEATURES
) -> dict[str, dict[str, Any]]:
    """feature -> {"w1", "ks" (over all bins), "draws": 1, "bins": {label: {"w1", "ks", "n_true",
    "n_generated"}}}; `true` may be Grouped once for many comparisons."""
    gen, tru = Grouped(generated, only), true if isinstance(true, Grouped) else Grouped(true, only)
    labels = bin_labels()
    out: dict[str, dict[str, Any]] = {}
    for name in only:
        body = source(name)
        measure = tail_w1_and_ks if name in TAILS else quantile_w1_and_ks
        bins = {}
        for label, a, b in zip(labels, gen.bin_values(body), tru.bin_values(body)):
            w1, ks = measure(a, b)
            bins[label] = {"w1": w1, "ks": ks, "n_true": len(b), "n_generated": len(a)}
        w1, ks = measure(gen.overall[body], tru.overall[body])
        out[name] = {"w1": w1, "ks": ks, "draws": 1, "bins": bins}
    return out


def _mean_sd(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (NaN with one value; NaN where one is NaN)."""
    array = np.asarray(values, np.float64)
    return float(array.mean()), float(array.std(ddof=1)) if len(array) > 1 else math.nan


def mean_distances(each: list[dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """The mean of several `distances` results (replicates), figure by figure and bin by bin, with the W1's
    sample standard deviation over them (`w1_sd`) and their number (`draws`)."""
    out: dict[str, dict[str, Any]] = {}
    for name, first in each[0].items():
        bins = {}
        for label, row in first["bins"].items():
            w1, sd = _mean_sd([d[name]["bins"][label]["w1"] for d in each])
            bins[label] = {
                "w1": w1,
                "w1_sd": sd,
                "ks": float(np.mean([d[name]["bins"][label]["ks"] for d in each])),
                "n_true": row["n_true"],
                "n_generated": min(d[name]["bins"][label]["n_generated"] for d in each),
            }
        w1, sd = _mean_sd([d[name]["w1"] for d in each])
        ks = float(np.mean([d[name]["ks"] for d in each]))
        out[name] = {"w1": w1, "w1_sd": sd, "ks": ks, "draws": len(each), "bins": bins}
    return out


def primary_space(primaries: np.ndarray) -> np.ndarray:
    """(n, 4) (log10 E, cos zenith, log10 mass, depth) of physical primaries, in which nearness is measured."""
    p = np.asarray(primaries, np.float64)
    return np.stack(
        [
            np.log10(np.maximum(p[:, 0], 1e-30)),
            np.cos(p[:, 1]),
            np.log10(np.maximum(p[:, 2], 1e-30)),
            p[:, 3],
        ],
        1,
    )


def nearest_primaries(reference: np.ndarray, primaries: np.ndarray) -> np.ndarray:
    """(n,) the row of `reference` (m, 4) whose primary is nearest to each of `primaries` (n, 4), in
    primary_space standardised by the reference's spread (a constant column, e.g. one depth, counts nothing)."""
    ref, query = primary_space(reference), primary_space(primaries)
    centre, scale = ref.mean(0), ref.std(0)
    scale[~(scale > 0)] = 1.0
    from scipy.spatial import cKDTree  # scikit-learn's dependency; 0.5 s to import, so only when matched

    _, rows = cKDTree((ref - centre) / scale).query((query - centre) / scale, k=1)
    return np.asarray(rows, np.int64)


def take(events: layouts.Events, rows: np.ndarray) -> layouts.Events:
    """The events `rows` of `events`, in that order."""
    muon_rows, counts = gather_ragged(events.offsets, rows)
    return layouts.Events(events.primaries[rows], events.muons[muon_rows], counts, events.ids[rows])


def baseline_events(reference: layouts.Events, primaries: np.ndarray) -> layouts.Events:
    """The baseline: for each of `primaries`, the bundle of the reference event of the nearest primary,
    labelled with that primary (a lookup table of simulations)."""
    n = len(primaries)
    ids = np.stack([np.zeros(n, np.int64), np.arange(n, dtype=np.int64)], 1)
    if len(reference) == 0:
        return layouts.Events(np.asarray(primaries, np.float32), np.zeros((0, 3), np.float32),
                              np.zeros(n, np.int64), ids)  # fmt: skip
    looked_up = take(reference, nearest_primaries(reference.primaries, primaries))
    return layouts.Events(np.asarray(primaries, np.float32), looked_up.muons, looked_up.counts, ids)


def clamp_to_cap(events: layouts.Events, cap: int) -> tuple[layouts.Events, int]:
    """Each event above `cap` muons cut to its first `cap` (as the generator clamps its multiplicity; see the
    module docstring); also how many events were cut. cap <= 0: no cap."""
    above = events.counts > cap if cap > 0 else np.zeros(len(events), bool)
    if not above.any():
        return events, 0
    rank = np.arange(len(events.muons)) - np.repeat(events.offsets[:-1], events.counts)  # (M,) within event
    keep = rank < cap
    counts = np.minimum(events.counts, cap)
    return layouts.Events(events.primaries, events.muons[keep], counts, events.ids), int(above.sum())


def split_halves(
    events: layouts.Events, rng: np.random.Generator | None = None
) -> tuple[layouts.Events, layouts.Events]:
    """Events at even and at odd positions (both halves see every file and bin alike), or, with `rng`, a
    random half (in file order) and the rest."""
    if rng is None:
        first = np.arange(len(events)) % 2 == 0
    else:
        first = np.zeros(len(events), dtype=bool)
        first[rng.permutation(len(events))[: (len(events) + 1) // 2]] = True
    return take(events, np.flatnonzero(first)), take(events, np.flatnonzero(~first))


def held_out_splits(
    events: layouts.Events, rng: np.random.Generator, draws: int = FLOOR_DRAWS, parity: bool = True
) -> list[tuple[layouts.Events, layouts.Events]]:
    """`draws` splits of held-out events in two: (true, other), by parity first (unless `parity` is False: the
    caller has that one already), then at random."""
    first = [split_halves(events)] if parity else []
    return first + [split_halves(events, rng) for _ in range(draws - 1)]


def quality(
    generated: layouts.Events | list[layouts.Events],
    true: layouts.Events,
    floor_samples: layouts.Events | list[layouts.Events],
    reference: layouts.Events,
    only: tuple[str, ...] = FEATURES,
) -> dict[str, Any]:
    """ours (generated vs true), the floor (each floor sample vs true: independent truth samples of the same
    primaries) and the baseline (`reference` looked up at true's primaries), judged per feature and bin. Several
    generated samples (draws of the generator for the same primaries) are averaged like the floor's."""
    samples = floor_samples if isinstance(floor_samples, list) else [floor_samples]
    draws = generated if isinstance(generated, list) else [generated]
    grouped = Grouped(true, only)
    ours = mean_distances([distances(g, grouped, only) for g in draws])
    floor = mean_distances([distances(sample, grouped, only) for sample in samples])
    base = distances(baseline_events(reference, true.primaries), grouped, only)
    return judge(ours, base, floor)


def quality_over_splits(
    runs: list[tuple[layouts.Events, layouts.Events, layouts.Events]], only: tuple[str, ...] = FEATURES
) -> dict[str, Any]:
    """Held-out events: `runs` of (generated FOR THE OTHER HALF'S PRIMARIES, a split's true half, the other
    half); ours (generated vs the true half), the floor (other half vs the true half: the same primaries as
    ours) and the baseline (the other half looked up at the true half's primaries) each averaged over the
    splits, bin by bin, then judged as `quality` does."""
    ours, floor, base = [], [], []
    for generated, true, other in runs:
        if len(generated) != len(other):
            raise ValueError(f"{len(generated)} generated events for the other half's {len(other)} primaries")
        grouped = Grouped(true, only)
        ours.append(distances(generated, grouped, only))
        floor.append(distances(other, grouped, only))
        base.append(distances(baseline_events(other, true.primaries), grouped, only))
    return judge(mean_distances(ours), mean_distances(base), mean_distances(floor))
