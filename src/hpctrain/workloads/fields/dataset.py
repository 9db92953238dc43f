"""Map-style data sets of fields: generated on the fly from (seed, split, index), or read from shards on disk.

Both return a sample as (map (1, N, N), params (2,)) and a whole batch at once through `__getitems__` as
(maps (B, 1, N, N), params (B, 2)): the generators are vectorised over the batch.
"""

from __future__ import annotations

import json
import os
from bisect import bisect_right
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from hpctrain.workloads.fields.generate import PARAMETERS, SPLITS, generate_maps

Batch = tuple[torch.Tensor, torch.Tensor]


class GeneratedFields(Dataset[Batch]):
    """Maps 0..n-1 of a split, each generated from its own stream (seed, split, index) when asked for."""

    def __init__(
        self,
        kind: str,
        split: str,
        n: int,
        seed: int,
        size: int,
        box_size: float,
        prior: Sequence[tuple[float, float]],
    ) -> None:
        if split not in SPLITS:
            raise ValueError(f"split={split!r} is not one of {', '.join(SPLITS)}")
        self.kind, self.split, self.n, self.seed = kind, split, n, seed
        self.size, self.box_size = size, box_size
        self.prior = [(float(lo), float(hi)) for lo, hi in prior]

    def __len__(self) -> int:
        return self.n

    def __getitems__(self, indices: Sequence[int]) -> Batch:
        if any(not 0 <= i < self.n for i in indices):
            raise IndexError(f"map index out of range 0..{self.n - 1}")
        maps, params = generate_maps(
            self.kind, list(indices), self.seed, self.split, self.size, self.box_size, self.prior
        )
        return torch.from_numpy(maps).unsqueeze(1), torch.from_numpy(params)

    def __getitem__(self, index: int) -> Batch:
        maps, params = self.__getitems__([index])
        return maps[0], params[0]


class ShardFields(Dataset[Batch]):
    """The maps of one split folder written by `write_split` (HDF5 or .npy shards, described by meta.json)."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        meta_file = self.folder / "meta.json"
        if not meta_file.is_file():
            raise ValueError(
                f"{self.folder} has no meta.json: write it with `hpctrain data generate --kind fields`"
            )
        self.meta: dict[str, Any] = json.loads(meta_file.read_text())
        if self.meta.get("parameters") != list(PARAMETERS):
            raise ValueError(
                f"{meta_file}: parameters {self.meta.get('parameters')} are not {list(PARAMETERS)}"
            )
        self.shards = self.meta["shards"]
        self.starts = np.cumsum([0] + [s["n"] for s in self.shards]).tolist()
        self._open: dict[int, Any] = {}
        self._pid = -1

    @property
    def prior(self) -> list[tuple[float, float]]:
        return [tuple(self.meta["prior"][name]) for name in PARAMETERS]  # type: ignore[misc]

    def __len__(self) -> int:
        return int(self.starts[-1])

    def _shard(self, number: int) -> Any:
        # Handles are opened per process: an h5py handle must not cross a DataLoader fork.
        if self._pid != os.getpid():
            self._open, self._pid = {}, os.getpid()
        if number not in self._open:
            files = self.shards[number]["files"]
            if self.meta["format"] == "hdf5":
                import h5py

                h5 = h5py.File(self.folder / files["maps"], "r")
                self._open[number] = (h5["maps"], h5["params"])
            else:
                self._open[number] = tuple(
                    np.load(self.folder / files[k], mmap_mode="r") for k in ("maps", "params")
                )
        return self._open[number]

    def __getitems__(self, indices: Sequence[int]) -> Batch:
        size = self.meta["size"]
        maps = np.empty((len(indices), 1, size, size), dtype=np.float32)
        params = np.empty((len(indices), len(PARAMETERS)), dtype=np.float32)
        for row, index in enumerate(indices):
            if not 0 <= index < len(self):
                raise IndexError(f"map index {index} out of range 0..{len(self) - 1}")
            number = bisect_right(self.starts, index) - 1
            shard_maps, shard_params = self._shard(number)
            local = index - self.starts[number]
            maps[row, 0] = shard_maps[local]
            params[row] = shard_params[local]
        return torch.from_numpy(maps), torch.from_numpy(params)

    def __getitem__(self, index: int) -> Batch:
        maps, params = self.__getitems__([index])
        return maps[0], params[0]

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_open"], state["_pid"] = {}, -1
        return state


def as_batch(batch: Any) -> Any:
    """collate_fn for data sets that return whole batches already."""
    return batch


def eval_batches(dataset: Dataset[Batch], batch_size: int, rank: int, world_size: int) -> list[Batch]:
    """One pass over a validation set as whole batches, split over ranks without duplicates."""
    mine = list(range(rank, len(dataset), world_size))  # type: ignore[arg-type]
    return [dataset.__getitems__(mine[i : i + batch_size]) for i in range(0, len(mine), batch_size)]  # type: ignore[attr-defined]
