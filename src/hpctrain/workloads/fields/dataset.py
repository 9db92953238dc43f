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

from hpctrain.data.fingerprint import FileList
from hpctrain.errors import UserError
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


def _meta_problem(meta: dict[str, Any], counts: list[Any], formats: tuple[Any, list[Any]]) -> str | None:
    """What makes a meta.json unusable before any shard is opened (None: nothing): counts that are no whole
    numbers (or overflow: their sum must stay a count), a map size that is none, an unknown format."""
    whole = [isinstance(n, int) and not isinstance(n, bool) and 0 <= n < 2**40 for n in counts]
    if not all(whole):
        at = whole.index(False)
        return f"shard {at} says n={counts[at]!r}: not a whole number of maps (0 .. 2**40)"
    size = meta.get("size")
    if not (isinstance(size, int) and not isinstance(size, bool) and 1 <= size <= 2**16):
        return f"size={size!r}: not a map size (1 .. 65536)"
    fmt, files = formats
    if fmt not in ("hdf5", "npy"):
        return f"format={fmt!r}: not hdf5 or npy"
    needed = ("maps",) if fmt == "hdf5" else ("maps", "params")
    for at, named in enumerate(files):
        if not isinstance(named, dict) or not all(isinstance(named.get(k), str) for k in needed):
            return f"shard {at} names no {' and '.join(needed)} file"
    return None


class ShardFields(Dataset[Batch]):
    """The maps of one split folder written by `write_split` (HDF5 or .npy shards, described by meta.json).

    Every shard is opened once when the data set is made (headers only), so a missing, truncated or foreign
    shard is a one-line UserError naming it before training starts, not an error in a DataLoader worker."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        meta_file = self.folder / "meta.json"
        if not meta_file.is_file():
            raise UserError(
                f"{self.folder} has no meta.json: write it with `hpctrain data generate --kind fields`"
            )
        try:
            self.meta: dict[str, Any] = json.loads(meta_file.read_text())
            self.shards = list(self.meta["shards"])
            counts = [s["n"] for s in self.shards]
            formats = self.meta["format"], [s["files"] for s in self.shards]
        except (OSError, ValueError, KeyError, TypeError, RecursionError) as err:
            raise UserError(f"{meta_file}: not a fields meta.json ({type(err).__name__}: {err})") from None
        problem = _meta_problem(self.meta, counts, formats)
        if problem:
            raise UserError(f"{meta_file}: {problem}; write the split again with `hpctrain data generate`")
        if self.meta.get("parameters") != list(PARAMETERS):
            raise UserError(
                f"{meta_file}: parameters {self.meta.get('parameters')} are not {list(PARAMETERS)}"
            )
        self.starts = np.cumsum([0, *counts]).tolist()
        self._open: dict[int, Any] = {}
        self._pid = -1
        self._check_shards()

    def _paths(self, number: int) -> list[Path]:
        files = self.shards[number]["files"]
        keys = ("maps",) if self.meta["format"] == "hdf5" else ("maps", "params")
        return [self.folder / files[k] for k in keys]

    def _check_shards(self) -> None:
        again = "write the split again with `hpctrain data generate --kind fields`"
        for number, shard in enumerate(self.shards):
            for path in self._paths(number):
                if not path.is_file():
                    raise UserError(
                        f"{path}: no such file, but {self.folder / 'meta.json'} lists it; {again}"
                    )
            try:
                arrays = self._load(number)
                shapes = [a.shape for a in arrays]
                if self.meta["format"] == "hdf5":
                    arrays[0].file.close()
                del arrays  # the memory maps of .npy shards close with their arrays
            except Exception as err:  # missing, truncated or foreign: numpy/h5py raise many types
                first = str(err).strip().splitlines()[0] if str(err).strip() else ""
                names = ", ".join(p.name for p in self._paths(number))
                raise UserError(
                    f"{self.folder}: {names} cannot be read ({type(err).__name__}: {first}); write the "
                    f"split again with `hpctrain data generate --kind fields`"
                ) from None
            if any(shape[0] != shard["n"] for shape in shapes):
                raise UserError(
                    f"{self.folder}: shard {number} holds {[s[0] for s in shapes]} maps/params, meta.json says "
                    f"{shard['n']}; write the split again with `hpctrain data generate --kind fields`"
                )
            size = self.meta["size"]
            if shapes[0][1:] != (size, size) or shapes[-1][1:] != (len(PARAMETERS),):
                raise UserError(
                    f"{self.folder}: shard {number} holds maps of shape {shapes[0][1:]} and parameters of "
                    f"shape {shapes[-1][1:]}, meta.json says {size} x {size} maps of {len(PARAMETERS)} "
                    f"parameters; {again}"
                )

    def file_list(self) -> FileList:
        """The shard files with their sizes and maps (what a checkpoint's fingerprint compares)."""
        names, sizes, events = [], [], []
        for number, shard in enumerate(self.shards):
            for path in self._paths(number):
                names.append(str(path.resolve()))
                sizes.append(path.stat().st_size)
                events.append(int(shard["n"]))
        return FileList(names, sizes, events)

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
            self._open[number] = self._load(number)
        return self._open[number]

    def _load(self, number: int) -> tuple[Any, Any]:
        paths = self._paths(number)
        if self.meta["format"] == "hdf5":
            import h5py

            h5 = h5py.File(paths[0], "r")
            return h5["maps"], h5["params"]
        maps, params = (np.load(p, mmap_mode="r") for p in paths)
        return maps, params

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


def eval_batches(dataset: Dataset[Batch], batch_size: int, rank: int, world_size: int) -> list[Batch]:
    """One pass over a validation set as whole batches, split over ranks without duplicates."""
    mine = list(range(rank, len(dataset), world_size))  # type: ignore[arg-type]
    return [dataset.__getitems__(mine[i : i + batch_size]) for i in range(0, len(mine), batch_size)]  # type: ignore[attr-defined]
