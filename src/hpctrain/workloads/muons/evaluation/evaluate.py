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
from hpctrain.track.stages import NO_STAGES, Stages
from hpctrain.workloads.muons.evaluation import quality, two_sample, verdict
from hpctrain.workloads.muons.evaluation.figures import FEATURES, binned, clean, compare, distributions, sizes
from hpctrain.workloads.muons.evaluation.quality import ks_statistic, wasserstein_1d
from hpctrain.workloads.muons.events import layouts
from hpctrain.workloads.muons.events.stream import ValBatches
from hpctrain.workloads.muons.models import sampling
from hpctrain.workloads.muons.models.sampling import LoadedModel
from hpctrain.workloads.muons.spec import EVALUATE_EVENTS, EVALUATE_SEED, muon_cap
from hpctrain.workloads.muons.truth import versions as truth_versions

log = logging.getLogger("hpctrain.muons")

# figures.py's, still reachable here (tests, the bench)
__all__ = ["binned", "clean", "compare", "distributions", "ks_statistic", "wasserstein_1d"]
FLOOR_STREAM, BASELINE_STREAM = 1, 2  # numpy_rng keys after TRUTH_EVENTS: the floor's and baseline's samples
NULL_STREAM = 100  # numpy_rng keys from here: the classifier's truth-vs-truth replicates


def truth_events(
    n: int, seed: int, cap: int, version: str = truth_versions.DEFAULT
) -> tuple[layouts.Events, int]:
    """Fresh events of truth `version` (from their own seed stream), those above `cap` muons clamped to it as
    the generator clamps (quality.clamp_to_cap); also returns how many were clamped."""
    rng = numpy_rng(seed, TRUTH_EVENTS)
    primaries, muons, counts = truth_versions.get(version).sample(n, rng)
    ids = np.stack([np.zeros(n, np.int64), np.arange(n, dtype=np.int64)], 1)
    events = layouts.Events(primaries.astype(np.float32), muons.astype(np.float32), counts, ids)
    return quality.clamp_to_cap(events, cap)


def _truth_sample(primaries: np.ndarray, seed: int, key: int, cap: int, version: str) -> layouts.Events:
    """Fresh bundles of truth `version` for these primaries (stream (seed, TRUTH_EVENTS, key)), clamped to
    `cap` as the true events are."""
    sample_bundles = truth_versions.get(version).sample_bundles
    muons, counts = sample_bundles(primaries.astype(np.float64), numpy_rng(seed, TRUTH_EVENTS, key))
    ids = np.stack([np.zeros(len(counts), np.int64), np.arange(len(counts), dtype=np.int64)], 1)
    events = layouts.Events(primaries.astype(np.float32), muons.astype(np.float32), counts, ids)
    return quality.clamp_to_cap(events, cap)[0]


def reference_samples(
    n_events: int, seed: int, cap: int, data: layouts.Events | None, version: str = truth_versions.DEFAULT
) -> tuple[layouts.Events, list[layouts.Events], layouts.Events, int]:
    """(true, floor samples, baseline reference, clamped): from the synthetic truth (quality.FLOOR_DRAWS fresh
    bundle samples for the same primaries as the floor, an independent sample as the baseline's lookup table)
    or from held-out events split in two halves by parity (the second is the floor and the reference;
    evaluate_model judges held-out events over more splits); `clamped`: true events above `cap` muons, cut to
    it (quality.clamp_to_cap)."""
    if data is not None:
        data, clamped = quality.clamp_to_cap(data, cap)
        true, other = quality.split_halves(data)
        return true, [other], other, clamped
    true, clamped = truth_events(n_events, seed, cap, version)
    # FLOOR_STREAM, then keys past the baseline's: independent draws, the first as before
    keys = [FLOOR_STREAM, *range(BASELINE_STREAM + 3, BASELINE_STREAM + 2 + quality.FLOOR_DRAWS)]
    floor = [_truth_sample(true.primaries, seed, key, cap, version) for key in keys]
    primaries_rng = numpy_rng(seed, TRUTH_EVENTS, BASELINE_STREAM)
    reference_primaries = truth_versions.get(version).sample_primaries(n_events, primaries_rng)
    reference = _truth_sample(reference_primaries, seed, BASELINE_STREAM + 1, cap, version)
    return true, floor, reference, clamped


