"""The tracker interface every sink implements (metrics file, TensorBoard, W&B), and a fan-out."""

from __future__ import annotations

import logging
import time
from typing import Any, Protocol

import numpy as np

log = logging.getLogger(__name__)


FLUSH_SECONDS = 1.0


class Pace:
    """Due about once every `seconds`: when the progress lines kept since the last time are written out.

    Formatting and writing a line at every log step costs the update loop more than the work itself (cold code,
    a write call each: measured, docs/training.md), while whoever reads the file (`tail -f`) is served as well by
    the lines of the last second at once. The owners also write out at once at messages, evaluations, checkpoint
    commits and close: what a hard kill can lose is the last second's progress lines, never a line a checkpoint
    depends on."""

    def __init__(self, seconds: float = FLUSH_SECONDS) -> None:
        self.seconds = seconds
        self._last = time.monotonic()
        # The monotonic clock as the last `due()` read it: a caller stamping what it keeps (metrics.jsonl's
        # `time`) reuses that reading instead of reading a clock again.
        self.now = self._last

    def due(self) -> bool:
        self.now = now = time.monotonic()
        if now - self._last < self.seconds:
            return False
        self._last = now
        return True


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

    def show(self) -> None:
        """What was logged so far out to readers (buffered lines written): cheap, no mirroring. Called before the
        loop goes quiet for a while (an evaluation)."""
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

    def show(self) -> None:
        for sink in self.sinks:
            sink.show()

    def close(self) -> None:
        for sink in self.sinks:
            try:
                sink.close()
            except Exception as exc:  # closing one sink must not lose the others' data
                log.warning("closing %s failed: %s", sink.name, exc)
