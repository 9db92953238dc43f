"""Which trackers a run gets: rank 0 writes metrics.jsonl, plus TensorBoard and W&B when configured."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hpctrain.config.schema import ConfigBase
from hpctrain.runtime.env import ClusterEnv
from hpctrain.track.base import Trackers
from hpctrain.track.metrics_file import MetricsFile


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
