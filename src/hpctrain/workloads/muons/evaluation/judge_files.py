"""`hpctrain evaluate --sample FILES --data FILES`: bundles that came from anywhere (another generator's output,
an older model's, a shuffled copy) judged against true files, with no model.

Both sides are files, folders or globs of any layout the readers know (events/layouts.py), local or remote
(pelican://, osdf://: staged to node-local scratch one file at a time, as training stages them). Each sample
event is paired with the true event of the same primary (E, zenith, mass, depth, compared bit for bit as
stored, float32: a sample generated for the primaries of the true files, `hpctrain sample MODEL --primaries
DATA`, pairs exactly; events that share a primary pair in file order); true events without a sample partner
are left out, a sample event without a true partner is a user error. Then the two judges of `hpctrain
evaluate` on the pairs:
- the per-feature table (quality.py), over quality.FLOOR_DRAWS splits of the pairs in two halves (by parity,
  then at random), as on held-out files: ours = the sample events of the other half vs the true events of one
  half, the floor = the other half's true events vs them (both are bundles for the other half's primaries),
  the baseline = the other half's true events looked up at the nearest primary;
- the classifier two-sample test (two_sample.py) on every pair, its null band from label swaps within pairs
  (no truth sampler needed: the true files may be a real simulation).
NumPy only (no torch): it runs wherever the files are.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from hpctrain.config.remote import PelicanConfig, StagingConfig
from hpctrain.data.staging import BadFileError, Stager
from hpctrain.errors import UserError
from hpctrain.remote.expand import expand_paths
from hpctrain.remote.uris import is_remote
from hpctrain.runtime.seeding import numpy_rng
from hpctrain.workloads.muons.evaluation import quality, two_sample
from hpctrain.workloads.muons.evaluation.figures import binned, compare, distributions, sizes
from hpctrain.workloads.muons.evaluation.quality import take
from hpctrain.workloads.muons.events import layouts
from hpctrain.workloads.muons.events.files import local_files

MIN_PAIRS = 20  # fewer pairs cannot be split in folds and halves that each hold both kinds
SPLIT_STREAM = 1  # numpy_rng key of the random halves


def read_events(
    paths: list[str], option: str, pelican: PelicanConfig | None = None, scratch: str | None = None
) -> tuple[layouts.Events, list[str], list[str]]:
    """Every event of the files `paths` name (local files, folders, globs; remote URIs and globs), in order;
    also the files and their layouts. Remote files are staged under `scratch` (data.staging.dir's default:
    node-local scratch) and deleted once read. A missing path or an unreadable file is a UserError naming it."""
    files: list[str] = []
    try:
        for path in paths:  # in the order given (globs and folders sorted)
            files += expand_paths([path], pelican) if is_remote(path) else local_files(path)
        stager = Stager(files, StagingConfig(dir=scratch), pelican=pelican)
    except UserError:
        raise
    except ValueError as err:  # the access settings: an unreadable token file, a CA that is not a file
        raise UserError(f"{option}: {err}") from None
    parts, found = [], []
    with stager as staged:
        for i, name in enumerate(files):
            local = name
            try:
                local = str(staged.get(i))
                layout, events = layouts.read_all(local)
            except BadFileError as err:
                raise UserError(f"{option} {err}") from None
            except UserError as err:
                if local == name:
                    raise
                raise UserError(str(err).replace(local, name)) from None  # the URI, not the scratch copy
            finally:
                staged.release(i)
            parts.append(events)
            found.append(layout)
    events = layouts.concat_events(parts)
    if len(events) == 0:
        raise UserError(f"{option} {' '.join(paths)}: no events in {len(files)} file(s)")
    return events, files, found


def _occurrence(group: np.ndarray) -> np.ndarray:
    """(n,) how many earlier rows share each row's group: 0 for the first of a primary, 1 for the next..."""
    order = np.argsort(group, kind="stable")
    sorted_group = group[order]
    first = np.searchsorted(sorted_group, sorted_group)  # where each row's group starts in sorted order
    out = np.empty(len(group), np.int64)
    out[order] = np.arange(len(group)) - first
    return out


