"""`Events`: decoded events in physical units, what every reader yields and every writer takes. Its own module
so that what a reader reports about them (first_batch.py) needs no reader (layouts.py imports first_batch)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Events:
    """Decoded events in physical units: primaries (n, 4) [E, zenith, mass, depth_m] float32, muons (M, 3)
    [E, x, y] float32, counts (n,) int64, ids (n, 2) int64 [major, minor]."""

    primaries: np.ndarray
    muons: np.ndarray
    counts: np.ndarray
    ids: np.ndarray

    def __len__(self) -> int:
        return len(self.counts)

    @property
    def offsets(self) -> np.ndarray:
        out = np.zeros(len(self.counts) + 1, dtype=np.int64)
        np.cumsum(self.counts, out=out[1:])
        return out
