"""MuonTaskBase: the data side of every muon task (streams, micro-batches, device moves, histograms).

A muon model only adds `build_modules`, `train_step` and `eval_step`. Batches reach `train_step` as normalised
MuonBatch objects on the device (see physics for the units), cut under `data.max_muons_per_batch`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from hpctrain.train.task import MicroBatch, Task
from hpctrain.workloads.muons.batch import MuonBatch, split_by_muon_cap
from hpctrain.workloads.muons.stream import EventStream


def resolve_files(paths: list[str], data: Any, env: Any) -> tuple[list[str], Callable[[], None] | None]:
    """Local files for `paths` (globs, folders, remote URIs) and a closer for the stager, if one was needed.

    Remote files are staged to node-local scratch (data.staging) before the index is built."""
    from hpctrain.data.remote import expand_paths, is_remote

    if not paths:
        raise ValueError("data.paths is empty: name the muon files (paths, globs, folders or URIs)")
    files = expand_paths(list(paths), getattr(data, "pelican", None))
    if not any(is_remote(f) for f in files):
        return files, None
    from hpctrain.data.staging import Stager

    stager = Stager(
        files,
        data.staging,
        local_rank=getattr(env, "local_rank", 0),
        local_world_size=getattr(env, "local_world_size", 1),
        job_id=getattr(env, "job_id", None),
        pelican=data.pelican,
    )
    try:
        local = [str(stager.get(i)) for i in range(len(files))]
    except BaseException:
        stager.close()
        raise
    return local, stager.close


def open_stream(
    data: Any, seed: int, env: Any, run_dir: str | Path | None, split: str = "train"
) -> EventStream:
    """This rank's EventStream of `data` (a MuonData): 'train' endless, shuffled; 'val' one ordered pass."""
    train = split == "train"
    files, closer = resolve_files(data.paths if train else data.val_paths, data, env)
    try:
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
            on_close=closer,
        )
    except BaseException:
        if closer is not None:
            closer()
        raise


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


class MuonTaskBase(Task):
    """Data plumbing of the muon tasks; subclasses write networks, train_step and eval_step."""

    @property
    def run_dir(self) -> Path | None:
        run = getattr(self.cfg, "run", None)
        if run is None or run.name is None:
            return None
        return Path(run.out_dir) / run.name

    def build_data(self, split: str, seed: int) -> Any:
        if split == "train":
            return open_stream(self.cfg.data, seed, self.env, self.run_dir, "train")
        if not self.cfg.data.val_paths:
            return None
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
