"""Quality of generated bundles against fresh samples of the synthetic truth or held-out files.

The judged table (per feature and bin of primary energy x zenith, ours vs the floor vs the baseline) is
quality.py's; this module draws or reads the samples, generates, and writes evaluate.json. Also kept, as the
first figures of the project: overall and per bin of primary energy, the multiplicity as log10(N + 1), the muon energy as
log10(E / GeV) and the lateral distance as log10(r / m) (r floored at 1 cm). Figures: the 1-D Wasserstein
distance (in those log10 units) and the Kolmogorov-Smirnov statistic. `conditional_w1` is the mean W1 over
the three features and the energy bins that have data on both sides: the headline figure.
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hpctrain.fsutil import atomic_write_text
from hpctrain.runtime.env import ClusterEnv
from hpctrain.runtime.seeding import TRUTH_EVENTS, numpy_rng
from hpctrain.workloads.muons import truth
from hpctrain.workloads.muons.evaluation import quality
from hpctrain.workloads.muons.evaluation.quality import ks_statistic, wasserstein_1d
from hpctrain.workloads.muons.events import layouts
from hpctrain.workloads.muons.events.stream import ValBatches
from hpctrain.workloads.muons.models import sampling
from hpctrain.workloads.muons.models.sampling import LoadedModel
from hpctrain.workloads.muons.spec import muon_cap

log = logging.getLogger("hpctrain.muons")

__all__ = ["ks_statistic", "wasserstein_1d"]
FLOOR_STREAM, BASELINE_STREAM = 1, 2  # numpy_rng keys after TRUTH_EVENTS: the floor's and baseline's samples

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


DRAWN = {  # feature -> (label, unit, y label) of its histograms; values from quality.features()
    "multiplicity": ("muons per event", "count", "events per bin"),
    "energy": ("muon energy", "GeV", "muons per bin"),
    "lateral_distance": ("lateral distance", "m", "muons per bin"),
    "energy_sum": ("energy sum per event", "GeV", "events per bin"),
    "centre_radius": ("radius of the bundle's centre", "m", "events per bin"),
    "spread": ("bundle spread (rms from its centre)", "m", "events per bin"),
}


def drawn_features(only: tuple[str, ...]) -> tuple[str, ...]:
    """The features the histograms show for a model that generates `only`: every judged feature
    (quality.FEATURES, the pair quantities included) when it generates muons, else just `only`."""
    return quality.FEATURES if set(FEATURES) <= set(only) else only


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
            "w1": wasserstein_1d(g, t),
            "ks": ks_statistic(g, t),
        }
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
                panel["features"][name] = {
                    "edges": edges[name].tolist(),
                    "generated": np.histogram(_physical(name, a), edges[name])[0].tolist(),
                    "true": np.histogram(_physical(name, b), edges[name])[0].tolist(),
                    "w1": wasserstein_1d(a, b),
                    "ks": ks_statistic(a, b),
                }
            panels.append(panel)
        out[kind] = panels
    return out


def truth_events(n: int, seed: int, cap: int) -> tuple[layouts.Events, int]:
    """Fresh truth events (from their own seed stream) without those above `cap` muons (as the loader skips
    them); also returns how many were dropped."""
    rng = numpy_rng(seed, TRUTH_EVENTS)
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


def _truth_sample(primaries: np.ndarray, seed: int, key: int, cap: int) -> layouts.Events:
    """Fresh truth bundles for these primaries (stream (seed, TRUTH_EVENTS, key)); events above `cap` are
    dropped, as the loader drops them."""
    muons, counts = truth.sample_bundles(primaries.astype(np.float64), numpy_rng(seed, TRUTH_EVENTS, key))
    keep = counts <= cap if cap > 0 else np.ones(len(counts), bool)
    ids = np.stack([np.zeros(int(keep.sum()), np.int64), np.flatnonzero(keep)], 1)
    return layouts.Events(
        primaries[keep].astype(np.float32),
        muons[np.repeat(keep, counts)].astype(np.float32),
        counts[keep],
        ids,
    )


def reference_samples(
    n_events: int, seed: int, cap: int, data: layouts.Events | None
) -> tuple[layouts.Events, list[layouts.Events], layouts.Events, int]:
    """(true, floor samples, baseline reference, dropped): from the synthetic truth (quality.FLOOR_DRAWS fresh
    bundle samples for the same primaries as the floor) or from held-out events split in two halves by parity
    (the second is the floor and the reference; evaluate_model judges held-out events over more splits)."""
    if data is not None:
        true, other = quality.split_halves(data)
        return true, [other], other, 0
    true, dropped = truth_events(n_events, seed, cap)
    # FLOOR_STREAM, then keys past the baseline's: independent draws, the first as before
    keys = [FLOOR_STREAM, *range(BASELINE_STREAM + 3, BASELINE_STREAM + 2 + quality.FLOOR_DRAWS)]
    floor = [_truth_sample(true.primaries, seed, key, cap) for key in keys]
    reference_primaries = truth.sample_primaries(n_events, numpy_rng(seed, TRUTH_EVENTS, BASELINE_STREAM))
    reference = _truth_sample(reference_primaries, seed, BASELINE_STREAM + 1, cap)
    return true, floor, reference, dropped


def evaluate_model(
    model: Any, n_events: int, seed: int, batch_size: int = 1024, data: layouts.Events | None = None
) -> dict[str, Any]:
    """Generate for the primaries of fresh truth events (or of held-out `data`, split in two halves) and
    compare; the result is evaluate.json's content."""
    start = time.perf_counter()
    cap = muon_cap(model.cfg)
    true, floor, reference, dropped = reference_samples(n_events, seed, cap, data)
    torch.manual_seed(seed)
    only: tuple[str, ...] = ("multiplicity",) if model.model_type == "muon_multiplicity" else FEATURES
    generated = _generate(model, true, batch_size, only)
    result = compare(generated, true, only)
    judged_only = quality.FEATURES if only == FEATURES else only
    rng = numpy_rng(seed, TRUTH_EVENTS, BASELINE_STREAM + 2)
    if data is None:  # ours over as many draws of the generator as the floor has truth draws
        draws = [generated] + [_generate(model, true, batch_size, only) for _ in floor[1:]]
        result["quality"] = quality.quality(draws, true, floor, reference, rng, judged_only)
    else:  # held out: over FLOOR_DRAWS splits in two (the first, by parity, is the one above)
        runs = [(generated, true, floor[0])]
        for half, other in quality.held_out_splits(data, rng, parity=False):
            runs.append((_generate(model, half, batch_size, only), half, other))
        result["quality"] = quality.quality_over_splits(runs, rng, judged_only)
    q = result["quality"]
    result["metrics"].update(
        {
            "min_feature_ratio": math.nan if q["min_feature_ratio"] is None else q["min_feature_ratio"],
            "features_within_floor": float(q["features_within_floor"]),
            "features_goal_met": float(q["features_goal_met"]),
        }
    )
    result["distributions"] = distributions(generated, true, only)
    result["binned"] = binned(generated, true, only)  # per energy bin and zenith band, for the report
    result["info"] = {
        "checkpoint": str(model.checkpoint),
        "step": model.step,
        "model_type": model.model_type,
        "source": "held-out files" if data is not None else "synthetic truth",
        "events": len(true),
        "floor_events": len(floor[0]),
        "floor_draws": len(floor) if data is None else quality.FLOOR_DRAWS,  # held out: splits
        "generated_draws": len(floor) if data is None else quality.FLOOR_DRAWS,
        "truth_events_dropped_above_cap": dropped,
        "muon_cap": cap,
        "seed": seed,
        "muons_generated": int(generated.counts.sum()),
        "muons_true": int(true.counts.sum()),
        "seconds": time.perf_counter() - start,
        "units": "W1 in log10(N+1), log10(E/GeV), log10(r/m) (see quality.py for every feature)",
    }
    return result


