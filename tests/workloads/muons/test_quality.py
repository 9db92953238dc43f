"""The per-feature, per-bin table (quality.py): the floor and its tolerance from truth-vs-truth replicates, the
nearest-primary baseline, the bins of mass and depth, the tail and leading-muon features, one muon cap on both
sides, held-out halves judged symmetrically; on truth v1 and v2."""

from __future__ import annotations

import math
from functools import cache

import numpy as np
import pytest

from hpctrain.runtime.seeding import numpy_rng
from hpctrain.workloads.muons.evaluation import evaluate, quality
from hpctrain.workloads.muons.events import layouts
from hpctrain.workloads.muons.truth import v1 as truth
from hpctrain.workloads.muons.truth import versions as truth_versions

CAP = 2000  # the quick config's cap (configs/muons.yaml keeps every event)
ENERGY_AND_N = ("multiplicity", "energy", "energy_sum")
EVENTS = 4000
DRAWS = range(50, 50 + quality.FLOOR_DRAWS)  # stream keys of the stand-ins' draws (the table's are below)


@cache
def table_samples(version: str, seed: int = 3) -> tuple[layouts.Events, list, layouts.Events, list]:
    """(true, floor draws, baseline reference, fresh truth draws for the true primaries) as evaluate draws them."""
    true, floor, reference, _ = evaluate.reference_samples(EVENTS, seed, CAP, None, version)
    fresh = [evaluate.paired_truth(true.primaries, seed, key, CAP, version) for key in DRAWS]
    return true, floor, reference, fresh


def with_muons(events: layouts.Events, muons: np.ndarray) -> layouts.Events:
    return layouts.Events(events.primaries, muons.astype(np.float32), events.counts, events.ids)


def shifted(events: layouts.Events, energy_factor: float) -> layouts.Events:
    return with_muons(events, events.muons * np.float32([energy_factor, 1, 1]))


def failing_bins(judged: dict, name: str) -> list[str]:
    return [r["bin"] for r in judged["features"][name]["bins"] if r["judged"] and not r["ok"]]


def test_features_are_per_event_quantities_of_the_ragged_bundles() -> None:
    # event 0: two muons at (3, 4) and (-3, 4) m; event 1: empty; event 2: one muon at (0, 0)
    muons = np.array([[10.0, 3.0, 4.0], [30.0, -3.0, 4.0], [5.0, 0.0, 0.0]], np.float32)
    events = layouts.Events(
        np.ones((3, 4), np.float32), muons, np.array([2, 0, 1]), np.zeros((3, 2), np.int64)
    )
    f = quality.features(events)
    assert np.allclose(f["energy_sum"][0], np.log10([40.0, 5.0])) and f["energy_sum"][1].tolist() == [0, 2]
    assert np.allclose(f["centre_radius"][0], [np.log10(4.0), np.log10(quality.R_FLOOR_M)])
    assert np.allclose(f["spread"][0], [np.log10(3.0)]) and f["spread"][1].tolist() == [0]
    assert np.allclose(f["lateral_distance"][0], np.log10([5.0, 5.0, quality.R_FLOOR_M]))
    assert np.allclose(f["multiplicity"][0], np.log10([3.0, 1.0, 2.0]))
    # the leading muon: the 30 GeV one of event 0 (at 5 m), the only one of event 2
    assert np.allclose(f["leading_energy"][0], np.log10([30.0, 5.0])) and f["leading_energy"][1].tolist() == [
        0,
        2,
    ]
    assert np.allclose(f["leading_fraction"][0], [np.log10(0.75)]) and f["leading_fraction"][1].tolist() == [
        0
    ]
    assert np.allclose(f["leading_radius"][0], [np.log10(5.0)]) and f["leading_radius"][1].tolist() == [0]
    assert f["energy_tail"][0] is f["energy"][0]  # the tail compares the muon energies, in their top 1 %


def test_every_event_has_a_bin_of_energy_and_of_each_of_zenith_mass_and_depth() -> None:
    labels = quality.bin_labels()
    primaries = np.array([[2e3, 0.1, 0.938, 1000.0], [5e8, 1.2, 52.1, 2700.0]])
    bins = quality_bins(primaries)
    assert bins == [
        ["E3-5/z0-30", "E3-5/A1-6", "E3-5/d0-1600"],
        ["E8-9/z60-75", "E8-9/A30-100", "E8-9/d2200-3000"],
    ]
    assert len(labels) == len(set(labels)) == 5 * (4 + 3 + 3)


