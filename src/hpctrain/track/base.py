"""The tracker interface every sink implements (metrics file, TensorBoard, W&B), and a fan-out."""

from __future__ import annotations

import logging
from typing import Any, Protocol

import numpy as np

log = logging.getLogger(__name__)


class Tracker(Protocol):
    """A sink for metrics. Only rank 0 gets real trackers; other ranks get none."""

    name: str

    def log_scalars(self, step: int, scalars: dict[str, float]) -> None: ...

    def log_histograms(self, step: int, values: dict[str, np.ndarray]) -> None: ...

    def state_dict(self) -> dict[str, Any]:
        """What a later hop needs to continue the same run (e.g. a W&B run id); saved in checkpoints."""
        ...

    def flush(self) -> None:
        """Called after each checkpoint commit (and before mirroring)."""
        ...

    def close(self) -> None: ...


class Trackers:
    """Fans every call out to the enabled sinks."""

    def __init__(self, sinks: list[Tracker] | None = None) -> None:
        self.sinks: list[Tracker] = list(sinks or [])

    def add(self, sink: Tracker) -> None:
        self.sinks.append(sink)

    def log_scalars(self, step: int, scalars: dict[str, float]) -> None:
        for sink in self.sinks:
            sink.log_scalars(step, scalars)

    def log_histograms(self, step: int, values: dict[str, np.ndarray]) -> None:
        for sink in self.sinks:
            sink.log_histograms(step, values)

    def state_dict(self) -> dict[str, Any]:
        return {sink.name: sink.state_dict() for sink in self.sinks}

    def flush(self) -> None:
        for sink in self.sinks:
            sink.flush()

    def close(self) -> None:
        for sink in self.sinks:
            try:
                sink.close()
            except Exception as exc:  # closing one sink must not lose the others' data
                log.warning("closing %s failed: %s", sink.name, exc)
