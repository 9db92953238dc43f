"""The per-feature table (evaluation/quality.py) as a judge: its time, and its verdict on stand-ins, v1 and v2.

    python bench/muon_table_judge.py [--events 10000,50000] [--repeats 3] [--truths v1,v2] [--cap 2000]
                                     [--old FILE]

For each truth and event count: the table's true events, floor draws and baseline reference as `hpctrain
evaluate` draws them (evaluate.reference_samples, muon cap `--cap` as configs/muons.yaml), then the table
(quality.quality) on stand-ins of a generator, each over as many draws as the floor has (the same estimator
on both sides):
- truth: fresh truth bundles for the same primaries (a perfect generator: the table must accept it);
- shuffled: fresh truth bundles whose muon positions are shuffled among the muons of each event (no
  energy-radius correlation inside a bundle);
- blind: fresh truth bundles drawn for the primaries with mass and depth redrawn from the prior (a generator
  that ignores them), labelled with the true primaries;
- tails: fresh truth bundles with the top 0.1 % of the sample's muon energies x3.
`seconds` is the median of `--repeats` timings of the table alone on the fresh-truth stand-in (the samples
drawn beforehand), with its min..max. `--old FILE`: an older quality.py (e.g. `git show 3941a3c:src/hpctrain/
workloads/muons/evaluation/quality.py > /tmp/quality_old.py`, the table before issue 28 item 4, called with its
own signature) timed on the same samples in turn with this one (`old_seconds`, `ratio` = old / new time: higher
is better), and its verdicts (`old`). Last line: one JSON object: per truth and event count the seconds and per
stand-in `goal_met`, `features_goal_met` and the features that fail.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import time
from typing import Any

import numpy as np

from hpctrain.runtime.seeding import TRUTH_EVENTS, numpy_rng
from hpctrain.workloads.muons.evaluation import evaluate, quality
from hpctrain.workloads.muons.events import layouts
from hpctrain.workloads.muons.truth import versions as truth_versions

SEED = 777
DRAW_KEYS = 50  # numpy_rng keys of the stand-ins' draws: past the evaluation's own


def _with_muons(events: layouts.Events, muons: np.ndarray) -> layouts.Events:
    return layouts.Events(events.primaries, muons.astype(np.float32), events.counts, events.ids)


def shuffled(events: layouts.Events, rng: np.random.Generator) -> layouts.Events:
    """The muons' (x, y) permuted within each event (energies stay where they are)."""
    event = np.repeat(np.arange(len(events)), events.counts)
    order = np.lexsort((rng.random(len(event)), event))  # a random order inside each event
    muons = events.muons.copy()
    muons[:, 1:] = events.muons[order, 1:]
    return _with_muons(events, muons)


def wrong_tails(events: layouts.Events) -> layouts.Events:
    """The top 0.1 % of the muon energies x3."""
    muons = events.muons.copy()
    if len(muons):
        top = muons[:, 0] >= np.quantile(muons[:, 0], 0.999)
        muons[top, 0] *= 3.0
    return _with_muons(events, muons)


def blind(true: layouts.Events, seed: int, key: int, cap: int, version: str) -> layouts.Events:
    """Truth bundles for the primaries with mass and depth redrawn from the prior, labelled with the true ones."""
    module = truth_versions.get(version)
    rng = numpy_rng(seed, TRUTH_EVENTS, key)
    seen = true.primaries.astype(np.float64).copy()
    prior = module.sample_primaries(len(seen), rng)
    seen[:, 2:] = prior[:, 2:]
    drawn = evaluate._truth_sample(seen, seed, key + 1, cap, version)
    keep = np.isin(np.arange(len(true)), drawn.ids[:, 1])  # old evaluate dropped events above the cap
    return layouts.Events(true.primaries[keep], drawn.muons, drawn.counts, true.ids[keep])


def standins(true: layouts.Events, n_draws: int, cap: int, version: str) -> dict[str, list[layouts.Events]]:
    fresh = [
        evaluate._truth_sample(true.primaries, SEED, DRAW_KEYS + k, cap, version) for k in range(n_draws)
    ]
    rng = np.random.default_rng(0)
    return {
        "truth": fresh,
        "shuffled": [shuffled(f, rng) for f in fresh],
        "blind": [blind(true, SEED, DRAW_KEYS + 100 + 2 * k, cap, version) for k in range(n_draws)],
        "tails": [wrong_tails(f) for f in fresh],
    }


def verdict(q: dict[str, Any]) -> dict[str, Any]:
    return {
        "goal_met": q["goal_met"],
        "features_goal_met": f"{q['features_goal_met']}/{len(q['features'])}",
        "failed": {
            n: f"{f['bins_ok']}/{f['bins_judged']}" for n, f in q["features"].items() if not f["goal_met"]
        },
        "min_feature_ratio": q["min_feature_ratio"],
    }


def load_old(path: str) -> Any:
    """An older quality.py as a module of its own."""
    spec = importlib.util.spec_from_file_location("quality_old", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", default="10000,50000", help="event counts, comma-separated")
    parser.add_argument("--repeats", type=int, default=3, help="timings of the table per event count")
    parser.add_argument("--truths", default="v1,v2", help="truth versions, comma-separated")
    parser.add_argument("--cap", type=int, default=2000, help="muon cap (configs/muons.yaml: 2000)")
    parser.add_argument("--old", help="an older quality.py to time and judge on the same samples")
    args = parser.parse_args()
    old = load_old(args.old) if args.old else None
    out: dict[str, Any] = {"load_before": os.getloadavg()[0], "cap": args.cap, "runs": {}}
    for version in args.truths.split(","):
        for n in (int(v) for v in args.events.split(",")):
            true, floor, reference, _ = evaluate.reference_samples(n, SEED, args.cap, None, version)
            cases = standins(true, len(floor), args.cap, version)
            seconds, old_seconds = [], []
            for _ in range(args.repeats):
                start = time.perf_counter()
                quality.quality(cases["truth"], true, floor, reference)
                seconds.append(time.perf_counter() - start)
                if old is not None:  # in turn: both see the same load
                    start = time.perf_counter()
                    old.quality(cases["truth"], true, floor, reference, np.random.default_rng(1))
                    old_seconds.append(time.perf_counter() - start)
            row: dict[str, Any] = {
                "events": n,
                "muons": len(true.muons),
                "seconds": float(np.median(seconds)),
                "seconds_min_max": [min(seconds), max(seconds)],
            }
            if old is not None:
                row["old_seconds"] = float(np.median(old_seconds))
                row["old_seconds_min_max"] = [min(old_seconds), max(old_seconds)]
                row["ratio"] = row["old_seconds"] / row["seconds"]
                row["old"] = {
                    name: verdict(old.quality(draws, true, floor, reference, np.random.default_rng(1)))
                    for name, draws in cases.items()
                }
            for name, draws in cases.items():
                row[name] = verdict(quality.quality(draws, true, floor, reference))
                print(f"{version} {n} {name}: {row[name]}", flush=True)
            print(
                f"{version} {n}: table {row['seconds']:.2f} s (min..max {seconds}); old {old_seconds}",
                flush=True,
            )
            out["runs"][f"{version}_{n}"] = row
    out["load_after"] = os.getloadavg()[0]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