def evaluate_model(
    model: Any,
    n_events: int,
    seed: int,
    batch_size: int = 1024,
    data: layouts.Events | None = None,
    options: two_sample.Options = two_sample.DEFAULT_OPTIONS,
    truth: str = truth_versions.DEFAULT,
    stages: Stages = NO_STAGES,
) -> dict[str, Any]:
    """Generate for the primaries of fresh events of synthetic truth `truth` (or of held-out `data`, split in
    two halves) and compare; the result is evaluate.json's content (the classifier test under "two_sample",
    for models that generate muons). `stages`: a line as each part begins (and ETAs), for a verb."""
    start = time.perf_counter()
    cap = muon_cap(model.cfg)
    source = "held-out events" if data is not None else f"true events of the synthetic truth {truth}"
    stages.stage(f"sampling {len(data) if data is not None else n_events} {source} and the floor's samples")
    true, floor, reference, clamped = reference_samples(n_events, seed, cap, data, truth)
    torch.manual_seed(seed)
    only: tuple[str, ...] = ("multiplicity",) if model.model_type == "muon_multiplicity" else FEATURES
    # held out: both halves, then the splits
    draws_n = len(floor) if data is None else 2 + quality.FLOOR_DRAWS
    what = "multiplicities" if only != FEATURES else "bundles"
    stages.stage(
        f"generating {draws_n} x {len(true)} {what} (ours, as many draws as the floor)",
        draws_n * len(true),
        what,
    )
    generated = _generate(model, true, batch_size, only, stages)
    result = compare(generated, true, only)
    judged_only = quality.FEATURES if only == FEATURES else only
    other_generated = None
    if data is None:  # ours over as many draws of the generator as the floor has truth draws
        draws = [generated] + [_generate(model, true, batch_size, only, stages) for _ in floor[1:]]
        stages.stage(f"the floor: {len(judged_only)} features per bin, ours vs {len(floor)} truth draws")
        result["quality"] = quality.quality(draws, true, floor, reference, judged_only)
    else:  # held out: over FLOOR_DRAWS splits in two (the first, by parity, is the one above); ours is drawn
        # for the other half's primaries, as the floor's bundles are (quality.py's docstring)
        other_generated = _generate(model, floor[0], batch_size, only, stages)
        runs = [(other_generated, true, floor[0])]
        rng = numpy_rng(seed, TRUTH_EVENTS, BASELINE_STREAM + 2)
        for half, other in quality.held_out_splits(quality.clamp_to_cap(data, cap)[0], rng, parity=False):
            runs.append((_generate(model, other, batch_size, only, stages), half, other))
        stages.stage(f"the floor: {len(judged_only)} features per bin over {len(runs)} splits of the events")
        result["quality"] = quality.quality_over_splits(runs, judged_only)
    q = result["quality"]
    result["metrics"].update(
        {
            "min_feature_ratio": math.nan if q["min_feature_ratio"] is None else q["min_feature_ratio"],
            "features_within_floor": float(q["features_within_floor"]),
            "features_goal_met": float(q["features_goal_met"]),
            "features_total": float(len(q["features"])),  # goal met by features_goal_met of these
        }
    )
    if only == FEATURES:  # a multiplicity model's bundles have no muons for the classifier to look at
        judged = _classifier_test(
            model, true, generated, floor[0], other_generated, batch_size, seed, options, truth, stages
        )
        result["two_sample"] = judged.as_dict()
        result["metrics"].update(judged.metrics())
    stages.stage("histograms for the report")
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
        "truth_events_clamped_at_cap": clamped,
        "generated_events_at_cap": int((generated.counts >= cap).sum()),
        "data_max_muons_per_event": int(model.cfg.data.max_muons_per_event),
        "muon_cap": cap,
        **sizes(generated, true, seed, start),
    }
    return result


def _classifier_test(
    model: Any,
    true: layouts.Events,
    generated: layouts.Events,
    other: layouts.Events,
    other_generated: layouts.Events | None,
    batch_size: int,
    seed: int,
    options: two_sample.Options,
    truth: str = truth_versions.DEFAULT,
    stages: Stages = NO_STAGES,
) -> two_sample.Judgement:
    """The classifier test on paired primaries. Synthetic truth: `true` and `generated` (for its primaries),
    the band from fresh truth bundles for the same primaries. Held out: both halves (the other generated for
    too: `other_generated`), the band from label swaps (there is no second true bundle of a file's primary)."""
    if other_generated is None:
        cap = muon_cap(model.cfg)
        nulls = [
            paired_truth(true.primaries, seed, NULL_STREAM + j, cap, truth) for j in range(options.replicates)
        ]
        return two_sample.judge_events(true, generated, nulls, options.folds, seed, stages=stages)
    pairs_true = layouts.concat_events([true, other])
    pairs_generated = layouts.concat_events([generated, other_generated])
    return two_sample.judge_events(
        pairs_true, pairs_generated, [], options.folds, seed, options.replicates, stages
    )


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
    return _classifier_test(model, true, generated, true, None, batch_size, seed, options, truth)


