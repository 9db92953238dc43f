"""Quality of generated bundles against fresh samples of the synthetic truth (or a held-out file).

Compared, overall and per bin of primary energy: the multiplicity as log10(N + 1), the muon energy as
log10(E / GeV) and the lateral distance as log10(r / m) (r floored at 1 cm). Figures: the 1-D Wasserstein
distance (in those log10 units) and the Kolmogorov-Smirnov statistic. `conditional_w1` is the mean W1 over
the three features and the energy bins that have data on both sides: the headline figure.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np

from hpctrain.workloads.muons import layouts, truth

ENERGY_BINS_LOG10_GEV = (3.0, 5.0, 6.0, 7.0, 8.0, 9.0)
FEATURES = ("multiplicity", "energy", "lateral_distance")
R_FLOOR_M = 0.01


def wasserstein_1d(a: np.ndarray, b: np.ndarray) -> float:
    """W1 between the empirical distributions of a and b (integral of |CDF_a - CDF_b|); NaN if one is empty."""
    if len(a) == 0 or len(b) == 0:
        return math.nan
    a, b = np.sort(a), np.sort(b)
    grid = np.concatenate([a, b])
    grid.sort()
    cdf_a = np.searchsorted(a, grid[:-1], side="right") / len(a)
    cdf_b = np.searchsorted(b, grid[:-1], side="right") / len(b)
    return float(np.sum(np.abs(cdf_a - cdf_b) * np.diff(grid)))


def ks_statistic(a: np.ndarray, b: np.ndarray) -> float:
    """sup |CDF_a - CDF_b|; NaN if one is empty."""
    if len(a) == 0 or len(b) == 0:
        return math.nan
    a, b = np.sort(a), np.sort(b)
    grid = np.concatenate([a, b])
    cdf_a = np.searchsorted(a, grid, side="right") / len(a)
    cdf_b = np.searchsorted(b, grid, side="right") / len(b)
    return float(np.max(np.abs(cdf_a - cdf_b)))


def features(events: layouts.Events) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """feature -> (values, event of each value): per event for the multiplicity, per muon otherwise."""
    n = len(events)
    per_muon_event = np.repeat(np.arange(n), events.counts)
    muons = events.muons.astype(np.float64)
    r = np.hypot(muons[:, 1], muons[:, 2])
    return {
        "multiplicity": (np.log10(events.counts + 1.0), np.arange(n)),
        "energy": (np.log10(np.maximum(muons[:, 0], 1e-30)), per_muon_event),
        "lateral_distance": (np.log10(np.maximum(r, R_FLOOR_M)), per_muon_event),
    }


def compare(
    generated: layouts.Events, true: layouts.Events, only: tuple[str, ...] = FEATURES
) -> dict[str, Any]:
    """W1 and KS overall and per primary-energy bin; {"metrics": flat, "per_bin": [...]}."""
    gen_f, true_f = features(generated), features(true)
    gen_bin = np.digitize(np.log10(generated.primaries[:, 0]), ENERGY_BINS_LOG10_GEV[1:-1])
    true_bin = np.digitize(np.log10(true.primaries[:, 0]), ENERGY_BINS_LOG10_GEV[1:-1])
    metrics: dict[str, float] = {}
    per_bin: list[dict[str, Any]] = []
    conditional: list[float] = []
    for name in only:
        (gv, ge), (tv, te) = gen_f[name], true_f[name]
        metrics[f"w1_{name}"] = wasserstein_1d(gv, tv)
        metrics[f"ks_{name}"] = ks_statistic(gv, tv)
    for i in range(len(ENERGY_BINS_LOG10_GEV) - 1):
        lo, hi = ENERGY_BINS_LOG10_GEV[i], ENERGY_BINS_LOG10_GEV[i + 1]
        row: dict[str, Any] = {"log10_E_GeV": [lo, hi], "events_true": int((true_bin == i).sum())}
        for name in only:
            (gv, ge), (tv, te) = gen_f[name], true_f[name]
            a, b = gv[gen_bin[ge] == i], tv[true_bin[te] == i]
            row[f"w1_{name}"] = wasserstein_1d(a, b)
            row[f"ks_{name}"] = ks_statistic(a, b)
            if math.isfinite(row[f"w1_{name}"]) and len(b) >= 20:
                conditional.append(row[f"w1_{name}"])
        per_bin.append(row)
        for key, value in row.items():
            if key.startswith(("w1_", "ks_")):
                metrics[f"{key}_E{lo:g}-{hi:g}"] = value
    metrics["conditional_w1"] = float(np.mean(conditional)) if conditional else math.nan
    return {"metrics": metrics, "per_bin": per_bin}


def distributions(generated: layouts.Events, true: layouts.Events, only: tuple[str, ...] = FEATURES) -> dict:
    """Binned generated vs true histograms in physical units, in the format of track/report.py."""
    gen_f, true_f = features(generated), features(true)
    specs = {
        "multiplicity": ("muons per event", "count", "events per bin"),
        "energy": ("muon energy", "GeV", "muons per bin"),
        "lateral_distance": ("lateral distance", "m", "muons per bin"),
    }
    out = {}
    for name in only:
        g, t = gen_f[name][0], true_f[name][0]
        both = np.concatenate([g, t])
        if both.size == 0:
            continue
        lo, hi = float(both.min()), float(both.max())
        edges_log = np.linspace(lo, hi if hi > lo else lo + 1.0, 41)
        label, unit, ylabel = specs[name]
        # multiplicity values are log10(N + 1): its bin edges in N + 1 (positive, so a log axis works)
        edges = 10.0**edges_log
        out[name] = {
            "label": label if name != "multiplicity" else "muons per event + 1",
            "unit": unit,
            "bins": edges.tolist(),
            "generated": np.histogram(g, edges_log)[0].astype(float).tolist(),
            "true": np.histogram(t, edges_log)[0].astype(float).tolist(),
            "y_label": ylabel,
            "log_x": True,
            "log_y": True,
        }
    return out


def truth_events(n: int, seed: int, cap: int) -> tuple[layouts.Events, int]:
    """Fresh truth events (from their own seed stream) without those above `cap` muons (as the loader skips
    them); also returns how many were dropped."""
    rng = np.random.default_rng([seed, 104729])
    primaries, muons, counts = truth.sample(n, rng)
    keep = counts <= cap if cap > 0 else np.ones(n, bool)
    mask = np.repeat(keep, counts)  # (sum counts,) muons of kept events
    events = layouts.Events(
        primaries[keep].astype(np.float32),
        muons[mask].astype(np.float32),
        counts[keep],
        np.stack([np.zeros(int(keep.sum()), np.int64), np.flatnonzero(keep)], 1),
    )
    return events, int((~keep).sum())


def evaluate_model(model: Any, n_events: int, seed: int, batch_size: int = 4096) -> dict[str, Any]:
    """Generate for the primaries of fresh truth events and compare; the result is evaluate.json's content."""
    import torch

    from hpctrain.workloads.muons import sampling
    from hpctrain.workloads.muons.task import muon_cap

    start = time.perf_counter()
    cap = muon_cap(model.cfg)
    true, dropped = truth_events(n_events, seed, cap)
    torch.manual_seed(seed)
    if model.model_type == "muon_multiplicity":
        counts = sampling.sample_counts(model, true.primaries, batch_size)
        generated = layouts.Events(true.primaries, np.zeros((0, 3), np.float32), counts, true.ids)
        only: tuple[str, ...] = ("multiplicity",)
    else:
        generated = sampling.generate_events(model, true.primaries, true.ids, batch_size)
        only = FEATURES
    result = compare(generated, true, only)
    result["distributions"] = distributions(generated, true, only)
    result["info"] = {
        "checkpoint": str(model.checkpoint),
        "step": model.step,
        "model_type": model.model_type,
        "events": len(true),
        "truth_events_dropped_above_cap": dropped,
        "muon_cap": cap,
        "seed": seed,
        "muons_generated": int(generated.counts.sum()),
        "muons_true": int(true.counts.sum()),
        "seconds": time.perf_counter() - start,
        "units": "W1 in log10(N+1), log10(E/GeV), log10(r/m)",
    }
    return result


def write_outputs(run_dir: Path, result: dict[str, Any]) -> Path:
    """evaluate.json (atomically) and one `eval_*` record appended to metrics.jsonl at the model's step."""
    from hpctrain.fsutil import atomic_write_text

    path = run_dir / "evaluate.json"
    atomic_write_text(path, json.dumps(clean(result), indent=1, allow_nan=False) + "\n")
    record: dict[str, Any] = {"step": result["info"]["step"]}
    record.update({f"eval_{k}": (v if math.isfinite(v) else None) for k, v in result["metrics"].items()})
    with open(run_dir / "metrics.jsonl", "a") as fh:
        fh.write(json.dumps(record) + "\n")
    return path


def clean(result: Any) -> Any:
    """NaN -> None everywhere (JSON has no NaN)."""
    if isinstance(result, dict):
        return {k: clean(v) for k, v in result.items()}
    if isinstance(result, list):
        return [clean(v) for v in result]
    if isinstance(result, float) and not math.isfinite(result):
        return None
    return result
