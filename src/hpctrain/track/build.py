"""Which trackers a run gets: rank 0 writes metrics.jsonl, plus TensorBoard and W&B when configured."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from hpctrain.config.schema import ConfigBase
from hpctrain.runtime.env import ClusterEnv
from hpctrain.track.base import Trackers
from hpctrain.track.console import Console
from hpctrain.track.metrics_file import MetricsFile
from hpctrain.track.monitor import Monitor, NoMonitor, build_monitor


def build_trackers(
    cfg: ConfigBase,
    run_dir: Path,
    env: ClusterEnv,
    resume_step: int | None,
    state: dict[str, Any],
    hop: dict[str, Any] | None = None,
    ran: dict[str, Any] | None = None,
) -> Trackers:
    """The sinks of rank 0; `state` is Trackers.state_dict() from the checkpoint we resumed from (or {}); `hop`
    goes into the hop's first metrics record; `ran` (what ran in this hop) into W&B's config."""
    trackers = Trackers([MetricsFile(run_dir / "metrics.jsonl", resume_step, hop)])
    tb = cfg.logging.tensorboard
    if tb.dir:
        from hpctrain.track.tensorboard import TensorBoardTracker

        trackers.add(
            TensorBoardTracker(
                tb.dir,
                tb.run_name,
                resume_step,
                state.get("tensorboard"),
                mirror_to=tb.mirror_to,
                run=cfg.run.name,
                mirror_every=tb.mirror_every_seconds,
                pelican=cfg.data.pelican,
                max_hist_values=tb.hist_max_muons,
            )
        )
    if cfg.logging.wandb.enabled:
        from hpctrain.track.wandb_tracker import WandbTracker

        trackers.add(WandbTracker(cfg, run_dir, resume_step, state.get("wandb"), ran))
    return trackers


def build_tracking(
    cfg: ConfigBase,
    run_dir: Path,
    env: ClusterEnv,
    where: tuple[int, int, int | None],
    state: dict[str, Any],
    hop: dict[str, Any],
    ran: dict[str, Any],
    time_left: Callable[[], float | None],
    log_file: TextIO | None,
    gpu: bool,
) -> tuple[Trackers, Console, Monitor | NoMonitor]:
    """Rank 0's trackers, console (its plain lines also into `log_file`, the run's training.log) and hardware
    monitor (NVML only where a GPU was asked for: a CPU run has nothing to say about GPU monitoring). `where`:
    the update count, the updates to train and the update resumed from (None: a fresh start)."""
    step, total, resumed = where
    trackers = build_trackers(cfg, run_dir, env, resumed, state, hop, ran)
    console = Console(total, step, cfg.logging.progress, time_left=time_left, log_file=log_file)
    monitor = build_monitor(cfg.logging.gpu_every_seconds, gpu=gpu)
    if monitor.note:
        console.message(monitor.note)
    return trackers, console, monitor