def pair_by_primary(sample: layouts.Events, data: layouts.Events) -> tuple[np.ndarray, np.ndarray]:
    """(sample rows, data rows) of the pairs of equal primaries, in the data's order; a UserError when a
    sample event has no true partner."""
    bits = np.concatenate([sample.primaries, data.primaries]).astype(np.float32).view(np.int32)  # (n + m, 4)
    _, group = np.unique(bits, axis=0, return_inverse=True)
    group = group.reshape(-1).astype(np.int64)
    width = len(bits) + 1
    key_s = group[: len(sample)] * width + _occurrence(group[: len(sample)])
    key_d = group[len(sample) :] * width + _occurrence(group[len(sample) :])
    _, rows_s, rows_d = np.intersect1d(key_s, key_d, assume_unique=True, return_indices=True)
    if len(rows_s) < len(sample):
        lost = np.setdiff1d(np.arange(len(sample)), rows_s)
        e, zen, mass, depth = (float(v) for v in sample.primaries[lost[0]])
        raise UserError(
            f"--sample: {len(lost)} of its {len(sample)} events have no event of the same primary in --data "
            f"(the first: E {e:.6g} GeV, zenith {zen:.6g} rad, mass {mass:.6g} GeV, depth {depth:.6g} m); "
            "judge a sample generated for the primaries of these files (`hpctrain sample MODEL --primaries "
            "DATA --out FILE`)"
        )
    order = np.argsort(rows_d)
    return rows_s[order], rows_d[order]


def _splits(n: int, rng: np.random.Generator) -> list[np.ndarray]:
    """quality.FLOOR_DRAWS boolean masks of the first half of n pairs: by parity, then random halves."""
    masks = [np.arange(n) % 2 == 0]
    for _ in range(quality.FLOOR_DRAWS - 1):
        mask = np.zeros(n, dtype=bool)
        mask[rng.permutation(n)[: (n + 1) // 2]] = True
        masks.append(mask)
    return masks


def judge_files(
    sample_paths: list[str],
    data_paths: list[str],
    max_events: int = 0,
    seed: int = 0,
    options: two_sample.Options = two_sample.DEFAULT_OPTIONS,
    pelican: PelicanConfig | None = None,
    scratch: str | None = None,
) -> dict[str, Any]:
    """Pair, then judge (the module docstring); the result has evaluate.json's form (metrics, quality,
    two_sample, distributions, binned, info). `max_events`: at most this many pairs (0: all). `pelican`: access
    to remote files (CA, federation, token file; BEARER_TOKEN from the environment), `scratch`: where they are
    staged."""
    start = time.perf_counter()
    sample, sample_files, sample_layouts = read_events(sample_paths, "--sample", pelican, scratch)
    data, data_files, data_layouts = read_events(data_paths, "--data", pelican, scratch)
    rows_s, rows_d = pair_by_primary(sample, data)
    if max_events:
        rows_s, rows_d = rows_s[:max_events], rows_d[:max_events]
    if len(rows_s) < MIN_PAIRS:
        raise UserError(f"--sample: {len(rows_s)} event(s) paired with --data; need at least {MIN_PAIRS}")
    generated, true = take(sample, rows_s), take(data, rows_d)
    rng = numpy_rng(seed, SPLIT_STREAM)
    runs = []
    for first in _splits(len(true), rng):
        half, other = np.flatnonzero(first), np.flatnonzero(~first)
        # ours: the sample for the other half's primaries, as the floor (the other half's true events)
        runs.append((take(generated, other), take(true, half), take(true, other)))
    result = compare(generated, true)
    result["quality"] = q = quality.quality_over_splits(runs)
    judged = two_sample.judge_events(true, generated, [], options.folds, seed, options.replicates)
    result["two_sample"] = judged.as_dict()
    result["metrics"].update(
        {
            "min_feature_ratio": math.nan if q["min_feature_ratio"] is None else q["min_feature_ratio"],
            "features_within_floor": float(q["features_within_floor"]),
            "features_goal_met": float(q["features_goal_met"]),
            "features_total": float(len(q["features"])),  # goal met by features_goal_met of these
            **judged.metrics(),
        }
    )
    result["distributions"] = distributions(generated, true)
    result["binned"] = binned(generated, true)
    result["info"] = {
        "source": "files",
        "sample": sample_files,
        "sample_layouts": sorted(set(sample_layouts)),
        "data": data_files,
        "data_layouts": sorted(set(data_layouts)),
        "events": len(true),
        "table_events": len(runs[0][1]),  # the per-feature table compares one half with the other
        "data_events_unpaired": len(data) - len(rows_d),
        "floor_draws": quality.FLOOR_DRAWS,
        **sizes(generated, true, seed, start),
    }
    return result
