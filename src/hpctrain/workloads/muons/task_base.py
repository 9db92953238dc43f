"""MuonTaskBase: the data side of every muon task (streams, micro-batches, device moves, histograms).

A muon model only adds `build_modules`, `train_step` and `eval_step`. Batches reach `train_step` as normalised
MuonBatch objects on the device (see physics for the units), cut under `data.max_muons_per_batch`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from hpctrain.errors import UserError
from hpctrain.runtime.env import ClusterEnv
from hpctrain.train.task import MicroBatch, Task
from hpctrain.workloads.muons.batch import MuonBatch, split_by_muon_cap
from hpctrain.workloads.muons.staged import StagingSpec
from hpctrain.workloads.muons.stream import EventStream

if TYPE_CHECKING:
    from hpctrain.workloads.muons.spec import MuonRun

M = TypeVar("M", bound="MuonRun", covariant=True)


def resolve_files(paths: list[str], data: Any) -> list[str]:
    """Files named by `paths` (local paths, globs, folders, remote URIs and globs), sorted, de-duplicated.

    Remote files are NOT downloaded here: the stream reads their metadata remotely and stages each file to
    node-local scratch just ahead of its use (data.staging)."""
    from hpctrain.data.remote import expand_paths

    if not paths:
        raise UserError("data.paths is empty: name the muon files (paths, globs, folders or URIs)")
    return expand_paths(list(paths), getattr(data, "pelican", None))


def staging_spec(data: Any, env: ClusterEnv) -> StagingSpec:
    """This rank's access to remote inputs: data.staging, data.pelican and its place on the node."""
    return StagingSpec(
        staging=data.staging,
        pelican=data.pelican,
        local_rank=env.local_rank,
        local_world_size=env.local_world_size,
        job_id=env.job_id,
    )


def open_stream(
    data: Any, seed: int, env: Any, run_dir: str | Path | None, split: str = "train"
) -> EventStream:
    """This rank's EventStream of `data` (a MuonData): 'train' endless, shuffled; 'val' one ordered pass."""
    train = split == "train"
    files = resolve_files(data.paths if train else data.val_paths, data)
    return EventStream(
        files,
        data.batch_size,
        seed,
        rank=env.rank,
        world_size=env.world_size,
        num_workers=data.num_workers,
        prefetch_factor=data.prefetch_factor,
        persistent_workers=data.persistent_workers and train,
        pin_memory=data.pin_memory and torch.cuda.is_available(),
        shuffle=data.shuffle and train,
        shuffle_window=data.shuffle_window,
        prefetch_batches=data.prefetch_batches if train else 0,
        max_muons_per_event=data.event_muon_cap,
        outliers_dir=data.outliers_dir if train else None,
        drop_empty_events=data.drop_empty_events,
        on_bad_file=data.on_bad_file,
        on_bad_event=data.on_bad_event,
        max_events=data.max_events if train else 0,
        run_dir=run_dir,
        hdf5_unit_events=data.hdf5_unit_events,
        drop_last=train,
        staging=staging_spec(data, env),
        allow_changed_files=data.allow_changed_files,
    )


class ValBatches:
    """One pass over this rank's share of the validation files (built lazily: cheap to create)."""

    def __init__(self, data: Any, seed: int, env: Any, run_dir: str | Path | None) -> None:
        self.data, self.seed, self.env, self.run_dir = data, seed, env, run_dir

    def __iter__(self) -> Iterator[MuonBatch]:
        stream = open_stream(self.data, self.seed, self.env, self.run_dir, "val")
        try:
            for batch, _ in stream.epoch_batches(0, 0):
                if len(batch):
                    yield batch
        finally:
            stream.close()


class MuonTaskBase(Task[M]):
    """Data plumbing of the muon tasks; subclasses write networks, train_step and eval_step."""

    @property
    def run_dir(self) -> Path:
        return self.cfg.run.dir  # type: ignore[no-any-return]

    def build_data(self, split: str, seed: int) -> Any:
        if split == "train":
            return open_stream(self.cfg.data, seed, self.env, self.run_dir, "train")
        if not self.cfg.data.val_paths:
            return None
        # named files exist now: a mistake in val_paths is a line at the start, not an error at the first evaluation
        resolve_files(self.cfg.data.val_paths, self.cfg.data)
        return ValBatches(self.cfg.data, seed, self.env, self.run_dir)

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
        # normalised on the device: the logarithms are cheap there and the loader stays at decode speed
        return batch.to(device).normalize()

    def histograms(self, batch: MuonBatch) -> dict[str, torch.Tensor]:
        out = {"multiplicity_log10": torch.log10(batch.counts.float() + 1.0)}
        if len(batch):
            out.update(primary_log10E_PeV=batch.primaries[:, 0], primary_cos_zenith=batch.primaries[:, 1])
            out["primary_depth_km"] = batch.primaries[:, 3]
        if batch.num_muons:
            out.update(muon_log10E_PeV=batch.muons[:, 0], muon_x=batch.muons[:, 1], muon_y=batch.muons[:, 2])
        return out
