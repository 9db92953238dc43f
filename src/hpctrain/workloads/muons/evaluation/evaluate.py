"""Quality of generated bundles against fresh samples of the synthetic truth or held-out files.

Two judges, both in evaluate.json: the per-feature table (per feature and bin of primary energy x zenith, ours
vs the floor vs the baseline: quality.py) and the classifier two-sample test (AUC overall and per energy bin
beside its null band, FPD and KPD: two_sample.py) on paired primaries, one true and one generated bundle each.
This module draws or reads the samples, generates, and writes evaluate.json; the plain W1/KS figures and the
report's histograms are figures.py's.
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
from hpctrain.workloads.muons import truth_versions
from hpctrain.workloads.muons.evaluation import quality, two_sample
from hpctrain.workloads.muons.evaluation.figures import FEATURES, binned, clean, compare, distributions, sizes
from hpctrain.workloads.muons.evaluation.quality import ks_statistic, wasserstein_1d
from hpctrain.workloads.muons.events import layouts
from hpctrain.workloads.muons.events.stream import ValBatches
from hpctrain.workloads.muons.models import sampling
from hpctrain.workloads.muons.models.sampling import LoadedModel
from hpctrain.workloads.muons.spec import muon_cap

log = logging.getLogger("hpctrain.muons")

# figures.py's, still reachable here (tests, the bench)
__all__ = ["binned", "clean", "compare", "distributions", "ks_statistic", "wasserstein_1d"]
FLOOR_STREAM, BASELINE_STREAM = 1, 2  # numpy_rng keys after TRUTH_EVENTS: the floor's and baseline's samples
NULL_STREAM = 100  # numpy_rng keys from here: the classifier's truth-vs-truth replicates
REDRAWS = 20  # a replicate's bundle above the muon cap is drawn again, at most this often


def truth_events(
    n: int, seed: int, cap: int, version: str = truth_versions.DEFAULT
) -> tuple[layouts.Events, int]:
    """Fresh events of truth `version` (from their own seed stream) without those above `cap` muons (as the
    loader skips them); also returns how many were dropped."""
    rng = numpy_rng(seed, TRUTH_EVENTS)
    primaries, muons, counts = truth_versions.get(version).sample(n, rng)
    keep = counts <= cap if cap > 0 else np.ones(n, bool)
    mask = np.repeat(keep, counts)  # (sum counts,) muons of kept events
    events = layouts.Events(
        primaries[keep].astype(np.float32),
        muons[mask].astype(np.float32),
        counts[keep],
        np.stack([np.zeros(int(keep.sum()), np.int64), np.flatnonzero(keep)], 1),
    )
    return events, int((~keep).sum())


def _truth_sample(primaries: np.ndarray, seed: int, key: int, cap: int, version: str) -> layouts.Events:
    """Fresh bundles of truth `version` for these primaries (stream (seed, TRUTH_EVENTS, key)); events above
    `cap` are dropped, as the loader drops them."""
    sample_bundles = truth_versions.get(version).sample_bundles
    muons, counts = sample_bundles(primaries.astype(np.float64), numpy_rng(seed, TRUTH_EVENTS, key))
    keep = counts <= cap if cap > 0 else np.ones(len(counts), bool)
    ids = np.stack([np.zeros(int(keep.sum()), np.int64), np.flatnonzero(keep)], 1)
    return layouts.Events(
        primaries[keep].astype(np.float32),
        muons[np.repeat(keep, counts)].astype(np.float32),
        counts[keep],
        ids,
    )


def reference_samples(
    n_events: int, seed: int, cap: int, data: layouts.Events | None, version: str = truth_versions.DEFAULT
) -> tuple[layouts.Events, list[layouts.Events], layouts.Events, int]:
    """(true, floor samples, baseline reference, dropped): from the synthetic truth (quality.FLOOR_DRAWS fresh
    bundle samples for the same primaries as the floor) or from held-out events split in two halves by parity
    (the second is the floor and the reference; evaluate_model judges held-out events over more splits)."""
    if data is not None:
        true, other = quality.split_halves(data)
        return true, [other], other, 0
    true, dropped = truth_events(n_events, seed, cap, version)
    # FLOOR_STREAM, then keys past the baseline's: independent draws, the first as before
    keys = [FLOOR_STREAM, *range(BASELINE_STREAM + 3, BASELINE_STREAM + 2 + quality.FLOOR_DRAWS)]
    floor = [_truth_sample(true.primaries, seed, key, cap, version) for key in keys]
    primaries_rng = numpy_rng(seed, TRUTH_EVENTS, BASELINE_STREAM)
    reference_primaries = truth_versions.get(version).sample_primaries(n_events, primaries_rng)
    reference = _truth_sample(reference_primaries, seed, BASELINE_STREAM + 1, cap, version)
    return true, floor, reference, dropped


def evaluate_model(
    model: Any,
    n_events: int,
    seed: int,
    batch_size: int = 1024,
    data: layouts.Events | None = None,
    options: two_sample.Options = two_sample.DEFAULT_OPTIONS,
    truth: str = truth_versions.DEFAULT,
) -> dict[str, Any]:
    """Generate for the primaries of fresh events of synthetic truth `truth` (or of held-out `data`, split in
    two halves) and compare; the result is evaluate.json's content (the classifier test under "two_sample",
    for models that generate muons)."""
    start = time.perf_counter()
    cap = muon_cap(model.cfg)
    true, floor, reference, dropped = reference_samples(n_events, seed, cap, data, truth)
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
    if only == FEATURES:  # a multiplicity model's bundles have no muons for the classifier to look at
        judged = _classifier_test(
            model, true, generated, floor[0], data is not None, batch_size, seed, options, truth
        )
        result["two_sample"] = judged.as_dict()
        result["metrics"].update(judged.metrics())
    result["distributions"] = distributions(generated, true, only)
    result["binned"] = binned(generated, true, only)  # per energy bin and zenith band, for the report
    result["info"] = {
        "checkpoint": str(model.checkpoint),
        "step": model.step,
        "model_type": model.model_type,
        "source": "held-out files" if data is not None else f"synthetic truth {truth}",
        "truth_version": None if data is not None else truth,
        "events": len(true),
        "floor_events": len(floor[0]),
        "floor_draws": len(floor) if data is None else quality.FLOOR_DRAWS,  # held out: splits
        "generated_draws": len(floor) if data is None else quality.FLOOR_DRAWS,
        "truth_events_dropped_above_cap": dropped,
        "muon_cap": cap,
        **sizes(generated, true, seed, start),
    }
    return result


def _classifier_test(
    model: Any,
    true: layouts.Events,
    generated: layouts.Events,
    other: layouts.Events,
    held_out: bool,
    batch_size: int,
    seed: int,
    options: two_sample.Options,
    truth: str = truth_versions.DEFAULT,
) -> two_sample.Judgement:
    """The classifier test on paired primaries. Synthetic truth: `true` and `generated` (for its primaries),
    the band from fresh truth bundles for the same primaries. Held out: both halves (the other generated for
    too), the band from label swaps (there is no second true bundle of a file's primary)."""
    if not held_out:
        cap = muon_cap(model.cfg)
        nulls = [
            paired_truth(true.primaries, seed, NULL_STREAM + j, cap, truth) for j in range(options.replicates)
        ]
        return two_sample.judge_events(true, generated, nulls, options.folds, seed)
    pairs_true = layouts.concat_events([true, other])
    pairs_generated = layouts.concat_events([generated, _generate(model, other, batch_size, FEATURES)])
    return two_sample.judge_events(pairs_true, pairs_generated, [], options.folds, seed, options.replicates)


def classifier_on_truth(
    model: Any,
    n_events: int,
    seed: int,
    batch_size: int = 1024,
    options: two_sample.Options = two_sample.DEFAULT_OPTIONS,
    truth: str = truth_versions.DEFAULT,
) -> two_sample.Judgement:
    """The classifier test alone on `n_events` fresh events of truth `truth` (the per-feature table's stream of `seed`)
    and the model's bundles for their primaries, the band from truth-vs-truth replicates (the bench's 50 k
    pairs, more than the table needs)."""
    true, _ = truth_events(n_events, seed, muon_cap(model.cfg), truth)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        generated = _generate(model, true, batch_size, FEATURES)
    return _classifier_test(model, true, generated, true, False, batch_size, seed, options, truth)


def paired_truth(
    primaries: np.ndarray, seed: int, key: int, cap: int, version: str = truth_versions.DEFAULT
) -> layouts.Events:
    """One fresh truth bundle for each of `primaries` (stream (seed, TRUTH_EVENTS, key)), none above `cap`:
    a bundle above it is drawn again (at most REDRAWS times, then cut at the cap), so that it follows the
    truth given the primary and N <= cap, as the true events (which drop those above the cap) do."""
    rng = numpy_rng(seed, TRUTH_EVENTS, key)
    sample_bundles = truth_versions.get(version).sample_bundles
    prim = primaries.astype(np.float64)
    n = len(prim)
    drawn = np.arange(n)  # the events drawn in this round
    rounds = []  # per round: (its events, their muons (M, 3), their counts)
    for _ in range(REDRAWS + 1):
        muons, counts = sample_bundles(prim[drawn], rng)
        rounds.append((drawn, muons, counts))
        drawn = drawn[counts > cap] if cap > 0 else drawn[:0]
        if not len(drawn):
            break
    last = np.zeros(n, np.int64)  # (n,) the round whose bundle each event keeps: the last it was drawn in
    for r, (events, _, _) in enumerate(rounds):
        last[events] = r
    event_of, rows = [], []
    for r, (events, muons, counts) in enumerate(rounds):
        keep = last[events] == r
        event_of.append(np.repeat(events[keep], counts[keep]))
        rows.append(muons[np.repeat(keep, counts)])
    event = np.concatenate(event_of)
    order = np.argsort(event, kind="stable")  # muons back in event order
    event, muons = event[order], np.concatenate(rows)[order]
    if cap > 0:  # what is still above the cap after REDRAWS rounds is cut to it
        rank = np.arange(len(event)) - np.searchsorted(event, event)
        event, muons = event[rank < cap], muons[rank < cap]
    counts = np.bincount(event, minlength=n).astype(np.int64)
    ids = np.stack([np.zeros(n, np.int64), np.arange(n, dtype=np.int64)], 1)
    return layouts.Events(primaries.astype(np.float32), muons.astype(np.float32), counts, ids)


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
    classifier = two_sample.table_lines(result["two_sample"]) if result.get("two_sample") else []
    text = "\n".join([head, *quality.table(result["quality"]), *classifier]) + "\n"
    atomic_write_text(run_dir / "evaluate_val.txt", text)
    log.info(text)
    return path


def print_tables(result: dict[str, Any]) -> None:
    """The per-feature table, its summary line and the classifier test's table, indented, on stdout."""
    q = result["quality"]
    for line in quality.table(q):
        print("  " + line)
    ratio = q["min_feature_ratio"]
    print(
        f"  min_feature_ratio {'n/a' if ratio is None else f'{ratio:.2f}'} | features within 2 x floor "
        f"{q['features_within_floor']}/{len(q['features'])} | goal met {q['features_goal_met']}/{len(q['features'])}"
    )
    if result.get("two_sample"):
        for line in two_sample.table_lines(result["two_sample"]):
            print("  " + line)


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
