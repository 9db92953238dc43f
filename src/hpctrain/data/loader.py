"""A sharded, exactly resumable stream over a map-style data set.

Each epoch has ONE global, seeded order of samples; it is cut into global batches of `batch_size * world_size`
and rank r takes the r-th slice of each. The position is the number of samples of the epoch consumed by all
ranks together, so a resumed stream continues with the very next sample without reading the past, also with a
different number of workers or ranks. A data set read from files passes their `FileList`: the state then
holds it, and a resume into other files stops or restarts the epoch (see data/fingerprint.py).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from hpctrain.data.fingerprint import FileList, check_resume
from hpctrain.errors import UserError
from hpctrain.runtime.budget import ignore_stop_signals


def epoch_order(n: int, seed: int, epoch: int, shuffle: bool) -> torch.Tensor:
    if not shuffle:
        return torch.arange(n)
    generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(n, generator=generator)


def seed_worker(worker_id: int) -> None:
    """Each worker gets its own NumPy/Python stream (derived from the per-worker torch seed) and ignores the
    stop signals, which are the main process's business."""
    ignore_stop_signals()
    seed = torch.initial_seed() % 2**32
    np.random.seed(seed)
    random.seed(seed)


class _RankBatches:
    """Batch sampler: this rank's index lists from a position in the epoch's global order."""

    def __init__(self, stream: IndexedStream) -> None:
        self.stream = stream

    def __iter__(self) -> Iterator[list[int]]:
        s = self.stream
        order = epoch_order(len(s.dataset), s.seed, s.epoch, s.shuffle)
        global_batch = s.batch_size * s.world_size
        offset = s.offset
        while offset + global_batch <= len(order):
            start = offset + s.rank * s.batch_size
            yield order[start : start + s.batch_size].tolist()
            offset += global_batch

    def __len__(self) -> int:
        s = self.stream
        return (len(s.dataset) - s.offset) // (s.batch_size * s.world_size)


class IndexedStream:
    """Endless training batches (BatchStream protocol) of a map-style data set."""

    def __init__(
        self,
        dataset: Any,
        batch_size: int,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
        num_workers: int = 0,
        shuffle: bool = True,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        prefetch_factor: int = 2,
        persistent_workers: bool = False,
        pin_memory: bool = False,
        files: FileList | None = None,
        allow_changed_files: bool = False,
    ) -> None:
        self.dataset = dataset
        self.batch_size = batch_size
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.shuffle = shuffle
        self.epoch = 0
        self.offset = 0
        self.files, self.allow_changed_files = files, allow_changed_files
        self._files_state = files.state() if files is not None else None  # state_dict() runs every update
        n = len(dataset)
        if n < batch_size * world_size:
            raise UserError(
                f"the training set holds {n} samples, fewer than one global batch of {batch_size * world_size} "
                f"(data.batch_size={batch_size} x {world_size} ranks): lower data.batch_size to at most "
                f"{n // world_size} or use more data"
            )
        # The loader draws its worker base seed from its own generator, never from the global torch RNG, so that
        # creating a loader mid-epoch after a resume leaves the model's random stream untouched.
        self._generator = torch.Generator()
        self._loader = DataLoader(
            dataset,
            batch_sampler=_RankBatches(self),
            num_workers=num_workers,
            collate_fn=collate_fn,
            worker_init_fn=seed_worker if num_workers > 0 else None,
            prefetch_factor=prefetch_factor if num_workers > 0 else None,
            persistent_workers=persistent_workers and num_workers > 0,
            pin_memory=pin_memory,
            generator=self._generator,
        )

    @classmethod
    def from_config(
        cls,
        dataset: Any,
        data: Any,
        seed: int,
        env: Any,
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
            num_workers=data.num_workers,
            shuffle=data.shuffle,
            collate_fn=collate_fn,
            prefetch_factor=data.prefetch_factor,
            persistent_workers=data.persistent_workers,
            pin_memory=data.pin_memory and torch.cuda.is_available(),
            files=files,
            allow_changed_files=data.allow_changed_files,
        )

    @property
    def samples_per_epoch(self) -> int:
        global_batch = self.batch_size * self.world_size
        return len(self.dataset) // global_batch * global_batch  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[Any]:
        while True:
            self._generator.manual_seed(self.seed * 7919 + self.epoch + 104_729 * self.rank)
            for batch in self._loader:
                self.offset += self.batch_size * self.world_size
                yield batch
            self.epoch += 1
            self.offset = 0

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"epoch": self.epoch, "offset": self.offset}
        if self._files_state is not None:
            state["files"] = self._files_state
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch = int(state["epoch"])
        self.offset = int(state["offset"])
        if self.files is not None and check_resume(
            state.get("files"), self.files, self.allow_changed_files, self.epoch
        ):
            self.offset = 0

    def close(self) -> None:
        # Shuts persistent workers down by dropping the loader's iterator.
        self._loader._iterator = None  # type: ignore[attr-defined]


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
