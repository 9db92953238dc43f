"""The verdict of the per-feature table: ours against the floor's tolerance and the baseline, bin by bin.

Why the tolerance comes from the floor's replicates, and what the baseline is: quality.py's docstring.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from hpctrain.workloads.muons.evaluation.quality_features import MIN_VALUES, min_values

BASELINE_FACTOR = 0.5  # ours <= this x the baseline meets the goal even outside the floor's tolerance
TOLERANCE_SIGMAS = 5.0  # standard deviations of ours - floor a bin may lie above the floor (~400 bins judged)
DEFAULT_RELATIVE_SD = 0.5  # a floor of one draw has no spread: one draw's W1 varies by about this much


def goal_word(feature: dict[str, Any], smoke: bool = False) -> str:
    """met / NOT met, or, where no bin had enough true values to judge, says so: "0/0 NOT met" read as a
    failure of a model nobody judged. `smoke`: a table of too few events to pass a model (verdict.py) says
    "smoke ok" where it would say met."""
    if not feature["bins_judged"]:
        return f"not judged (no bin has {MIN_VALUES} true values: evaluate more events)"
    if feature["goal_met"]:
        return "smoke ok" if smoke else "met"
    return "NOT met"


def _finite(*values: Any) -> bool:
    return all(v is not None and math.isfinite(v) for v in values)


def _relative_sd(floor: dict[str, Any], least: int) -> float:
    """The median relative spread (sd / mean) of the floor's replicates over the bins with `least` true
    values; DEFAULT_RELATIVE_SD without replicates."""
    ratios = [
        b["w1_sd"] / b["w1"]
        for b in floor["bins"].values()
        if b["n_true"] >= least and _finite(b.get("w1_sd"), b["w1"]) and b["w1"] > 0
    ]
    return float(np.median(ratios)) if ratios else DEFAULT_RELATIVE_SD


def tolerance(floor: dict[str, Any], ours: dict[str, Any], relative_sd: float) -> float:
    """The largest W1 of ours still within the floor: floor + TOLERANCE_SIGMAS x the standard deviation of
    ours - floor, sqrt(s_ours^2 / K_ours + s_floor^2 / K_floor) (each side a mean of K replicates of spread s,
    the s of either side at least relative_sd x floor). `floor`, `ours`: a bin's or the overall figures."""
    least = relative_sd * floor["w1"]

    def variance(side: dict[str, Any]) -> float:
        sd = side.get("w1_sd")
        return max(sd if _finite(sd) else 0.0, least) ** 2 / side.get("draws", 1)

    return float(floor["w1"] + TOLERANCE_SIGMAS * math.sqrt(variance(ours) + variance(floor)))


def _row(name: str, label: str, o: dict, b: dict, f: dict, relative_sd: float) -> dict[str, Any]:
    least = min_values(name)
    judged = o["n_true"] >= least and f["n_generated"] >= least and _finite(o["w1"], b["w1"], f["w1"])
    row: dict[str, Any] = {"bin": label, "n_true": o["n_true"], "judged": judged}
    for key in ("w1", "ks"):
        row[f"ours_{key}"], row[f"baseline_{key}"], row[f"floor_{key}"] = o[key], b[key], f[key]
    row["ours_w1_sd"], row["floor_w1_sd"] = o.get("w1_sd", math.nan), f.get("w1_sd", math.nan)
    row["tolerance"] = tolerance(f, o, relative_sd) if judged else math.nan
    if judged:
        row["within_floor"] = bool(o["w1"] <= row["tolerance"])
        row["ok"] = bool(row["within_floor"] or o["w1"] <= BASELINE_FACTOR * b["w1"])
    return row


