"""Per-feature, per-bin quality of generated bundles against the statistical floor and a baseline.

A figure alone says nothing: a W1 of 0.02 may be perfect (two samples of the truth differ that much) or poor.
So every feature is judged per bin of primary energy x zenith against
- the FLOOR: the same figure between two independent samples of the truth of the same size (what a perfect
  generator would show); for the synthetic truth, fresh bundles for the same primaries, its mean over
  FLOOR_DRAWS independent draws (one draw's W1 varies by a factor 2-4 in the bins whose muons come from a few
  large events: a single draw would fail a perfect generator by chance; ours is averaged over as many draws
  of the generator, the same estimator on both sides); for held-out files, the other half
  of the events, over FLOOR_DRAWS splits in two (by parity, then at random): each split's half is
  generated for and compared with, ours, the floor and the baseline are each the mean over the splits;
- the BASELINE: bundles that ignore the primary (multiplicities from the marginal, muons from the pool of all
  muons of an independent reference sample).

Features (values in log10 units; W1 in those units, KS unitless):
- multiplicity: log10(N + 1) per event (every event);
- energy: log10(E / GeV) per muon; lateral_distance: log10(r / m) per muon (r floored at 1 cm);
- energy_sum: log10(sum E / GeV) per event with at least one muon;
- centre_radius: log10 of the distance of the bundle's centre (mean x, y) from the shower axis, per event with
  at least one muon (floored at 1 cm);
- spread: log10 of the rms distance of the muons from the bundle's centre, per event with at least two muons
  (floored at 1 cm).

The goal per feature and bin (bins with at least MIN_VALUES true values): ours <= max(2 x floor, 0.5 x
baseline), and ours not above the baseline unless ours is within 2 x floor (there the two cannot be told
apart). A feature meets the goal when all its bins do; nothing is averaged over features.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from hpctrain.workloads.muons.events import layouts

FEATURES = ("multiplicity", "energy", "lateral_distance", "energy_sum", "centre_radius", "spread")
PER_MUON = ("energy", "lateral_distance")
ENERGY_BINS_LOG10_GEV = (3.0, 5.0, 6.0, 7.0, 8.0, 9.0)
ZENITH_BANDS_DEG = (0.0, 30.0, 45.0, 60.0, 75.0)  # cos(zenith) >= 0.3 in the truth: up to 72.5 deg
R_FLOOR_M = 0.01
MIN_VALUES = 100  # a bin with fewer true values of a feature is shown, not judged


def goal_word(feature: dict[str, Any]) -> str:
    """met / NOT met, or, where no bin had enough true values to judge, says so: "0/0 NOT met" read as a
    failure of a model nobody judged."""
    if not feature["bins_judged"]:
        return f"not judged (no bin has {MIN_VALUES} true values: evaluate more events)"
    return "met" if feature["goal_met"] else "NOT met"


FLOOR_FACTOR, BASELINE_FACTOR = 2.0, 0.5
FLOOR_DRAWS = 4  # independent truth samples averaged into the floor (synthetic truth)


def w1_and_ks(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """(W1, KS) of the empirical distributions of a and b from one pair of sorts: W1 = the integral of
    |CDF_a - CDF_b|, KS = its sup; (NaN, NaN) if one is empty. The grid is the merge of the two sorted samples
    (a stable sort merges two sorted runs in one pass): a 50 k-event judgement spent 3 of its 4 minutes
    sorting the same muons again for W1 and KS."""
    if len(a) == 0 or len(b) == 0:
        return math.nan, math.nan
    a, b = np.sort(a), np.sort(b)
    grid = np.sort(np.concatenate([a, b]), kind="stable")
    gap = np.abs(
        np.searchsorted(a, grid, side="right") / len(a) - np.searchsorted(b, grid, side="right") / len(b)
    )
    return float(np.sum(gap[:-1] * np.diff(grid))), float(gap.max())


def wasserstein_1d(a: np.ndarray, b: np.ndarray) -> float:
    """W1 between the empirical distributions of a and b (integral of |CDF_a - CDF_b|); NaN if one is empty."""
    return w1_and_ks(a, b)[0]


def ks_statistic(a: np.ndarray, b: np.ndarray) -> float:
    """sup |CDF_a - CDF_b|; NaN if one is empty."""
    return w1_and_ks(a, b)[1]


def _log_floor(values: np.ndarray) -> np.ndarray:
    return np.log10(np.maximum(values, R_FLOOR_M))


def features(
    events: layouts.Events, only: tuple[str, ...] = FEATURES
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """feature -> (values, event of each value), vectorised over the ragged events (no per-event Python);
    only the multiplicity when that is all `only` asks (a multiplicity model's events carry no muons)."""
    n = len(events)
    counts = events.counts
    if only == ("multiplicity",):
        return {"multiplicity": (np.log10(counts + 1.0), np.arange(n))}
    per_muon_event = np.repeat(np.arange(n), counts)  # (M,)
    muons = events.muons.astype(np.float64)
    r = np.hypot(muons[:, 1], muons[:, 2])
    safe = np.maximum(counts, 1).astype(np.float64)
    energy_sum = np.bincount(per_muon_event, muons[:, 0], n)  # (n,)
    cx = np.bincount(per_muon_event, muons[:, 1], n) / safe
    cy = np.bincount(per_muon_event, muons[:, 2], n) / safe
    dx, dy = muons[:, 1] - cx[per_muon_event], muons[:, 2] - cy[per_muon_event]
    spread = np.sqrt(np.bincount(per_muon_event, dx * dx + dy * dy, n) / safe)
    some, several = np.flatnonzero(counts >= 1), np.flatnonzero(counts >= 2)
    return {
        "multiplicity": (np.log10(counts + 1.0), np.arange(n)),
        "energy": (np.log10(np.maximum(muons[:, 0], 1e-30)), per_muon_event),
        "lateral_distance": (_log_floor(r), per_muon_event),
        "energy_sum": (np.log10(np.maximum(energy_sum[some], 1e-30)), some),
        "centre_radius": (_log_floor(np.hypot(cx, cy)[some]), some),
        "spread": (_log_floor(spread[several]), several),
    }


def bin_labels() -> list[str]:
    e, z = ENERGY_BINS_LOG10_GEV, ZENITH_BANDS_DEG
    return [
        f"E{e[i]:g}-{e[i + 1]:g}/z{z[j]:g}-{z[j + 1]:g}" for i in range(len(e) - 1) for j in range(len(z) - 1)
    ]


def event_bins(primaries: np.ndarray) -> np.ndarray:
    """(n,) bin of each event: energy bin * zenith bands + zenith band (physical primaries)."""
    e = np.digitize(np.log10(primaries[:, 0]), ENERGY_BINS_LOG10_GEV[1:-1])
    z = np.digitize(np.degrees(primaries[:, 1]), ZENITH_BANDS_DEG[1:-1])
    return e * (len(ZENITH_BANDS_DEG) - 1) + z


def distances(
    generated: layouts.Events, true: layouts.Events, only: tuple[str, ...] = FEATURES
) -> dict[str, dict[str, Any]]:
    """feature -> {"w1", "ks" (overall), "bins": {label: {"w1", "ks", "n_true", "n_generated"}}}."""
    gen_f, true_f = features(generated, only), features(true, only)
    gen_bin, true_bin = event_bins(generated.primaries), event_bins(true.primaries)
    labels = bin_labels()
    out: dict[str, dict[str, Any]] = {}
    for name in only:
        (gv, ge), (tv, te) = gen_f[name], true_f[name]
        gb, tb = gen_bin[ge], true_bin[te]
        # values grouped by bin once (argsort), not one mask per bin
        g_order, t_order = np.argsort(gb, kind="stable"), np.argsort(tb, kind="stable")
        g_cuts = np.searchsorted(gb[g_order], np.arange(len(labels) + 1))
        t_cuts = np.searchsorted(tb[t_order], np.arange(len(labels) + 1))
        bins = {}
        for i, label in enumerate(labels):
            a = gv[g_order[g_cuts[i] : g_cuts[i + 1]]]
            b = tv[t_order[t_cuts[i] : t_cuts[i + 1]]]
            w1, ks = w1_and_ks(a, b)
            bins[label] = {"w1": w1, "ks": ks, "n_true": len(b), "n_generated": len(a)}
        w1, ks = w1_and_ks(gv, tv)
        out[name] = {"w1": w1, "ks": ks, "bins": bins}
    return out


def baseline_events(
    reference: layouts.Events, primaries: np.ndarray, rng: np.random.Generator
) -> layouts.Events:
    """Bundles that ignore the primary: counts drawn from the reference's marginal, muons from its pool."""
    n = len(primaries)
    counts = rng.choice(reference.counts, size=n) if len(reference) else np.zeros(n, np.int64)
    total = int(counts.sum())
    if len(reference.muons):
        muons = reference.muons[rng.integers(0, len(reference.muons), total)]
    else:
        counts = np.zeros(n, np.int64)
        muons = np.zeros((0, 3), np.float32)
    ids = np.stack([np.zeros(n, np.int64), np.arange(n, dtype=np.int64)], 1)
    return layouts.Events(np.asarray(primaries, np.float32), muons, counts.astype(np.int64), ids)


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
    out = []
    for keep in (first, ~first):
        mask = np.repeat(keep, events.counts)
        out.append(
            layouts.Events(events.primaries[keep], events.muons[mask], events.counts[keep], events.ids[keep])
        )
    return out[0], out[1]


def held_out_splits(
    events: layouts.Events, rng: np.random.Generator, draws: int = FLOOR_DRAWS, parity: bool = True
) -> list[tuple[layouts.Events, layouts.Events]]:
    """`draws` splits of held-out events in two: (true, other), by parity first (unless `parity` is False: the
    caller has that one already), then at random."""
    first = [split_halves(events)] if parity else []
    return first + [split_halves(events, rng) for _ in range(draws - 1)]


def _mean(values: list[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return float(np.mean(finite)) if finite else math.nan


def judge(
    ours: dict[str, dict[str, Any]],
    baseline: dict[str, dict[str, Any]],
    floor: dict[str, dict[str, Any]],
) -> dict[str, Any]:
    """Per feature and bin: the goal (see the module docstring); per feature: mean W1/KS over judged bins,
    bins meeting the goal, `ratio` = sum baseline / sum ours over the bins where the baseline is above
    2 x floor (None when there are none: the baseline is as good as the truth there), and `within_floor`
    (mean W1 of ours <= 2 x that of the floor). Summary: `min_feature_ratio`, `features_within_floor`,
    `features_goal_met`, `goal_met`."""
    per_feature: dict[str, Any] = {}
    for name, mine in ours.items():
        rows = []
        for label, o in mine["bins"].items():
            b, f = baseline[name]["bins"][label], floor[name]["bins"][label]
            judged = (
                o["n_true"] >= MIN_VALUES
                and f["n_generated"] >= MIN_VALUES
                and all(math.isfinite(x["w1"]) for x in (o, b, f))
            )
            row = {"bin": label, "n_true": o["n_true"], "judged": judged}
            for key in ("w1", "ks"):
                row[f"ours_{key}"], row[f"baseline_{key}"], row[f"floor_{key}"] = o[key], b[key], f[key]
            if judged:
                w, bw, fw = o["w1"], b["w1"], f["w1"]
                within = w <= FLOOR_FACTOR * fw
                row["ok"] = bool(w <= max(FLOOR_FACTOR * fw, BASELINE_FACTOR * bw) and (w <= bw or within))
            rows.append(row)
        judged_rows = [r for r in rows if r["judged"]]
        informative = [r for r in judged_rows if r["baseline_w1"] > FLOOR_FACTOR * r["floor_w1"]]
        ratio = (
            sum(r["baseline_w1"] for r in informative) / max(sum(r["ours_w1"] for r in informative), 1e-12)
            if informative
            else None
        )
        summary = {
            key: _mean([r[key] for r in judged_rows])
            for key in ("ours_w1", "baseline_w1", "floor_w1", "ours_ks", "baseline_ks", "floor_ks")
        }
        worst = max(judged_rows, key=lambda r: r["ours_w1"] / max(r["floor_w1"], 1e-12), default=None)
        per_feature[name] = {
            **summary,
            "bins_judged": len(judged_rows),
            "bins_ok": sum(bool(r["ok"]) for r in judged_rows),
            "goal_met": bool(judged_rows) and all(r["ok"] for r in judged_rows),
            "ratio": ratio,
            "within_floor": bool(summary["ours_w1"] <= FLOOR_FACTOR * summary["floor_w1"]),
            "worst_bin": None if worst is None else worst["bin"],
            "overall_w1": {
                "ours": ours[name]["w1"],
                "baseline": baseline[name]["w1"],
                "floor": floor[name]["w1"],
            },
            "bins": rows,
        }
    ratios = [f["ratio"] for f in per_feature.values() if f["ratio"] is not None]
    return {
        "features": per_feature,
        "min_feature_ratio": min(ratios) if ratios else None,
        "features_within_floor": sum(f["within_floor"] for f in per_feature.values()),
        "features_goal_met": sum(f["goal_met"] for f in per_feature.values()),
        "goal_met": all(f["goal_met"] for f in per_feature.values()),
    }


def _fmt(v: Any, width: int = 9) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return f"{'n/a':>{width}}"
    if isinstance(v, float):  # a ratio over an exact copy's 0 is huge: kept within its column
        return f"{v:>{width}.4f}" if abs(v) < 1e4 else f"{v:>{width}.3g}"
    return f"{v!s:>{width}}"


def table(judged: dict[str, Any]) -> list[str]:
    """The per-feature table as text lines (mean W1 and KS over the judged bins)."""
    head = (
        f"{'feature':<17}{'ours W1':>9}{'base W1':>9}{'floor W1':>9}{'ours KS':>9}{'base KS':>9}"
        f"{'floor KS':>9}{'base/ours':>10}{'bins ok':>9}  goal"
    )
    lines = [head]
    for name, f in judged["features"].items():
        lines.append(
            f"{name:<17}{_fmt(f['ours_w1'])}{_fmt(f['baseline_w1'])}{_fmt(f['floor_w1'])}{_fmt(f['ours_ks'])}"
            f"{_fmt(f['baseline_ks'])}{_fmt(f['floor_ks'])}{_fmt(f['ratio'], 10)}"
            f"{f['bins_ok']:>4}/{f['bins_judged']:<4}  {goal_word(f)}"
        )
    return lines


def mean_distances(each: list[dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """The mean of several `distances` results, figure by figure and bin by bin (NaN where one is NaN)."""
    if len(each) == 1:
        return each[0]
    out: dict[str, dict[str, Any]] = {}
    for name, first in each[0].items():
        bins = {
            label: {
                "w1": float(np.mean([d[name]["bins"][label]["w1"] for d in each])),
                "ks": float(np.mean([d[name]["bins"][label]["ks"] for d in each])),
                "n_true": row["n_true"],
                "n_generated": min(d[name]["bins"][label]["n_generated"] for d in each),
            }
            for label, row in first["bins"].items()
        }
        out[name] = {
            "w1": float(np.mean([d[name]["w1"] for d in each])),
            "ks": float(np.mean([d[name]["ks"] for d in each])),
            "bins": bins,
        }
    return out


def quality(
    generated: layouts.Events | list[layouts.Events],
    true: layouts.Events,
    floor_samples: layouts.Events | list[layouts.Events],
    reference: layouts.Events,
    rng: np.random.Generator,
    only: tuple[str, ...] = FEATURES,
) -> dict[str, Any]:
    """ours (generated vs true), the floor (each floor sample vs true: independent truth samples of the same
    size; with several, the mean of their distances: one draw is noisy, see FLOOR_DRAWS) and the baseline
    (from `reference`, for true's primaries), judged per feature and bin. Several generated samples (draws of
    the generator for the same primaries) are averaged like the floor's: the same estimator on both sides."""
    samples = floor_samples if isinstance(floor_samples, list) else [floor_samples]
    draws = generated if isinstance(generated, list) else [generated]
    base = baseline_events(reference, true.primaries, rng)
    ours = mean_distances([distances(g, true, only) for g in draws])
    floor = mean_distances([distances(sample, true, only) for sample in samples])
    return judge(ours, distances(base, true, only), floor)


def quality_over_splits(
    runs: list[tuple[layouts.Events, layouts.Events, layouts.Events]],
    rng: np.random.Generator,
    only: tuple[str, ...] = FEATURES,
) -> dict[str, Any]:
    """Held-out events: `runs` of (generated for a split's true half, that half, the other half); ours, the
    floor (other half vs true half) and the baseline (from the other half) each averaged over the splits,
    bin by bin, then judged as `quality` does."""
    ours = mean_distances([distances(gen, true, only) for gen, true, _ in runs])
    floor = mean_distances([distances(other, true, only) for _, true, other in runs])
    base = mean_distances(
        [distances(baseline_events(other, true.primaries, rng), true, only) for _, true, other in runs]
    )
    return judge(ours, base, floor)
