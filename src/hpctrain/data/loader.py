"""Sharded, exactly resumable streams: the DataLoader both streams use, their position, and one for map-style sets.

Each epoch has ONE global, seeded order of samples; it is cut into global batches of `batch_size * world_size`
and rank r takes the r-th slice of each. The position is the number of samples of the epoch consumed by all
ranks together, so a resumed stream continues with the very next sample without reading the past, also with a
different number of workers or ranks. A data set read from files passes their `FileList`: the state then
holds it, and a resume into other files stops or restarts the epoch (see data/fingerprint.py).

`make_loader` builds the DataLoader of every stream (this module's `IndexedStream` and the muon `EventStream`):
worker seeds from a private generator seeded per (seed, epoch, rank), workers that ignore stop signals, and a
`close` that ends the workers (also at exit, for a loader left open). `position_state`/`load_position` are the
one form of the position in a checkpoint.
"""

from __future__ import annotations

import atexit
import random
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler, default_collate
from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter

from hpctrain.config.schema import DataConfigBase
from hpctrain.data.fingerprint import FileList, check_resume
from hpctrain.errors import UserError
from hpctrain.runtime.env import ClusterEnv
from hpctrain.runtime.seeding import EPOCH_ORDER, LOADER_WORKERS, NUMPY_SEED_SPAN, derive
from hpctrain.runtime.signals import ignore_stop_signals


def epoch_order(n: int, seed: int, epoch: int, shuffle: bool) -> torch.Tensor:
    """(n,) the epoch's global order of sample indices."""
    if not shuffle:
        return torch.arange(n)
    return torch.randperm(n, generator=torch.Generator().manual_seed(derive(seed, EPOCH_ORDER, epoch)))


def seed_worker(worker_id: int) -> None:
    """Each worker gets its own NumPy/Python stream (derived from the per-worker torch seed) and ignores the
    stop signals, which are the main process's business."""
    ignore_stop_signals()
    seed = torch.initial_seed() % NUMPY_SEED_SPAN
    np.random.seed(seed)
    random.seed(seed)


def as_batch(batch: Any) -> Any:
    """collate_fn for data sets that return whole batches already (`__getitems__`, or a work item's result)."""
    return batch


# ---- the DataLoader of every stream ------------------------------------------------------------------------


@dataclass(frozen=True)
class LoaderOptions:
    """The DataLoader settings of a `data` section (DataConfigBase)."""

    num_workers: int = 0
    prefetch_factor: int = 2
    persistent_workers: bool = False
    pin_memory: bool = False

    @classmethod
    def from_config(cls, data: DataConfigBase, persistent: bool = True) -> LoaderOptions:
        """`persistent=False` for a one-pass stream (validation): its workers end with the pass."""
        return cls(
            num_workers=data.num_workers,
            prefetch_factor=data.prefetch_factor,
            persistent_workers=data.persistent_workers and persistent,
            pin_memory=data.pin_memory and torch.cuda.is_available(),
        )


class SeededLoader:
    """A DataLoader whose worker seeds are a function of (seed, epoch, rank) only, and that can be closed."""

    def __init__(self, loader: DataLoader[Any], generator: torch.Generator, seed: int, rank: int) -> None:
        self._loader, self._generator, self._seed, self._rank = loader, generator, seed, rank
        self._iterators: weakref.WeakSet[Iterator[Any]] = weakref.WeakSet()
        _OPEN.add(self)

    def epoch(self, epoch: int) -> Iterator[Any]:
        """An iterator over the loader for `epoch`. The worker base seeds come from this private generator,
        never from the global torch RNG: creating an iterator (each epoch, after a resume, for validation)
        leaves the model's random stream alone."""
        self._generator.manual_seed(derive(self._seed, LOADER_WORKERS, epoch, self._rank))
        iterator = iter(self._loader)
        self._iterators.add(iterator)
        return iterator

    def close(self) -> None:
        """End the workers of every iterator made, even one a suspended generator still holds (DataLoader has
        no close(): its iterators end their workers when collected, which that reference prevents)."""
        for iterator in list(self._iterators):
            if isinstance(iterator, _MultiProcessingDataLoaderIter):
                iterator._shutdown_workers()  # what its __del__ calls: idempotent
        self._iterators = weakref.WeakSet()
        self._loader._iterator = None  # type: ignore[attr-defined]
        _OPEN.discard(self)


# Loaders not closed yet: closed at exit. Their workers ignore SIGTERM (the stop signals are the main process's
# business), so multiprocessing's own exit hook, which terminates its children and then joins them, would wait
# forever for a stream nobody closed. Registered after multiprocessing's hook (imported with torch), so it runs
# before it.
_OPEN: weakref.WeakSet[SeededLoader] = weakref.WeakSet()