def _mean(values: list[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return float(np.mean(finite)) if finite else math.nan


def judge_feature(name: str, ours: dict, baseline: dict, floor: dict) -> dict[str, Any]:
    """One feature's verdict (see `judge`)."""
    relative_sd = _relative_sd(floor, min_values(name))
    draws = {"draws": ours.get("draws", 1)}, {"draws": floor.get("draws", 1)}
    rows = [
        _row(
            name,
            label,
            {**o, **draws[0]},
            baseline["bins"][label],
            {**floor["bins"][label], **draws[1]},
            relative_sd,
        )
        for label, o in ours["bins"].items()
    ]
    judged_rows = [r for r in rows if r["judged"]]
    overall: dict[str, Any] = {"ours": ours["w1"], "baseline": baseline["w1"], "floor": floor["w1"]}
    overall["ours_sd"], overall["floor_sd"] = ours.get("w1_sd", math.nan), floor.get("w1_sd", math.nan)
    overall_judged = bool(judged_rows) and _finite(ours["w1"], baseline["w1"], floor["w1"])
    overall["tolerance"] = tolerance(floor, ours, relative_sd) if overall_judged else None
    overall["within_floor"] = overall_judged and ours["w1"] <= overall["tolerance"]
    overall["ok"] = overall["within_floor"] or (
        overall_judged and ours["w1"] <= BASELINE_FACTOR * baseline["w1"]
    )
    summary = {
        key: _mean([r[key] for r in judged_rows])
        for key in ("ours_w1", "baseline_w1", "floor_w1", "ours_ks", "baseline_ks", "floor_ks")
    }
    ours_sum = sum(r["ours_w1"] for r in judged_rows)
    worst = max(judged_rows, key=lambda r: r["ours_w1"] / max(r["tolerance"], 1e-12), default=None)
    return {
        **summary,
        "bins_judged": len(judged_rows),
        "bins_ok": sum(bool(r["ok"]) for r in judged_rows),
        "goal_met": bool(judged_rows) and all(r["ok"] for r in judged_rows) and bool(overall["ok"]),
        "ratio": sum(r["baseline_w1"] for r in judged_rows) / max(ours_sum, 1e-12) if judged_rows else None,
        "within_floor": bool(judged_rows)
        and all(r["within_floor"] for r in judged_rows)
        and bool(overall["within_floor"]),
        "worst_bin": None if worst is None else worst["bin"],
        "overall_w1": overall,
        "bins": rows,
    }


def judge(
    ours: dict[str, dict[str, Any]],
    baseline: dict[str, dict[str, Any]],
    floor: dict[str, dict[str, Any]],
) -> dict[str, Any]:
    """Per feature and bin, and over all bins together (`overall_w1`): within the floor's tolerance
    (`tolerance`), or ours <= BASELINE_FACTOR x baseline (`ok`); per feature: the means of W1/KS over the judged
    bins (for reading), `bins_ok` of `bins_judged`, `goal_met` (every judged bin and the all-bins figure ok),
    `ratio` = baseline / ours summed over the judged bins (None only for a feature without a judged bin),
    `within_floor` (every judged bin and the all-bins figure within the tolerance, the baseline aside).
    Summary: `min_feature_ratio` (over every judged feature), `features_within_floor`, `features_goal_met`,
    `goal_met`. Inputs: `distances`/`mean_distances` results (`w1_sd` and `draws` where replicated)."""
    per_feature = {
        name: judge_feature(name, mine, baseline[name], floor[name]) for name, mine in ours.items()
    }
    ratios = [f["ratio"] for f in per_feature.values() if f["ratio"] is not None]
    return {
        "features": per_feature,
        "min_feature_ratio": min(ratios) if ratios else None,
        "features_within_floor": sum(f["within_floor"] for f in per_feature.values()),
        "features_goal_met": sum(f["goal_met"] for f in per_feature.values()),
        "goal_met": all(f["goal_met"] for f in per_feature.values()),
    }


# What each column of the per-feature table means, one line each: under every copy of the table (the console
# of train and evaluate, evaluate.json's "legend", the report's table).
LEGEND = [
    "ours W1: 1-D Wasserstein distance of the model's bundles to the true ones, per bin of the primary, in the "
    "feature's log10 units (log10(N+1), log10(E/GeV), log10(r/m)); the table shows its mean over judged bins",
    "base W1: the same for the baseline, a lookup table (each event's bundle taken from the reference event of "
    "the nearest primary): what a generator must beat",
    "floor W1: the same between two independent true samples: what a perfect generator shows",
    "KS: the largest gap between the two CDFs (0..1), beside each W1",
    "base/ours: the baseline's W1 over ours, summed over the judged bins (> 1: ours beats the lookup)",
    f"bins ok: bins with at least {MIN_VALUES} true values (judged) where ours is within the floor's tolerance "
    f"(floor + {TOLERANCE_SIGMAS:g} sigma of ours - floor, from the replicates) or at most "
    f"{BASELINE_FACTOR:g} x base",
    "goal: met when every judged bin and all bins together are ok; nothing is averaged over features",
]


def _fmt(v: Any, width: int = 9) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return f"{'n/a':>{width}}"
    if isinstance(v, float):  # a ratio over an exact copy's 0 is huge: kept within its column
        return f"{v:>{width}.4f}" if abs(v) < 1e4 else f"{v:>{width}.3g}"
    return f"{v!s:>{width}}"


def table(judged: dict[str, Any], smoke: bool = False) -> list[str]:
    """The per-feature table as text lines (mean W1 and KS over the judged bins); `smoke`: as goal_word's."""
    head = (
        f"{'feature':<17}{'ours W1':>9}{'base W1':>9}{'floor W1':>9}{'ours KS':>9}{'base KS':>9}"
        f"{'floor KS':>9}{'base/ours':>10}{'bins ok':>9}  goal"
    )
    lines = [head]
    for name, f in judged["features"].items():
        lines.append(
            f"{name:<17}{_fmt(f['ours_w1'])}{_fmt(f['baseline_w1'])}{_fmt(f['floor_w1'])}{_fmt(f['ours_ks'])}"
            f"{_fmt(f['baseline_ks'])}{_fmt(f['floor_ks'])}{_fmt(f['ratio'], 10)}"
            f"{f['bins_ok']:>4}/{f['bins_judged']:<4}  {goal_word(f, smoke)}"
            + ("" if f["overall_w1"].get("ok", True) else " (all bins together outside the floor)")
        )
    return lines