def paired_truth(
    primaries: np.ndarray, seed: int, key: int, cap: int, version: str = truth_versions.DEFAULT
) -> layouts.Events:
    """One fresh truth bundle for each of `primaries` (stream (seed, TRUTH_EVENTS, key)), clamped to `cap` as
    the true events and the generator's are: one rule on every side (quality.clamp_to_cap). It used to redraw a
    bundle above the cap, which matched true events that dropped those; they are clamped now."""
    return _truth_sample(primaries, seed, key, cap, version)


def _generate(
    model: Any, true: layouts.Events, batch_size: int, only: tuple[str, ...], stages: Stages = NO_STAGES
) -> layouts.Events:
    """Bundles for the primaries of `true` (multiplicities only when `only` is the multiplicity)."""
    if only == ("multiplicity",):
        counts = sampling.sample_counts(model, true.primaries, batch_size)
        stages.advance(len(counts))
        return layouts.Events(true.primaries, np.zeros((0, 3), np.float32), counts, true.ids)
    parts = []
    for chunk in sampling.generate_chunks(model, true.primaries, true.ids, batch_size):
        parts.append(chunk)
        stages.advance(len(chunk))
    return layouts.concat_events(parts) if parts else sampling.generate_events(model, true.primaries[:0])


def held_out_events(cfg: Any, paths: list[str], max_events: int = 0) -> layouts.Events:
    """Every event of `paths` (files, folders, globs, pelican:// or other URIs; any layout the loader reads) in
    physical units, read by the same loader as validation (remote files staged), at most `max_events` (0 =
    all). Events above the muon cap are kept here (the loader would skip them): evaluate_model clamps them to
    the cap, as the generator clamps its own (quality.clamp_to_cap)."""
    update: dict[str, Any] = {"val_paths": list(paths), "num_workers": 0, "prefetch_batches": 0}
    update |= {"max_muons_per_event": 0, "max_muons_per_batch": 0}
    data = cfg.data.model_copy(update=update)
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


VAL_EVENTS = 2 * EVALUATE_EVENTS  # validation events of the end-of-training check: a verdict's in each half


def evaluate_after_training(cfg: Any, modules: dict[str, Any], step: int, run_dir: Path) -> Path:
    """`hpctrain evaluate RUN --data <data.val_paths> --events VAL_EVENTS` at the end of training, the same
    figures (same seed, rules and bins): evaluate_val.json (with its "summary") and the summary as text
    (evaluate_val.txt) in the run folder, and on the log. Fewer validation events than a verdict needs in each
    half: a smoke check, labelled so, with the command that judges (verdict.py)."""
    device = next(modules["generator"].parameters()).device
    model = LoadedModel(cfg, modules, step, run_dir, run_dir, device)
    log.info(
        "the quality table of update %d on data.val_paths (evaluate_val.json): about a minute on 2 cores",
        step,
    )
    data = held_out_events(cfg, list(cfg.data.val_paths), VAL_EVENTS)
    if len(data) < 2:
        log.warning("no quality table: data.val_paths hold %d event(s)", len(data))
        return run_dir
    training = {name: module.training for name, module in modules.items()}
    with torch.random.fork_rng(devices=[]):  # the training's global RNG stays as it was
        try:
            for module in modules.values():
                module.eval()  # as `hpctrain evaluate` loads them
            result = evaluate_model(model, VAL_EVENTS, EVALUATE_SEED, data=data)
        finally:
            for name, module in modules.items():
                module.train(training[name])
    same = f"hpctrain evaluate {run_dir} --data {' '.join(cfg.data.val_paths)} --events {VAL_EVENTS}"
    head = (
        f"quality at update {step} on {result['info']['events']:,} validation events (floor: the other "
        f"{result['info']['floor_events']:,}), as `{same}` says"
    )
    judge = (
        f"`hpctrain evaluate {run_dir}` ({EVALUATE_EVENTS:,} events of the synthetic truth), or the same with "
        f"--data FILES holding at least {VAL_EVENTS:,} held-out events"
    )
    result["summary"] = verdict.summary(result, head, judge)
    path = run_dir / "evaluate_val.json"
    atomic_write_text(path, json.dumps(clean(result), indent=1, allow_nan=False) + "\n")
    text = "\n".join(result["summary"]) + "\n"
    atomic_write_text(run_dir / "evaluate_val.txt", text)
    log.info(text)
    return path


def print_summary(result: dict[str, Any], head: str, judge: str) -> None:
    """verdict.summary's lines on stdout, kept as evaluate.json's "summary"."""
    result["summary"] = verdict.summary(result, head, judge)
    print("\n".join(result["summary"]))


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