def quality_bins(primaries: np.ndarray) -> list[list[str]]:
    from hpctrain.workloads.muons.evaluation.quality_features import event_bins

    labels = quality.bin_labels()
    return [[labels[b] for b in row] for row in event_bins(primaries)]


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_a_fresh_truth_draw_meets_every_feature_and_each_has_a_ratio(version: str) -> None:
    true, floor, reference, fresh = table_samples(version)
    judged = quality.quality(fresh, true, floor, reference)
    failed = {n: failing_bins(judged, n) for n, f in judged["features"].items() if not f["goal_met"]}
    assert judged["goal_met"] and not failed, failed
    assert judged["features_within_floor"] == len(quality.FEATURES)
    for name, f in judged["features"].items():
        # every feature is judged and has a ratio (the energy too, whose baseline is as good as the floor)
        assert f["bins_judged"] > 0 and f["ratio"] is not None and math.isfinite(f["ratio"]), name
        # the tolerance comes from the replicates: above the floor, below the old fixed 2 x floor in most bins
        rows = [r for r in f["bins"] if r["judged"]]
        assert all(r["tolerance"] > r["floor_w1"] for r in rows), name
    assert judged["min_feature_ratio"] == min(f["ratio"] for f in judged["features"].values())
    lines = quality.table(judged)
    assert lines[0].startswith("feature") and len(lines) == 1 + len(quality.FEATURES)


def blind(true: layouts.Events, version: str, seed: int, key: int) -> layouts.Events:
    """Truth bundles for the primaries with mass and depth redrawn from the prior (a generator that ignores
    them), labelled with the true primaries."""
    seen = true.primaries.astype(np.float64).copy()
    seen[:, 2:] = truth_versions.get(version).sample_primaries(len(seen), numpy_rng(seed, key))[:, 2:]
    drawn = evaluate.paired_truth(seen, seed, key, CAP, version)
    return layouts.Events(true.primaries, drawn.muons, drawn.counts, true.ids)


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_a_stand_in_that_ignores_mass_and_depth_fails_in_the_mass_and_depth_bins(version: str) -> None:
    true, floor, reference, _ = table_samples(version)
    judged = quality.quality([blind(true, version, 3, k) for k in DRAWS], true, floor, reference)
    assert not judged["goal_met"] and not judged["features"]["multiplicity"]["goal_met"]
    failed = [b for name in quality.FEATURES for b in failing_bins(judged, name)]
    assert any("/A" in b for b in failed) and any("/d" in b for b in failed), failed


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_wrong_tails_fail_the_tail_feature(version: str) -> None:
    """The top 0.1 % of the muon energies x3: invisible in a W1 over all muons (~0.0005), caught by the tail."""
    true, floor, reference, fresh = table_samples(version)
    top = np.quantile(np.concatenate([f.muons[:, 0] for f in fresh]), 0.999)
    tails = [with_muons(f, f.muons * np.where(f.muons[:, :1] >= top, [3, 1, 1], [1, 1, 1])) for f in fresh]
    judged = quality.quality(tails, true, floor, reference)
    assert not judged["features"]["energy_tail"]["goal_met"], judged["features"]["energy_tail"]
    assert failing_bins(judged, "energy_tail")


def test_positions_shuffled_within_events_fail_the_leading_muons_distance() -> None:
    """Shuffled positions keep every per-muon and per-event marginal but the one feature that joins a muon's
    energy and its position."""
    true, floor, reference, fresh = table_samples("v1")
    rng = np.random.default_rng(0)
    shuffled = []
    for f in fresh:
        event = np.repeat(np.arange(len(f)), f.counts)
        order = np.lexsort((rng.random(len(event)), event))  # a random order within each event
        shuffled.append(with_muons(f, np.concatenate([f.muons[:, :1], f.muons[order, 1:]], 1)))
    judged = quality.quality(shuffled, true, floor, reference)
    failed = {n for n, f in judged["features"].items() if not f["goal_met"]}
    assert failed == {"leading_radius"}, failed


def primary_blind_baseline(reference: layouts.Events, n: int, rng: np.random.Generator) -> layouts.Events:
    """The old baseline: counts from the reference's marginal, muons from the pool of all its muons."""
    counts = rng.choice(reference.counts, size=n)
    muons = reference.muons[rng.integers(0, len(reference.muons), int(counts.sum()))]
    return layouts.Events(np.zeros((n, 4), np.float32), muons, counts, np.zeros((n, 2), np.int64))