def _generate(model: Any, true: layouts.Events, batch_size: int, only: tuple[str, ...]) -> layouts.Events:
    """Bundles for the primaries of `true` (multiplicities only when `only` is the multiplicity)."""
    if only == ("multiplicity",):
        counts = sampling.sample_counts(model, true.primaries, batch_size)
        return layouts.Events(true.primaries, np.zeros((0, 3), np.float32), counts, true.ids)
    return sampling.generate_events(model, true.primaries, true.ids, batch_size)


def held_out_events(cfg: Any, paths: list[str], max_events: int = 0) -> layouts.Events:
    """Every event of `paths` (files, folders, globs, pelican:// or other URIs; any layout the loader reads) in
    physical units, read by the same loader as validation (events above the muon cap skipped, remote files
    staged), at most `max_events` (0 = all)."""
    data = cfg.data.model_copy(update={"val_paths": list(paths), "num_workers": 0, "prefetch_batches": 0})
    parts, total = [], 0
    for batch in ValBatches(data, cfg.run.seed, ClusterEnv(), None):
        parts.append(
            layouts.Events(
                batch.primaries.numpy(), batch.muons.numpy(), batch.counts.numpy(), batch.ids.numpy()
            )
        )
        total += len(batch)
        if max_events and total >= max_events:
            break
    events = layouts.concat_events(parts)
    if max_events and len(events) > max_events:
        keep = np.arange(len(events)) < max_events
        events = layouts.Events(
            events.primaries[keep],
            events.muons[: int(events.counts[keep].sum())],
            events.counts[keep],
            events.ids[keep],
        )
    return events


VAL_EVENTS = 20_000  # at most this many validation events in the end-of-training table


def evaluate_after_training(cfg: Any, modules: dict[str, Any], step: int, run_dir: Path) -> Path:
    """The table of `hpctrain evaluate --data <data.val_paths>` at the end of training: evaluate_val.json and
    the table as text (evaluate_val.txt) in the run folder."""
    device = next(modules["generator"].parameters()).device
    model = LoadedModel(cfg, modules, step, run_dir, run_dir, device)
    data = held_out_events(cfg, list(cfg.data.val_paths), VAL_EVENTS)
    if len(data) < 2:
        log.warning("no quality table: data.val_paths hold %d event(s)", len(data))
        return run_dir
    with torch.random.fork_rng(devices=[]):  # the training's global RNG stays as it was
        result = evaluate_model(model, VAL_EVENTS, cfg.run.seed, data=data)
    path = run_dir / "evaluate_val.json"
    atomic_write_text(path, json.dumps(clean(result), indent=1, allow_nan=False) + "\n")
    head = f"quality at update {step} on {len(data) // 2} validation events (floor: the other half)"
    text = "\n".join([head, *quality.table(result["quality"])]) + "\n"
    atomic_write_text(run_dir / "evaluate_val.txt", text)
    log.info(text)
    return path


def write_outputs(run_dir: Path, result: dict[str, Any]) -> Path:
    """evaluate.json (atomically) and one `eval_*` record appended to metrics.jsonl at the model's step."""
    path = run_dir / "evaluate.json"
    atomic_write_text(path, json.dumps(clean(result), indent=1, allow_nan=False) + "\n")
    record: dict[str, Any] = {"step": result["info"]["step"]}
    record.update({f"eval_{k}": (v if math.isfinite(v) else None) for k, v in result["metrics"].items()})
    record["time"] = round(time.time(), 3)  # no `hop`: an evaluation after training is no job hop
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
