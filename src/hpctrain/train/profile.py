"""A window of updates under torch.profiler (`train.profile`), nothing outside it.

The trainer calls `step(update)` after every update: outside the window that is one integer comparison. Inside,
torch.profiler's schedule (wait until `start`, `warmup` discarded updates, `active` recorded ones) writes one
Chrome trace per rank through `tensorboard_trace_handler` into `<run>/profile/` (named `<run>_rank<R>.<time>.pt
.trace.json`: TensorBoard's profiler plugin lists it with `tensorboard --logdir <run>/profile`, Perfetto and
chrome://tracing open it), and the top operators by self time as a table in `<run>/profile/top_ops_rank<R>.txt`.
The window is counted in updates of the whole run: a hop that resumes past it profiles nothing.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from hpctrain.config.schema import ProfileConfig
from hpctrain.fsutil import make_folders

log = logging.getLogger(__name__)


class NoProfiler:
    """Stand-in when profiling is off (or not on this rank)."""

    def step(self, update: int) -> None:
        pass

    def close(self) -> None:
        pass


class WindowProfiler:
    def __init__(self, cfg: ProfileConfig, folder: Path, run_name: str, rank: int, cuda: bool) -> None:
        import torch.profiler as tp

        self.cfg, self.folder, self.rank = cfg, folder, rank
        self._first: int | None = None
        self._end = cfg.start + cfg.warmup + cfg.active
        self._done = False
        make_folders(folder)
        activities = [tp.ProfilerActivity.CPU] + ([tp.ProfilerActivity.CUDA] if cuda else [])
        self._prof: Any = tp.profile(
            activities=activities,
            schedule=tp.schedule(wait=0, warmup=cfg.warmup, active=cfg.active, repeat=1),
            on_trace_ready=self._ready,
            record_shapes=cfg.record_shapes,
            with_stack=cfg.with_stack,
            profile_memory=cfg.memory,
        )
        self._handler = tp.tensorboard_trace_handler(str(folder), worker_name=f"{run_name}_rank{rank}")
        self._running = False

    def step(self, update: int) -> None:
        """Called after update `update` (1-based count of updates done) has finished."""
        if self._done or update < self.cfg.start:
            return
        if not self._running:
            if update >= self._end:  # resumed past the window
                self._done = True
                return
            self._prof.start()
            self._running = True
            log.info("profiling updates %d..%d into %s", update + 1, self._end, self.folder)
            return
        self._prof.step()
        if update >= self._end:
            self.close()

    def _ready(self, prof: Any) -> None:
        self._handler(prof)
        table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25)
        (self.folder / f"top_ops_rank{self.rank}.txt").write_text(table + "\n")

    def close(self) -> None:
        if self._running:
            self._running = False
            self._prof.stop()
        self._done = True


def build_profiler(
    cfg: ProfileConfig | None, run_dir: Path, run_name: str, rank: int, cuda: bool
) -> WindowProfiler | NoProfiler:
    if cfg is None or (cfg.ranks == "0" and rank != 0):
        return NoProfiler()
    return WindowProfiler(cfg, run_dir / "profile", run_name, rank, cuda)
