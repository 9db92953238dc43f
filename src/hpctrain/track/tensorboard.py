"""TensorBoard: event files under <tensorboard.dir>/<run_name>, one folder for all hops of a run.

A resumed hop opens a new event file in the same folder with `purge_step = resume_step + 1`, so events that a
killed hop wrote after its last checkpoint are hidden by TensorBoard's reader and every step shows once.

`mirror_to` copies the folder after each checkpoint commit and, with `mirror_every` seconds, on a timer too;
a pelican:// or osdf:// destination is written with the data.pelican token in a background thread (newest
wins), so a slow federation never holds the training up.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from hpctrain.fsutil import check_own_folders, make_folders
from hpctrain.remote.pelican_write import RemoteFolder, is_pelican

log = logging.getLogger(__name__)

# Values per histogram at most: a muon batch can hold millions of muons, a histogram needs a few thousand.
MAX_HIST_VALUES = 8192


def timestamp_name(now: float | None = None) -> str:
    """The default run name, e.g. 20260105-105330 (local time)."""
    return time.strftime("%Y%m%d-%H%M%S", time.localtime(now))


def cap_values(values: np.ndarray, limit: int = MAX_HIST_VALUES, seed: int = 0) -> np.ndarray:
    """Finite values, flattened, subsampled to at most `limit` without touching the global RNG."""
    flat = np.asarray(values, dtype=np.float64).reshape(-1)
    flat = flat[np.isfinite(flat)]
    if flat.size > limit:
        # A private generator: drawing from numpy's global one would change the training's random streams.
        pick = np.random.default_rng(seed).choice(flat.size, size=limit, replace=False)
        flat = flat[np.sort(pick)]
    return flat


class TensorBoardTracker:
    name = "tensorboard"

    def __init__(
        self,
        root: str | Path,
        run_name: str | None,
        resume_step: int | None,
        state: dict[str, Any] | None = None,
        mirror_to: str | None = None,
        max_hist_values: int = MAX_HIST_VALUES,
        run: str | None = None,
        mirror_every: float = 0.0,
        pelican: Any = None,
    ) -> None:
        from torch.utils.tensorboard import SummaryWriter

        state = state or {}
        # Config wins; else the name chosen by the first hop; else the run's name and the first hop's time
        # (`debug-20260105-105330`: TensorBoard's run list says which run it is, `tb merge --since` the time).
        stamp = timestamp_name()
        self.run_name = run_name or state.get("run_name") or (f"{run}-{stamp}" if run else stamp)
        self.log_dir = Path(root) / self.run_name
        # a shared logging.tensorboard.dir: a link planted under the run's name is refused, never followed
        check_own_folders((self.log_dir, "TensorBoard folder"))
        make_folders(self.log_dir)
        self.mirror_to = mirror_to
        self.max_hist_values = max_hist_values
        purge = resume_step + 1 if resume_step is not None else None
        self.writer = SummaryWriter(log_dir=str(self.log_dir), purge_step=purge, flush_secs=60)
        self._dirty = False
        self.mirror_every = mirror_every
        self._mirrored_at = time.monotonic()
        self._remote = RemoteFolder(mirror_to, pelican) if mirror_to and is_pelican(mirror_to) else None
        log.info("TensorBoard: %s (view with: tensorboard --logdir %s)", self.log_dir, root)

    def log_scalars(self, step: int, scalars: dict[str, float]) -> None:
        for key, value in scalars.items():
            if value is None:
                continue
            self.writer.add_scalar(_tag(key), float(value), global_step=step)
        self._dirty = True
        if self.mirror_every and time.monotonic() - self._mirrored_at >= self.mirror_every:
            self.writer.flush()
            self._mirror()

    def log_histograms(self, step: int, values: dict[str, np.ndarray]) -> None:
        for key, array in values.items():
            capped = cap_values(array, self.max_hist_values, seed=step)
            if capped.size == 0:
                continue
            self.writer.add_histogram(f"hist/{key}", capped, global_step=step)
        self._dirty = True

    def state_dict(self) -> dict[str, Any]:
        return {"run_name": self.run_name}

    def flush(self) -> None:
        self.writer.flush()
        self._mirror()

    def show(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
        self._mirror()
        if self._remote is not None:
            self._remote.close()

    def _mirror(self) -> None:
        if not self.mirror_to or not self._dirty:
            return
        self._mirrored_at = time.monotonic()
        if self._remote is not None:
            self._remote.submit(self.log_dir)
            self._dirty = False
            return
        from hpctrain.remote.mirror import mirror

        try:
            mirror(str(self.log_dir), self.mirror_to)
            self._dirty = False
        except Exception as exc:  # a full or unreachable mirror must not stop the training
            log.warning("mirroring TensorBoard logs to %s failed: %s", self.mirror_to, exc)


def _tag(key: str) -> str:
    """Group scalars in TensorBoard's sidebar: val_* under val/, *_share under time/, rates under speed/."""
    if key.startswith("val_"):
        return f"val/{key[4:]}"
    if key.endswith("_share"):
        return f"time/{key[:-6]}"
    if key.endswith("_per_s") or key.startswith("gpu_mem"):
        return f"speed/{key}"
    return f"train/{key}"
