"""EventStream: muon-bundle batches from Parquet/HDF5 files, sharded over ranks and workers, resumable.

The epoch's order and its work items are data/stream/epoch_plan.py's (files, row groups and events shuffled, seeded
by (seed, epoch)); the main process (the sampler here) hands this rank's work items to the DataLoader workers,
which decode them (decode.py); batches are put back together from the items' pieces in order. The position
(epoch, events of the epoch consumed by all ranks) is counted where batches are handed out.

Remote inputs (pelican://, osdf:///, https://): the index comes from their metadata read remotely
(remote_index.py); the sampler stages the files of each work item just before handing it to a worker, `ahead`
files in advance in reading order, and releases them once the item's result is back (data/stream/staged.py).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import torch
from torch.utils.data import Sampler

from hpctrain.data.loader import (
    LoaderOptions,
    as_batch,
    check_one_batch,
    load_position,
    make_loader,
    position_state,
    seed_worker,
)
from hpctrain.data.stream.epoch_plan import EpochPlan, Reassembly, WorkItem, work_items
from hpctrain.data.stream.lent_buffers import LentBuffers
from hpctrain.data.stream.prefetch import Prefetcher
from hpctrain.data.stream.staged import StagedFiles, StagingSpec
from hpctrain.errors import UserError
from hpctrain.remote.expand import expand_paths
from hpctrain.remote.uris import is_remote
from hpctrain.runtime.env import ClusterEnv
from hpctrain.workloads.muons.events.batch import MuonBatch
from hpctrain.workloads.muons.events.decode import ChunkDataset, ReadOptions
from hpctrain.workloads.muons.events.event_counts import EventCounts, what_and_advice
from hpctrain.workloads.muons.events.event_index import EventIndex, build_index, note_bad_file
from hpctrain.workloads.muons.events.item_result import ItemError, ItemResult
from hpctrain.workloads.muons.events.outliers import EventRules
from hpctrain.workloads.muons.spec import MuonData

log = logging.getLogger("hpctrain.muons")


def resolve_files(paths: list[str], data: MuonData) -> list[str]:
    """Files named by `paths` (local paths, globs, folders, remote URIs and globs), sorted, de-duplicated.

    Remote files are NOT downloaded here: the stream reads their metadata remotely and stages each file to
    node-local scratch just ahead of its use (data.staging)."""
    if not paths:
        raise UserError("data.paths is empty: name the muon files (paths, globs, folders or URIs)")
    return expand_paths(list(paths), data.pelican)


class _Items(Sampler[WorkItem]):
    """Runs in the main process: this rank's work items from the stream's current position."""

    def __init__(self, stream: EventStream) -> None:
        self.stream = stream

    def __iter__(self) -> Iterator[WorkItem]:
        s = self.stream
        if not s._continuous:
            items = self._epoch(s._start_epoch, s._start_position)
        else:
            items = self._epochs(s._start_epoch, s._start_position)
        return self._announced(items) if s.read_ahead else items

    def _announced(self, items: Iterator[WorkItem]) -> Iterator[WorkItem]:
        """The items, each announced to the data set (decoding starts) while the one before is handed out."""
        dataset = self.stream._dataset
        dataset.forget_announced()
        current = next(items, None)
        if current is None:
            return
        dataset.announce(current)
        for following in items:
            dataset.announce(following)
            yield current
            current = following
        yield current

    def _epoch(self, epoch: int, position: int) -> Iterator[WorkItem]:
        s = self.stream
        plan = s._dataset.plan(epoch)
        items = work_items(plan, position, s.batch_size, s.rank, s.world_size, s.drop_last)
        items = items if s._staged is None else s._stage_items(plan, items)
        return items if s._lent is None else s._lend(items)

    def _epochs(self, epoch: int, position: int) -> Iterator[WorkItem]:
        """Endless: the next epoch's items follow this one's without a pause (local inputs). A whole epoch without
        an item would make this loop spin without handing anything out (deaf to stops): one line instead."""
        while True:
            given = 0
            for item in self._epoch(epoch, position):
                given += 1
                yield item
            if not given and position == 0:
                s = self.stream
                raise UserError(
                    f"muon data, {s.split} split: epoch {epoch} has no work for rank {s.rank} ({s.index.total} "
                    f"events, global batch {s.batch_size * s.world_size}): add files or lower data.batch_size"
                )
            epoch, position = epoch + 1, 0


def _init_worker(worker_id: int) -> None:
    seed_worker(worker_id)
    torch.set_num_threads(1)  # decoding is NumPy/Arrow work; torch threads would only compete
    pa.set_cpu_count(1)  # one core per worker: Arrow's decode threads would compete with the other workers


def _chunks(
    index: EventIndex, data: MuonData, seed: int, train: bool, run: str | None, rank: int
) -> ChunkDataset:
    """The worker side of a stream of `data` (outliers written only while training)."""
    rules = EventRules(
        data.on_bad_event,
        data.event_muon_cap,
        data.drop_empty_events,
        data.outliers_dir if train else None,
        rank,
    )
    read = ReadOptions(data.on_bad_file, run, data.hdf5_unit_events)
    return ChunkDataset(index, seed, data.shuffle and train, max(data.shuffle_window, 1), read, rules)


class EventStream:
    """Endless batches of MuonBatch (BatchStream protocol) of `files`, as `data` (a MuonData section) says.

    split 'train': shuffled (data.shuffle), the last partial global batch dropped, with data.prefetch_batches,
    max_events and outliers_dir; 'val': one ordered pass of every event (ranks may get unequal shares)."""

    def __init__(
        self,
        files: Sequence[str],
        data: MuonData,
        seed: int,
        *,
        split: str = "train",
        rank: int = 0,
        world_size: int = 1,
        run_dir: str | Path | None = None,
        staging: StagingSpec | None = None,
        counts: EventCounts | None = None,
    ) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside world size {world_size}")
        train = split == "train"
        run = str(run_dir) if run_dir is not None else None
        max_events = data.max_events if train else 0
        self.index = build_index(
            list(files), data.on_bad_file, run, max_events, data.hdf5_unit_events, rank == 0, staging
        )
        # remote inputs: staged along the order by the sampler (local files in the list pass through)
        remote = any(is_remote(f) for f in self.index.files)
        self._staged = StagedFiles(self.index.files, staging or StagingSpec()) if remote else None
        self.on_bad_file, self.run_dir = data.on_bad_file, run
        self.batch_size, self.seed, self.rank, self.world_size = data.batch_size, seed, rank, world_size
        self.drop_last, self.prefetch_batches = train, data.prefetch_batches if train else 0
        self.allow_changed_files = data.allow_changed_files
        if self.drop_last:
            capped = f" (data.max_events={max_events})" if max_events else ""
            what = f"the training files hold {self.index.total} events{capped}"
            check_one_batch(self.index.total, data.batch_size, world_size, what, "add files")
        self._dataset = _chunks(self.index, data, seed, train, run, rank)
        # The file list's state, built again only when the index changes: state_dict() runs every update.
        self._files_state: tuple[tuple[int, int], dict[str, Any]] | None = None
        self.epoch, self.position = 0, 0
        self._start_epoch, self._start_position = 0, 0
        # removed/skipped events, each counted once, said once per split and hop (event_counts.py); a stream with
        # its own counts says what is left to say at its close (a validation pass given the task's counts leaves
        # that to the training stream)
        self._own_counts = counts is None
        self.counts = counts if counts is not None else EventCounts(data)
        self.split = split
        self.counts.expect(split, sum(1 for rows in self.index.unit_rows for n in rows if n > 0))
        self._continuous = False  # the sampler goes on into the next epochs (_endless, local inputs)
        self._prefetcher: Prefetcher[tuple[MuonBatch, int, int]] | None = None
        options = LoaderOptions.from_config(data, persistent=train)
        self._pinned = options.pin_memory  # batches joined from pieces go to page-locked memory (CUDA)
        # workers write results into buffers lent by this process (in flight: prefetch_factor per worker; a few
        # more for batches the consumer still holds); 0 workers reuse their own (decode.Recycled)
        workers = options.num_workers
        self._lent = LentBuffers(workers * options.prefetch_factor + 4) if workers else None
        # 0 workers, local files: units decoded on a background thread an item ahead (data.read_ahead)
        ahead = torch.cuda.is_available() if data.read_ahead == "auto" else data.read_ahead
        self.read_ahead = ahead and workers == 0 and self._staged is None
        if self.read_ahead:
            self._dataset.start_read_ahead()
        self._loader = make_loader(
            self._dataset,
            options,
            seed,
            rank,
            sampler=_Items(self),
            collate_fn=as_batch,
            worker_init_fn=_init_worker,
        )

    @classmethod
    def from_config(
        cls,
        data: MuonData,
        seed: int,
        env: ClusterEnv,
        run_dir: str | Path | None,
        split: str = "train",
        counts: EventCounts | None = None,
    ) -> EventStream:
        """This rank's stream of `data`'s files (data.paths for 'train', val_paths for 'val'); `counts`: shared
        with other streams of the hop (see EventCounts), else its own."""
        files = resolve_files(data.paths if split == "train" else data.val_paths, data)
        return cls(
            files,
            data,
            seed,
            split=split,
            rank=env.rank,
            world_size=env.world_size,
            run_dir=run_dir,
            staging=StagingSpec.from_config(data, env),
            counts=counts,
        )

    @property
    def samples_per_epoch(self) -> int:
        g = self.batch_size * self.world_size
        return self.index.total // g * g if self.drop_last else self.index.total

    @property
    def stage_wait_seconds(self) -> float:
        """Seconds spent blocked waiting for remote files to be staged (0 for local inputs)."""
        return self._staged.wait_seconds if self._staged is not None else 0.0

    @property
    def staging_stats(self) -> dict[str, int]:
        """Counts of the stagers closed so far (downloaded, downloaded_bytes, reused, retries, evicted)."""
        return dict(self._staged.stats) if self._staged is not None else {}

    # ---- one epoch -----------------------------------------------------------------------------------------

    def _begin_staging(self, epoch: int, position: int, then_next: bool) -> None:
        plan = self._dataset.plan(epoch)
        if self._staged is None or position >= plan.total:
            return
        after: list[int] = []
        if then_next:  # the next epoch's first files, so that crossing into it does not stall
            d = self._dataset
            after = EpochPlan(self.index.unit_rows, self.seed, epoch + 1, d.shuffle, d.window).files_from()
        self._staged.begin(plan, plan.chunk_of(position), after)

    def _stage_items(self, plan: EpochPlan, items: Iterator[WorkItem]) -> Iterator[WorkItem]:
        """Main side: stage the files of each item's chunk before a worker gets it (blocks if not there)."""
        assert self._staged is not None
        for item in items:
            files = list(dict.fromkeys(u.file for u in plan.chunks[item.chunk]))
            item.paths, bad = self._staged.paths(item.epoch, files)
            for f, reason in bad:
                uri = self.index.files[f]
                if self.on_bad_file != "skip":
                    raise UserError(
                        f"{uri}: cannot be staged ({reason}); set data.on_bad_file=skip to go on without it"
                    )
                note_bad_file(self.run_dir if self.rank == 0 else None, uri, f"staging: {reason}")
            yield item

    def epoch_batches(
        self, epoch: int, position: int, then_next: bool = False
    ) -> Iterator[tuple[MuonBatch, int]]:
        """(batch, global position after it) of one epoch from `position`, in order (`then_next`: the next
        epoch follows, so remote files of its start may be staged already)."""
        self._start_epoch, self._start_position, self._continuous = epoch, position, False
        self._begin_staging(epoch, position, then_next)
        g, total = self.batch_size * self.world_size, self.index.total  # (a sum over the files)
        batches: Reassembly[MuonBatch] = Reassembly()
        for result in self._loader.epoch(epoch):
            self._take(result)
            for size, piece in result.pieces():
                batches.add(size, piece)
            for k, parts in batches.ready():
                yield MuonBatch.concat(parts, self._pinned), min(position + (k + 1) * g, total)
        batches.check_done()
        if self._staged is not None:
            self._staged.end_epoch()
            log.info(
                "epoch %d: %.1f s waiting for staged files so far (%s)",
                epoch,
                self._staged.wait_seconds,
                ", ".join(f"{k} {v}" for k, v in self._staged.stats.items()),
            )

    def _lend(self, items: Iterator[WorkItem]) -> Iterator[WorkItem]:
        """Main side: a buffer for each item's result, when one is free."""
        assert self._lent is not None
        for item in items:
            item.loan = self._lent.lend()
            yield item

    def _take(self, result: ItemResult | ItemError) -> ItemResult:
        """Count a worker's result in (its error raised here, on the main side); its files are done."""
        if isinstance(result, ItemError):
            raise UserError(result.message)
        if self._lent is not None:
            self._lent.note(result.slot, result.in_slot, result.nbytes)
            self._dataset.remember(result.proven)  # (0 workers: the same object proved them)
        self.counts.add(self.split, result.tallies)
        if self._staged is not None:
            self._staged.done(result.epoch, result.chunk)
        return result

    # ---- the endless stream (BatchStream) ------------------------------------------------------------------

    def _endless(self) -> Iterator[tuple[MuonBatch, int, int]]:
        """(batch, its epoch, the epoch's global position after it), epoch after epoch.

        Local inputs: ONE pass of the loader over all epochs, so the workers go on into the next epoch while
        the last batches of this one are used (a pass per epoch drained them at every boundary: bench/loader.py's
        2 workers over 1 went from 1.45 to ~1.8). Remote inputs: epoch by epoch, staged ahead."""
        epoch, position = self.epoch, self.position
        if self._staged is not None:
            while True:
                kept = 0
                for batch, end in self.epoch_batches(epoch, position, then_next=True):
                    kept += len(batch)
                    yield batch, epoch, end
                self._epoch_done(epoch, position == 0, kept)
                epoch, position = epoch + 1, 0
        self._start_epoch, self._start_position, self._continuous = epoch, position, True
        g, total = self.batch_size * self.world_size, self.index.total  # (a sum over the files)
        batches: Reassembly[MuonBatch] = Reassembly()
        kept, whole = 0, position == 0
        for item in self._loader.epoch(epoch):
            result = self._take(item)
            if result.epoch != epoch:  # the first item of the next epoch: this one is complete
                batches.check_done()
                self._epoch_done(epoch, whole, kept)
                batches, epoch, position = Reassembly(), result.epoch, 0
                kept, whole = 0, True
            kept += sum(size.samples for size in result.sizes)
            for size, piece in result.pieces():
                batches.add(size, piece)
            for k, parts in batches.ready():
                yield MuonBatch.concat(parts, self._pinned), epoch, min(position + (k + 1) * g, total)

    def _epoch_done(self, epoch: int, whole: bool, kept: int) -> None:
        """The end of an epoch of this stream: what was removed is said (once per hop), and a whole epoch that
        kept no event is one line (UserError): its batches would all be empty, for ever."""
        self.counts.say(self.split)
        if not whole or kept:
            return
        removed = self.counts.removed(self.split)
        events, _, _ = self.counts.read(self.split)
        parts = [f"{n:,} {what_and_advice(kind, self.counts.data)[0]}" for kind, (n, _) in removed.items()]
        advice = [what_and_advice(kind, self.counts.data)[1] for kind in removed]
        raise UserError(
            f"muon data, {self.split} split: no event of the {events:,} read in epoch {epoch} is left to train on"
            + (f" ({'; '.join(parts)}): {advice[0]}" if parts else "")
        )

    @property
    def stats(self) -> dict[str, int]:
        """Distinct events removed this hop, per kind (event_counts.KINDS)."""
        return {kind: n for kind, (n, _) in self.counts.removed(self.split).items()}

    def __iter__(self) -> Iterator[MuonBatch]:
        self._stop_prefetcher()
        source: Iterator[tuple[MuonBatch, int, int]] = self._endless()
        if self.prefetch_batches > 0:
            self._prefetcher = Prefetcher(source, self.prefetch_batches)
            source = iter(self._prefetcher)
        for batch, epoch, end in source:
            self.epoch, self.position = epoch, end  # counted when handed out, not when prefetched
            yield batch

    def state_dict(self) -> dict[str, Any]:
        """The position, and the file list the position refers to (see data/fingerprint.py)."""
        return position_state(self.epoch, self.position, self._file_list_state())

    def _file_list_state(self) -> dict[str, Any]:
        key = (len(self.index.files), sum(self.index.events))
        if self._files_state is None or self._files_state[0] != key:
            self._files_state = (key, self.index.file_list().state())
        return self._files_state[1]

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue at the saved position; UserError if the files changed (unless allow_changed_files: then
        the saved epoch restarts from its start with the files found now)."""
        self.epoch, self.position = load_position(state, self.index.file_list(), self.allow_changed_files)

    def _stop_prefetcher(self) -> None:
        if self._prefetcher is not None:
            self._prefetcher.close()
            self._prefetcher = None

    def close(self) -> None:
        if self._own_counts:  # the end of this stream's hop (or pass): what is left to say
            self.counts.say_totals()
        self._stop_prefetcher()
        self._loader.close()
        self._dataset.close()
        if self._lent is not None:
            self._lent.close()
        if self._staged is not None:
            self._staged.close()


class ValBatches:
    """One pass over this rank's share of the validation files (built lazily: cheap to create). `counts`: the
    training stream's (removed events said once per hop over every pass); without, the pass says its totals."""

    def __init__(
        self, data: Any, seed: int, env: Any, run_dir: str | Path | None, counts: EventCounts | None = None
    ) -> None:
        self.data, self.seed, self.env, self.run_dir, self.counts = data, seed, env, run_dir, counts

    def __iter__(self) -> Iterator[MuonBatch]:
        # a pass of its own (`hpctrain evaluate`): its removed events said at its end
        counts = self.counts or EventCounts(self.data)
        stream = EventStream.from_config(self.data, self.seed, self.env, self.run_dir, "val", counts)
        try:
            for batch, _ in stream.epoch_batches(0, 0):
                if len(batch):
                    yield batch
        finally:
            stream.close()
            if self.counts is None:
                counts.say_totals()