@atexit.register
def _close_open_loaders() -> None:
    for loader in list(_OPEN):
        loader.close()


def make_loader(
    dataset: Dataset[Any],
    options: LoaderOptions,
    seed: int,
    rank: int,
    *,
    sampler: Sampler[Any] | None = None,
    batch_sampler: Sampler[list[int]] | None = None,
    collate_fn: Callable[[Any], Any] | None = None,
    worker_init_fn: Callable[[int], None] = seed_worker,
) -> SeededLoader:
    """The DataLoader of a stream: `batch_sampler` hands out index lists (collated by `collate_fn`), or
    `sampler` hands out items that are whole batches already (`batch_size=None`). `worker_init_fn` must call
    `seed_worker` first."""
    workers = options.num_workers
    generator = torch.Generator()
    loader = DataLoader(
        dataset,
        batch_size=None if sampler is not None else 1,
        sampler=sampler,
        batch_sampler=batch_sampler,
        collate_fn=collate_fn,
        num_workers=workers,
        worker_init_fn=worker_init_fn if workers > 0 else None,
        prefetch_factor=options.prefetch_factor if workers > 0 else None,
        persistent_workers=options.persistent_workers and workers > 0,
        pin_memory=options.pin_memory,
        generator=generator,
    )
    return SeededLoader(loader, generator, seed, rank)


# ---- the position in a checkpoint --------------------------------------------------------------------------


def position_state(epoch: int, position: int, files: dict[str, Any] | None) -> dict[str, Any]:
    """A stream's position as its state_dict holds it (`files`: FileList.state() of its files, if any)."""
    state: dict[str, Any] = {"epoch": epoch, "position": position}
    if files is not None:
        state["files"] = files
    return state


def load_position(
    state: dict[str, Any], files: FileList | None, allow_changed_files: bool
) -> tuple[int, int]:
    """(epoch, position) to continue at; UserError if the files changed (unless allowed: then the saved epoch
    restarts from its start with the files found now)."""
    epoch = int(state["epoch"])
    # "offset": the key of IndexedStream checkpoints written before both streams shared this form
    position = int(state["position"] if "position" in state else state["offset"])
    if files is not None and check_resume(state.get("files"), files, allow_changed_files, epoch):
        position = 0
    return epoch, position


def check_one_batch(samples: int, batch_size: int, world_size: int, what: str, remedy: str) -> None:
    """UserError when the data (`what`: "the training set holds N samples") is less than one global batch: a
    stream that drops the last partial batch would yield nothing."""
    if samples < batch_size * world_size:
        raise UserError(
            f"{what}, fewer than one global batch of {batch_size * world_size} (data.batch_size={batch_size} x "
            f"{world_size} ranks): lower data.batch_size to at most {samples // world_size} or {remedy}"
        )


# ---- a map-style data set ----------------------------------------------------------------------------------


class _RankBatches(Sampler[list[int]]):
    """Batch sampler: this rank's index lists from a position in the epoch's global order."""

    def __init__(self, stream: IndexedStream) -> None:
        self.stream = stream

    def __iter__(self) -> Iterator[list[int]]:
        for index in self.stream.rank_indices():
            yield index.tolist()

    def __len__(self) -> int:
        s = self.stream
        return (len(s.dataset) - s.position) // (s.batch_size * s.world_size)


@runtime_checkable
class TakesIndex(Protocol):
    """A map-style data set that fetches a whole batch from an index tensor (no list of ints in between)."""

    def take(self, index: torch.Tensor) -> Any:
        """The samples `index` (B,) int64, as one batch."""


