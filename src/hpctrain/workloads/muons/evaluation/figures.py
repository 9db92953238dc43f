"""The figures of generated bundles against true ones that need no judge: W1 and KS of the multiplicity, muon
energy and lateral distance overall and per bin of primary energy (`compare`, the first figures of the project:
log10(N + 1), log10(E / GeV), log10(r / m) with r floored at 1 cm; `conditional_w1` is the mean W1 over the
three features and the energy bins that have data on both sides), and the histograms `hpctrain report` draws
(`distributions`, `binned`). NumPy only: judging files (`judge_files.py`) needs no torch.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from hpctrain.workloads.muons.evaluation import quality
from hpctrain.workloads.muons.evaluation.quality import w1_and_ks
from hpctrain.workloads.muons.events import layouts

ENERGY_BINS_LOG10_GEV = (3.0, 5.0, 6.0, 7.0, 8.0, 9.0)
FEATURES = ("multiplicity", "energy", "lateral_distance")
R_FLOOR_M = 0.01


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
        metrics[f"w1_{name}"], metrics[f"ks_{name}"] = w1_and_ks(gv, tv)
    for i in range(len(ENERGY_BINS_LOG10_GEV) - 1):
        lo, hi = ENERGY_BINS_LOG10_GEV[i], ENERGY_BINS_LOG10_GEV[i + 1]
        row: dict[str, Any] = {"log10_E_GeV": [lo, hi], "events_true": int((true_bin == i).sum())}
        for name in only:
            (gv, ge), (tv, te) = gen_f[name], true_f[name]
            a, b = gv[gen_bin[ge] == i], tv[true_bin[te] == i]
            row[f"w1_{name}"], row[f"ks_{name}"] = w1_and_ks(a, b)
            if math.isfinite(row[f"w1_{name}"]) and len(b) >= 20:
                conditional.append(row[f"w1_{name}"])
        per_bin.append(row)
        for key, value in row.items():
            if key.startswith(("w1_", "ks_")):
                metrics[f"{key}_E{lo:g}-{hi:g}"] = value
    metrics["conditional_w1"] = float(np.mean(conditional)) if conditional else math.nan
    return {"metrics": metrics, "per_bin": per_bin}


DRAWN = {  # feature -> (label, unit, y label) of its histograms; values from quality.features()
    "multiplicity": ("muons per event", "count", "events per bin"),
    "energy": ("muon energy", "GeV", "muons per bin"),
    "lateral_distance": ("lateral distance", "m", "muons per bin"),
    "energy_sum": ("energy sum per event", "GeV", "events per bin"),
    "leading_energy": ("leading muon energy", "GeV", "events per bin"),
    "leading_fraction": ("leading muon's share of the energy sum", "fraction", "events per bin"),
    "leading_radius": ("lateral distance of the leading muon", "m", "events per bin"),
    "centre_radius": ("radius of the bundle's centre", "m", "events per bin"),
    "spread": ("bundle spread (rms from its centre)", "m", "events per bin"),
}


def drawn_features(only: tuple[str, ...]) -> tuple[str, ...]:
    """The features the histograms show for a model that generates `only`: every judged feature
    (quality.FEATURES, the pair quantities included; a tail feature is its body's histogram) when it generates
    muons, else just `only`."""
    return tuple(f for f in quality.FEATURES if f in DRAWN) if set(FEATURES) <= set(only) else only


def distributions(generated: layouts.Events, true: layouts.Events, only: tuple[str, ...] = FEATURES) -> dict:
    """Binned generated vs true histograms in physical units, in the format of track/report (data.py), with
    the overall W1 and KS (in the log10 units of quality.features) of each; every judged feature."""
    names = drawn_features(only)
    gen_f, true_f = quality.features(generated, names), quality.features(true, names)
    out = {}
    for name in names:
        g, t = gen_f[name][0], true_f[name][0]
        both = np.concatenate([g, t])
        if both.size == 0:
            continue
        lo, hi = float(both.min()), float(both.max())
        edges_log = np.linspace(lo, hi if hi > lo else lo + 1.0, 41)
        label, unit, ylabel = DRAWN[name]
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
        out[name]["w1"], out[name]["ks"] = w1_and_ks(g, t)
    return out


ZENITH_BANDS_DEG = (0.0, 30.0, 45.0, 60.0, 75.0)  # cos(zenith) >= truth.COS_ZENITH_MIN = 0.3: up to 72.5 deg
SMALL_MULTIPLICITY = 20  # integer bins up to here, log-spaced above


def _physical(name: str, values: np.ndarray) -> np.ndarray:
    """features() values (log10 units) back in physical units: N, E/GeV, r/m."""
    return np.rint(10.0**values - 1.0) if name == "multiplicity" else 10.0**values


def _edges(name: str, values: np.ndarray) -> np.ndarray:
    """Integer bins (centred on 0, 1, 2, ...) for small multiplicities, log-spaced above and for E and r."""
    top = float(values.max()) if values.size else 1.0
    if name == "multiplicity":
        small = np.arange(-0.5, min(top, SMALL_MULTIPLICITY) + 1.0)
        if top <= SMALL_MULTIPLICITY:
            return small
        return np.concatenate([small, np.geomspace(small[-1], top + 0.5, 16)[1:]])
    low = float(values[values > 0].min()) if np.any(values > 0) else 1e-2
    return np.geomspace(low, max(top, low * 10), 31)


def binned(generated: layouts.Events, true: layouts.Events, only: tuple[str, ...] = FEATURES) -> dict:
    """Histograms of generated and true in physical units per primary-energy bin and per zenith band, with W1
    and KS (in the log10 units of `compare`) per panel: {"energy": [panel, ...], "zenith": [...]}, a panel
    being {"by", "range", "events_true", "events_generated", "features": {name: {"edges", "true",
    "generated", "w1", "ks"}}} for every judged feature (drawn_features). Counts are raw (the same primaries
    on both sides): Poisson errors apply."""
    only = drawn_features(only)
    gen_f, true_f = quality.features(generated, only), quality.features(true, only)
    by = {
        "energy": (
            np.log10(generated.primaries[:, 0]),
            np.log10(true.primaries[:, 0]),
            ENERGY_BINS_LOG10_GEV,
        ),
        "zenith": (
            np.degrees(generated.primaries[:, 1]),
            np.degrees(true.primaries[:, 1]),
            ZENITH_BANDS_DEG,
        ),
    }
    edges = {n: _edges(n, _physical(n, np.concatenate([gen_f[n][0], true_f[n][0]]))) for n in only}
    out: dict[str, list[dict[str, Any]]] = {}
    for kind, (gen_key, true_key, bounds) in by.items():
        gen_bin = np.digitize(gen_key, bounds[1:-1])
        true_bin = np.digitize(true_key, bounds[1:-1])
        panels = []
        for i in range(len(bounds) - 1):
            panel: dict[str, Any] = {
                "by": kind,
                "range": [bounds[i], bounds[i + 1]],
                "events_true": int((true_bin == i).sum()),
                "events_generated": int((gen_bin == i).sum()),
                "features": {},
            }
            for name in only:
                (gv, ge), (tv, te) = gen_f[name], true_f[name]
                a, b = gv[gen_bin[ge] == i], tv[true_bin[te] == i]
                w1, ks = w1_and_ks(a, b)
                panel["features"][name] = {
                    "edges": edges[name].tolist(),
                    "generated": np.histogram(_physical(name, a), edges[name])[0].tolist(),
                    "true": np.histogram(_physical(name, b), edges[name])[0].tolist(),
                    "w1": w1,
                    "ks": ks,
                }
            panels.append(panel)
        out[kind] = panels
    return out


def sizes(generated: layouts.Events, true: layouts.Events, seed: int, start: float) -> dict[str, Any]:
    """What evaluate.json's "info" says of any judgement: seed, muons on each side, seconds since `start`
    (time.perf_counter), the units of the figures."""
    return {
        "seed": seed,
        "muons_generated": int(generated.counts.sum()),
        "muons_true": int(true.counts.sum()),
        "seconds": time.perf_counter() - start,
        "units": "W1 in log10(N+1), log10(E/GeV), log10(r/m) (see quality.py for every feature)",
    }


def clean(result: Any) -> Any:
    """NaN -> None everywhere (JSON has no NaN)."""
    if isinstance(result, dict):
        return {k: clean(v) for k, v in result.items()}
    if isinstance(result, list):
        return [clean(v) for v in result]
    if isinstance(result, float) and not math.isfinite(result):
        return None
    return result
