"""`data.kind=des`: a survey's maps that the user provides (e.g. DES Y3 convergence patches cut from the mass maps,
or simulated survey maps with known parameters), read from `data.path`:

    DIR/train/maps.npy    (n, N, N) float: the maps
    DIR/train/params.npy  (n, 2) float: Omega_m and sigma_8 of each map
    DIR/val/, DIR/test/   the same, optional
    DIR/mask.npy          (N, N), optional: 1 where the survey observed, 0 where it is masked (set to 0 in every map)

Opened once when the data set is made (memory-mapped, headers only), so anything missing or of the wrong shape is
one line naming the file before training starts. Also `First`: the first n maps of a data set (data.n_train,
n_val, n_test set with data.path: TRAIN_SAMPLES, VAL_SAMPLES).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from hpctrain.data.fingerprint import FileList
from hpctrain.errors import UserError
from hpctrain.workloads.fields.generate import PARAMETERS

Batch = tuple[torch.Tensor, torch.Tensor]
LAYOUT = (
    "train/maps.npy (n, N, N) and train/params.npy (n, 2: Omega_m, sigma_8); val/ and test/ alike, optional"
)


def _load(path: Path) -> np.ndarray:
    try:
        return np.load(path, mmap_mode="r")
    except (OSError, ValueError) as exc:
        raise UserError(f"{path}: not a .npy array NumPy can read ({exc})") from None


class SurveyMaps(Dataset[Batch]):
    """The maps of one split folder of the user's survey (the module docstring's layout)."""

    def __init__(self, folder: Path, mask: np.ndarray | None) -> None:
        self.folder = folder
        missing = [name for name in ("maps.npy", "params.npy") if not (folder / name).is_file()]
        if missing:
            raise UserError(
                f"data.path={folder.parent} (data.kind=des): {folder.name}/ has no {' and no '.join(missing)}; "
                f"the survey maps go into {LAYOUT} (docs/fields.md)"
            )
        self.maps, self.params = _load(folder / "maps.npy"), _load(folder / "params.npy")
        if self.maps.ndim != 3 or self.maps.shape[1] != self.maps.shape[2]:
            raise UserError(f"{folder / 'maps.npy'}: shape {self.maps.shape}, not (n, N, N) square maps")
        if self.params.shape != (len(self.maps), len(PARAMETERS)):
            raise UserError(
                f"{folder / 'params.npy'}: shape {self.params.shape}, not ({len(self.maps)}, {len(PARAMETERS)}): "
                "Omega_m and sigma_8 of each map in maps.npy"
            )
        if mask is not None and mask.shape != self.maps.shape[1:]:
            raise UserError(
                f"{folder.parent / 'mask.npy'}: shape {mask.shape}, not the maps' {self.maps.shape[1:]}"
            )
        self.mask = None if mask is None else np.asarray(mask, dtype=np.float32)

    @property
    def size(self) -> int:
        return int(self.maps.shape[1])

    def file_list(self) -> FileList:
        """The files with their sizes and maps (what a checkpoint's fingerprint compares)."""
        paths = [self.folder / "maps.npy", self.folder / "params.npy"]
        return FileList([str(p.resolve()) for p in paths], [p.stat().st_size for p in paths], [len(self)] * 2)

    def __len__(self) -> int:
        return len(self.maps)

    def __getitems__(self, indices: Sequence[int]) -> Batch:
        if any(not 0 <= i < len(self) for i in indices):
            raise IndexError(f"map index out of range 0..{len(self) - 1}")
        order = np.asarray(indices)
        maps = np.asarray(self.maps[order], dtype=np.float32)  # (B, N, N)
        if self.mask is not None:
            maps = maps * self.mask
        params = np.asarray(self.params[order], dtype=np.float32)
        return torch.from_numpy(maps).unsqueeze(1), torch.from_numpy(params)

    def __getitem__(self, index: int) -> Batch:
        maps, params = self.__getitems__([index])
        return maps[0], params[0]


def survey_split(root: Path, split: str) -> SurveyMaps | None:
    """The split's maps under data.path=root; None for a val/ or test/ that is not there (train/ must be)."""
    folder = root / split
    if split != "train" and not folder.is_dir():
        return None
    if not folder.is_dir():
        raise UserError(
            f"data.path={root} (data.kind=des): no train/ folder there; the survey maps go into {LAYOUT} "
            "(docs/fields.md)"
        )
    mask_file = root / "mask.npy"
    return SurveyMaps(folder, _load(mask_file) if mask_file.is_file() else None)


class First(Dataset[Batch]):
    """The first `n` maps of a data set (data.n_train / n_val / n_test set with data.path)."""

    def __init__(self, inner: Any, n: int) -> None:
        self.inner, self.n = inner, n

    def file_list(self) -> FileList:
        return self.inner.file_list()  # type: ignore[no-any-return]

    def __len__(self) -> int:
        return self.n

    def __getitems__(self, indices: Sequence[int]) -> Batch:
        if any(not 0 <= i < self.n for i in indices):
            raise IndexError(f"map index out of range 0..{self.n - 1}")
        return self.inner.__getitems__(indices)  # type: ignore[no-any-return]

    def __getitem__(self, index: int) -> Batch:
        maps, params = self.__getitems__([index])
        return maps[0], params[0]