class IndexedStream:
    """Endless training batches (BatchStream protocol) of a map-style data set.

    With worker processes (or pinned memory) the batches come through the DataLoader; without, straight from
    the data set in this process: the DataLoader would add nothing but a sampler, a fetcher and a profiler
    record per batch (~10 us, the per-update cost that shows on small models). Both read the same order.
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
        *,
        options: LoaderOptions = LoaderOptions(),
        shuffle: bool = True,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        files: FileList | None = None,
        allow_changed_files: bool = False,
    ) -> None:
        self.dataset = dataset
        self.batch_size, self.seed, self.rank, self.world_size = batch_size, seed, rank, world_size
        self.shuffle = shuffle
        self.epoch = 0
        self.position = 0
        self.files, self.allow_changed_files = files, allow_changed_files
        self._files_state = files.state() if files is not None else None  # state_dict() runs every update
        n = len(dataset)
        check_one_batch(n, batch_size, world_size, f"the training set holds {n} samples", "use more data")
        self._loader = make_loader(
            dataset, options, seed, rank, batch_sampler=_RankBatches(self), collate_fn=collate_fn
        )
        self._in_process = options.num_workers == 0 and not options.pin_memory
        self._fetch = _fetcher(dataset, collate_fn)

    @classmethod
    def from_config(
        cls,
        dataset: Any,
        data: DataConfigBase,
        seed: int,
        env: ClusterEnv,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        files: FileList | None = None,
    ) -> IndexedStream:
        """The stream a `data` section (DataConfigBase) asks for, sharded by the ClusterEnv's rank (`files`:
        the files the data set reads, if any)."""
        return cls(
            dataset,
            data.batch_size,
            seed,
            env.rank,
            env.world_size,
            options=LoaderOptions.from_config(data),
            shuffle=data.shuffle,
            collate_fn=collate_fn,
            files=files,
            allow_changed_files=data.allow_changed_files,
        )

    @property
    def samples_per_epoch(self) -> int:
        global_batch = self.batch_size * self.world_size
        return len(self.dataset) // global_batch * global_batch  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[Any]:
        return self._fetched() if self._in_process else self._loaded()

    def _loaded(self) -> Iterator[Any]:
        while True:
            whole, given = self.position == 0, 0
            for batch in self._loader.epoch(self.epoch):
                self.position += self.batch_size * self.world_size
                given += 1
                yield batch
            self._next_epoch(whole, given)

    def _fetched(self) -> Iterator[Any]:
        """The batches of the indices _RankBatches hands the DataLoader, fetched here (0 workers, nothing
        pinned)."""
        fetch, global_batch = self._fetch, self.batch_size * self.world_size
        while True:
            whole, given = self.position == 0, 0
            for index in self.rank_indices():
                batch = fetch(index)
                self.position += global_batch
                given += 1
                yield batch
            self._next_epoch(whole, given)

    def _next_epoch(self, whole: bool, given: int) -> None:
        """On to the next epoch; a whole epoch that gave no batch would spin here without handing anything out
        (deaf to stops): one line instead (the data set shrank below a global batch since it was checked)."""
        if whole and not given:
            check_one_batch(
                len(self.dataset),
                self.batch_size,
                self.world_size,
                f"the training set holds {len(self.dataset)} samples",
                "use more data",
            )
            raise UserError(f"epoch {self.epoch} of the training data gave no batch")
        self.epoch += 1
        self.position = 0

    def rank_indices(self) -> Iterator[torch.Tensor]:
        """(batch_size,) this rank's sample indices of each global batch of the epoch, from the position on."""
        order = epoch_order(len(self.dataset), self.seed, self.epoch, self.shuffle)
        global_batch = self.batch_size * self.world_size
        position = self.position
        while position + global_batch <= len(order):
            start = position + self.rank * self.batch_size
            yield order[start : start + self.batch_size]
            position += global_batch

    def state_dict(self) -> dict[str, Any]:
        return position_state(self.epoch, self.position, self._files_state)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.position = load_position(state, self.files, self.allow_changed_files)

    def close(self) -> None:
        self._loader.close()


def _fetcher(dataset: Any, collate_fn: Callable[[Any], Any] | None) -> Callable[[torch.Tensor], Any]:
    """index (B,) -> the batch, as the DataLoader's own fetcher makes it (whole-batch `__getitems__` or one
    sample at a time, then `collate_fn`); a TakesIndex data set takes the tensor itself."""
    collate = collate_fn or default_collate
    if isinstance(dataset, TakesIndex):
        take = dataset.take
        return take if collate is as_batch else lambda index: collate(take(index))
    # torch's protocol for whole-batch fetching (what the DataLoader's fetcher looks for)
    many = getattr(dataset, "__getitems__", None)
    if many is not None:
        return lambda index: collate(many(index.tolist()))
    return lambda index: collate([dataset[i] for i in index.tolist()])


def eval_batches(
    dataset: Dataset[Any],
    batch_size: int,
    rank: int,
    world_size: int,
    collate_fn: Callable[[list[Any]], Any] | None = None,
) -> Iterator[Any]:
    """One pass over a validation set, split over ranks without duplicates (ranks may get unequal shares)."""
    n = len(dataset)  # type: ignore[arg-type]
    mine = list(range(rank, n, world_size))
    collate = collate_fn or torch.utils.data.default_collate
    for start in range(0, len(mine), batch_size):
        yield collate([dataset[i] for i in mine[start : start + batch_size]])
