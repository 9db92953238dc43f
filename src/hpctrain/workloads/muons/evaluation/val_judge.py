"""The judge at every evaluation of a generator (train.eval_every): the classifier two-sample AUC of the model's
bundles against a fixed subset of the validation files, overall and per primary-energy bin, in seconds.

The subset: of the first POOL_EVENTS events of data.val_paths (the validation loader's order; events above the
muon cap clamped to it, as `hpctrain evaluate` does), at most PER_BIN events of each primary-energy bin
(two_sample.ENERGY_BINS_LOG10_GEV), picked in an order fixed by JUDGE_SEED: a rare high-energy bin, where a
generator fails first, keeps a figure of its own. The same events, seed and generation stream at every
evaluation, so the figures move with the model alone; nothing is drawn from the training's random streams
(train/evaluation.py's `Evaluator.figures` restores them), so a resumed run trains on bit for bit.

Figures (into metrics.jsonl, TensorBoard and W&B with the evaluation's): `val_auc` (every pair; 0.5: the
classifier cannot tell the model's bundles from the files'), `val_auc_E<lo>-<hi>` per energy bin with at least
MIN_BIN_PAIRS pairs, `val_auc_null_upper` (0.5 + 3 Mann-Whitney sigma for this many pairs: a perfect generator
stays below it), `val_fpd`, `val_kpd` (two_sample.py). A progress figure, not the verdict: `hpctrain evaluate`
judges 10,000 events, per feature and bin too, with a null band from replicates.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from hpctrain.workloads.muons.evaluation import quality, two_sample
from hpctrain.workloads.muons.evaluation.evaluate import held_out_events
from hpctrain.workloads.muons.events import layouts
from hpctrain.workloads.muons.models import sampling
from hpctrain.workloads.muons.models.sampling import LoadedModel
from hpctrain.workloads.muons.spec import SAMPLE_BATCH, muon_cap

log = logging.getLogger("hpctrain.muons")

POOL_EVENTS = 20_000  # validation events read once (the first ones), the subset drawn from them
PER_BIN = 600  # at most this many events of each primary-energy bin judged (5 bins: 3,000 events at most)
MIN_BIN_PAIRS = 100  # a bin with fewer pairs gets no figure of its own (its AUC would be noise)
JUDGE_SEED = 20_261_201  # the subset's order, the generation, the folds: the same at every evaluation
FOLDS = 2


def fixed_subset(events: layouts.Events, per_bin: int = PER_BIN, seed: int = JUDGE_SEED) -> layouts.Events:
    """At most `per_bin` events of each primary-energy bin, in an order fixed by `seed`; kept in file order."""
    order = np.random.default_rng(seed).permutation(len(events))
    bins = two_sample.energy_bin(events.primaries[order].astype(np.float64))
    rank = np.zeros(len(order), np.int64)  # (n,) place of each event among the earlier ones of its bin
    for b in np.unique(bins):
        rank[bins == b] = np.arange(int((bins == b).sum()))
    return quality.take(events, np.sort(order[rank < per_bin]))


class ValJudge:
    """The classifier AUC of a generator against a fixed validation subset (see the module docstring). The
    events are read at the first call (main rank only) and kept."""

    def __init__(self, cfg: Any, run_dir: Path) -> None:
        self.cfg, self.run_dir = cfg, run_dir
        self._events: layouts.Events | None = None

    def events(self) -> layouts.Events:
        if self._events is None:
            pool = held_out_events(self.cfg, list(self.cfg.data.val_paths), POOL_EVENTS)
            self._events = fixed_subset(quality.clamp_to_cap(pool, muon_cap(self.cfg))[0])
            log.info(
                "the judge at each evaluation: classifier AUC on %d validation events (%s per energy bin)",
                len(self._events),
                ", ".join(f"{k} {v}" for k, v in _bin_counts(self._events).items()),
            )
        return self._events

    def figures(self, modules: dict[str, nn.Module], step: int) -> dict[str, float]:
        """val_auc and its companions (module docstring) for the networks as they are; {} with fewer than
        two validation events. Draws from torch's global RNG (seeded here): the caller restores it."""
        true = self.events()
        if len(true) < 2:
            return {}
        start = time.perf_counter()
        device = next(modules["generator"].parameters()).device
        model = LoadedModel(self.cfg, modules, step, self.run_dir, self.run_dir, device)
        torch.manual_seed(JUDGE_SEED)
        generated = sampling.generate_events(model, true.primaries, true.ids, SAMPLE_BATCH)
        judged = two_sample.judge_events(true, generated, [], FOLDS, JUDGE_SEED, swaps=0)
        out = {"val_auc": judged.auc["all"]}
        for key, value in judged.auc.items():
            if key != "all" and judged.events.get(key, 0) >= MIN_BIN_PAIRS:
                out[f"val_auc_{key}"] = value
        out.update(val_auc_null_upper=judged.upper("all"), val_fpd=judged.fpd, val_kpd=judged.kpd)
        log.debug("judge at update %d: %.1f s", step, time.perf_counter() - start)
        return {k: float(v) for k, v in out.items()}


def _bin_counts(events: layouts.Events) -> dict[str, int]:
    bins = two_sample.energy_bin(events.primaries.astype(np.float64))
    return {
        two_sample.bin_label(i): int((bins == i).sum())
        for i in range(len(two_sample.ENERGY_BINS_LOG10_GEV) - 1)
    }
