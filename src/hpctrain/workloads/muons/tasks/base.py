"""MuonTaskBase: the data side of every muon task (streams, micro-batches, device moves, histograms).

A muon model only adds `build_modules`, `train_step` and `eval_step`. Batches reach `train_step` as normalised
MuonBatch objects on the device (see physics for the units), cut under `data.max_muons_per_batch`. A model with a
`generator` is judged at each evaluation by its bundles' classifier AUC on a fixed validation subset
(`model_figures`, evaluation/val_judge.py): `val_auc`, what best.pt follows by default.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from torch import nn

from hpctrain.runtime.seeding import TASK_STREAM, derive
from hpctrain.train.task import MicroBatch, Task
from hpctrain.workloads.muons.evaluation.val_judge import ValJudge
from hpctrain.workloads.muons.events import file_cache, first_batch
from hpctrain.workloads.muons.events.batch import MuonBatch, split_by_muon_cap
from hpctrain.workloads.muons.events.stream import EventStream, ValBatches, resolve_files

if TYPE_CHECKING:
    from hpctrain.workloads.muons.spec import MuonRun

M = TypeVar("M", bound="MuonRun", covariant=True)


class MuonTaskBase(Task[M]):
    """Data plumbing of the muon tasks; subclasses write networks, train_step and eval_step."""

    dynamic_shapes = True  # the number of muons changes with every batch
    _train_stream: EventStream | None = None  # built by build_data("train")
    _judge: ValJudge | None = None  # built at the first evaluation (main rank), its events kept

    @property
    def run_dir(self) -> Path:
        return self.cfg.run.dir  # type: ignore[no-any-return]

    def build_data(self, split: str, seed: int) -> Any:
        file_cache.configure(self.cfg.data.memory_cache_mb)  # before workers fork: they inherit the bound
        first_batch.configure(self.cfg.data.report_first_batch)
        if split == "train":
            self._train_stream = EventStream.from_config(self.cfg.data, seed, self.env, self.run_dir, "train")
            return self._train_stream
        if not self.cfg.data.val_paths:
            return None
        # named files exist now: a mistake in val_paths is a line at the start, not an error at the first evaluation
        resolve_files(self.cfg.data.val_paths, self.cfg.data)
        # the training stream's counts: removed events said once per hop, not at every evaluation pass
        counts = self._train_stream.counts if self._train_stream is not None else None
        return ValBatches(self.cfg.data, seed, self.env, self.run_dir, counts)

    def model_figures(self, modules: dict[str, nn.Module], step: int) -> dict[str, float]:
        """A generator's classifier AUC on a fixed subset of data.val_paths (evaluation/val_judge.py); nothing
        for a model without one (muon_multiplicity) or a run without validation files."""
        if "generator" not in modules or not self.cfg.data.val_paths:
            return {}
        if self._judge is None:
            self._judge = ValJudge(self.cfg, self.run_dir)
        return self._judge.figures(modules, step)

    def batch_samples(self, batch: MuonBatch) -> int:
        return len(batch)

    def split(self, batch: MuonBatch) -> list[MicroBatch]:
        """Whole, contiguous events under data.max_muons_per_batch; weights are event shares."""
        n = len(batch)
        if n == 0:
            return [MicroBatch(batch, 1.0, 0)]
        return [
            MicroBatch(p, len(p) / n, len(p))
            for p in split_by_muon_cap(batch, self.cfg.data.max_muons_per_batch)
        ]

    def to_device(self, batch: MuonBatch, device: torch.device) -> MuonBatch:
        return batch.for_networks(device)

    def histograms(self, batch: MuonBatch) -> dict[str, torch.Tensor]:
        out = {"multiplicity_log10": torch.log10(batch.counts.float() + 1.0)}
        if len(batch):
            out.update(primary_log10E_PeV=batch.primaries[:, 0], primary_cos_zenith=batch.primaries[:, 1])
            out["primary_depth_km"] = batch.primaries[:, 3]
        if batch.num_muons:
            out.update(muon_log10E_PeV=batch.muons[:, 0], muon_x=batch.muons[:, 1], muon_y=batch.muons[:, 2])
        return out


class StepRng:
    """A task's own torch.Generator for the randomness of its step (latents, penalty draws), seeded from
    run.seed and the rank, its state saved in the checkpoint: the global RNG is also drawn by data loaders and
    evaluations, which must not shift training (an exact resume)."""

    def __init__(self, seed: int, rank: int) -> None:
        self._seed = derive(seed, TASK_STREAM, rank)
        self._rng: torch.Generator | None = None
        self._state: torch.Tensor | None = None

    def get(self, device: torch.device) -> torch.Generator:
        """The generator on `device` (made at the first call: from the checkpoint's state, else the seed)."""
        if self._rng is None:
            self._rng = torch.Generator(device=device)
            self._rng.manual_seed(self._seed)
            if self._state is not None:
                self._rng.set_state(self._state)
        return self._rng

    def state(self) -> torch.Tensor | None:
        return self._rng.get_state() if self._rng is not None else self._state

    def load(self, state: torch.Tensor | None) -> None:
        self._state = state
        if self._rng is not None and state is not None:
            self._rng.set_state(state)