def test_the_nearest_primary_baseline_beats_the_primary_blind_one() -> None:
    true, _, reference, _ = table_samples("v2")
    new = quality.distances(quality.baseline_events(reference, true.primaries), true)
    old_events = primary_blind_baseline(reference, len(true), np.random.default_rng(0))
    old = quality.distances(
        layouts.Events(true.primaries, old_events.muons, old_events.counts, true.ids), true
    )

    def total(d: dict, name: str) -> float:
        return sum(b["w1"] for b in d[name]["bins"].values() if b["n_true"] >= quality.MIN_VALUES)

    for name in ("multiplicity", "energy_sum", "leading_energy", "lateral_distance", "spread"):
        assert total(new, name) < 0.6 * total(old, name), (name, total(new, name), total(old, name))
    # the lookup: each primary's nearest reference primary (standardised log E, cos zenith, log mass, depth)
    rows = quality.nearest_primaries(reference.primaries, true.primaries[:5])
    space = quality.primary_space(reference.primaries)
    scale = space.std(0)
    for i, row in enumerate(rows):
        d = np.linalg.norm((space - quality.primary_space(true.primaries[i : i + 1])) / scale, axis=1)
        assert row == int(np.argmin(d))


def test_an_event_above_the_cap_is_clamped_the_same_way_on_every_side() -> None:
    """The generator clamps N at the cap; the true events, the floor's and the classifier's truth bundles keep an
    event above it with its first `cap` muons (they used to drop it, or redraw it)."""
    cap = 30
    full, _ = evaluate.truth_events(2000, 5, 0, "v2")  # no cap
    events, clamped = evaluate.truth_events(2000, 5, cap, "v2")
    above = full.counts > cap
    assert clamped == int(above.sum()) > 0 and len(events) == len(full)
    assert np.array_equal(events.counts, np.minimum(full.counts, cap))
    first = np.flatnonzero(above)[0]
    start = int(full.offsets[first])
    got = events.muons[events.offsets[first] : events.offsets[first + 1]]
    assert np.array_equal(
        got, full.muons[start : start + cap]
    )  # the first `cap` (v2: the leading muon first)
    # the floor's draws and the classifier's replicates: one rule
    drawn = evaluate.paired_truth(full.primaries, 5, 9, cap, "v2")
    again = evaluate.paired_truth(full.primaries, 5, 9, 0, "v2")
    clamped_again, _ = quality.clamp_to_cap(again, cap)
    assert np.array_equal(drawn.counts, clamped_again.counts) and np.array_equal(
        drawn.muons, clamped_again.muons
    )
    assert drawn.counts.max() == cap
    # held-out files: events above the cap are clamped too, not dropped
    true, floor, _, held_clamped = evaluate.reference_samples(0, 5, cap, full, "v2")
    assert held_clamped == clamped and len(true) + len(floor[0]) == len(full)
    assert max(true.counts.max(), floor[0].counts.max()) == cap


def test_held_out_halves_are_judged_symmetrically() -> None:
    """Ours is drawn for the other half's primaries, as the floor's bundles (the other half's) are: a perfect
    generator then shows the floor's figures; drawn for the judged half's own primaries it looked better than
    the floor (it was spared the difference of the two halves' primaries)."""
    events, _ = evaluate.truth_events(4000, 11, CAP, "v1")
    splits = quality.held_out_splits(events, np.random.default_rng(3))
    assert len(splits) == quality.FLOOR_DRAWS
    for half, other in splits:  # complementary halves of every event, muons with their events
        assert len(half) + len(other) == len(events) and len(half.muons) + len(other.muons) == len(
            events.muons
        )
        assert np.array_equal(
            np.sort(np.concatenate([half.ids[:, 1], other.ids[:, 1]])), np.arange(len(events))
        )
    assert np.array_equal(splits[0][0].ids[:, 1], np.arange(0, len(events), 2))  # the first: by parity
    perfect = [
        (evaluate.paired_truth(o.primaries, 11, 20 + i, CAP, "v1"), h, o) for i, (h, o) in enumerate(splits)
    ]
    same = quality.quality_over_splits(perfect)  # every feature: the held-out table of `hpctrain evaluate`
    assert same["goal_met"], {n: failing_bins(same, n) for n in quality.FEATURES}
    mult = same["features"]["multiplicity"]
    assert 0.8 < mult["ours_w1"] / mult["floor_w1"] < 1.25, mult
    own = [(evaluate.paired_truth(h.primaries, 11, 20 + i, CAP, "v1"), h) for i, (h, _) in enumerate(splits)]
    old_ours = quality.mean_distances([quality.distances(g, h) for g, h in own])["multiplicity"]
    assert old_ours["w1"] < 0.8 * same["features"]["multiplicity"]["overall_w1"]["floor"]
    # muon energies x2 in every split: the energy and energy sum fail
    bad = quality.quality_over_splits([(shifted(g, 2.0), h, o) for g, h, o in perfect], ENERGY_AND_N)
    assert not bad["features"]["energy"]["goal_met"] and not bad["features"]["energy_sum"]["goal_met"]
    assert bad["features"]["multiplicity"]["goal_met"]
    with pytest.raises(ValueError, match="other half"):
        short = quality.take(splits[0][1], np.arange(len(splits[0][1]) - 1))  # one primary short
        quality.quality_over_splits([(short, splits[0][0], splits[0][1])])


def test_judge_per_bin_rules() -> None:
    def figures(w1: float, sd: float = math.nan, draws: int = 4) -> dict:
        row = {"w1": w1, "w1_sd": sd, "ks": 0.1, "n_true": 500, "n_generated": 500}
        return {"m": {"w1": w1, "w1_sd": sd, "ks": 0.1, "draws": draws, "bins": {"b": row}}}

    # floor 0.010 with replicates' sd 0.002 (4 draws each side): tolerance 0.010 + 5 x 0.002 x sqrt(1/4 + 1/4)
    tol = 0.01 + quality.TOLERANCE_SIGMAS * 0.002 * math.sqrt(0.5)
    ok = quality.judge(figures(tol - 1e-4, 0.002), figures(0.011), figures(0.01, 0.002))["features"]["m"]
    assert ok["goal_met"] and ok["within_floor"] and abs(ok["bins"][0]["tolerance"] - tol) < 1e-12
    # above the tolerance, and above half the baseline: fails; the ratio is defined all the same
    bad = quality.judge(figures(tol + 1e-3, 0.002), figures(0.02), figures(0.01, 0.002))
    assert not bad["features"]["m"]["goal_met"] and abs(bad["min_feature_ratio"] - 0.02 / (tol + 1e-3)) < 1e-9
    # outside the tolerance but at most half the baseline: met (better than a lookup by 2 x), not within the floor
    half = quality.judge(figures(0.03, 0.001), figures(0.08), figures(0.01, 0.001))["features"]["m"]
    assert half["goal_met"] and not half["within_floor"]
    # a floor of one draw (no spread): the tolerance takes DEFAULT_RELATIVE_SD of the floor
    single = quality.judge(figures(0.02, draws=1), figures(0.011), figures(0.01, draws=1))["features"]["m"]
    assert (
        abs(single["bins"][0]["tolerance"] - (0.01 + quality.TOLERANCE_SIGMAS * 0.005 * math.sqrt(2))) < 1e-12
    )
    # too few true values: shown, not judged; no ratio
    few = figures(0.5)
    few["m"]["bins"]["b"]["n_true"] = 10
    none = quality.judge(few, figures(0.1), figures(0.01))
    assert none["features"]["m"]["bins_judged"] == 0 and none["min_feature_ratio"] is None


def test_the_tail_distance_sees_the_top_of_the_distribution_only() -> None:
    rng = np.random.default_rng(0)
    a = np.sort(rng.standard_normal(100_000))
    b = a.copy()
    b[-100:] += 1.0  # the top 0.1 %
    w1, _ = quality.w1_and_ks(a, b)
    tail_w1, tail_ks = quality.tail_w1_and_ks(a, b)
    assert abs(w1 - 0.001) < 1e-9 and abs(tail_w1 - 0.1) < 0.01 and tail_ks > 0.05
    assert quality.tail_w1_and_ks(a, a.copy()) == (0.0, 0.0)


def test_a_feature_without_a_judged_bin_is_not_judged_not_failed() -> None:
    """Issue 31 item 4: "0/0 NOT met" read as a failure of a model nobody judged."""
    from hpctrain.workloads.muons.evaluation.quality import MIN_VALUES, goal_word

    assert goal_word({"bins_judged": 0, "goal_met": False}).startswith(
        f"not judged (no bin has {MIN_VALUES} "
    )
    assert goal_word({"bins_judged": 3, "goal_met": False}) == "NOT met"
    assert goal_word({"bins_judged": 3, "goal_met": True}) == "met"


def test_the_truth_modules_keep_their_muon_order() -> None:
    """clamp_to_cap keeps an event's first muons: a random subset for v1 (independent muons), v2's leading muon
    first. Pinned here so that a change of either sampler's order is seen."""
    primaries = truth.sample_primaries(3000, numpy_rng(1, 0))
    muons, counts = truth_versions.get("v2").sample_bundles(primaries, numpy_rng(1, 1))
    starts = (np.cumsum(counts) - counts)[counts >= 20]
    firsts = muons[starts, 0]
    seconds = muons[starts + 1, 0]
    assert np.median(firsts) > 1.5 * np.median(seconds)  # the leading muon's harder spectrum comes first
