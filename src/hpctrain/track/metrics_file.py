"""metrics.jsonl: one JSON object per logged update, exactly once per update across resumed hops.

Each record: `step`, the logged scalars, `time` (when it was logged, epoch seconds) and `hop` (the index of the
job hop that logged it, as in chain.json); a hop's first record also has `hop_start` (world size, config hash
and the changes accepted or allowed at that hop). Records written before `time` and `hop` existed lack them, and
their hop's first record had the `hop_start` dict under `hop`: `record_hop` reads both.
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import Any

import numpy as np

from hpctrain.fsutil import atomic_write_text, open_append
from hpctrain.track.base import Pace
from hpctrain.track.chain import parse_record

log = logging.getLogger(__name__)

# What every record says about itself, beside the logged scalars.
RECORD_KEYS = ("step", "time", "hop", "hop_start")


def _clean(value: float) -> float | None:
    return None if value is None or not math.isfinite(value) else value


class MetricsFile:
    name = "metrics"

    def __init__(self, path: Path, resume_step: int | None, hop: dict[str, Any] | None = None) -> None:
        self.path = path
        # Every record carries the hop's index; the hop's first one also `hop_start`: world size, config hash and
        # changes (empty ones left out), so that the history shows where a hop began and what changed there.
        start = {k: v for k, v in (hop or {}).items() if v not in ({}, None) and k != "hop"}
        self._index: int | None = (hop or {}).get("hop")
        self._hop_start: dict[str, Any] | None = start or None
        if resume_step is not None:
            self.truncate_after(resume_step)
        elif path.exists():
            path.unlink()
        self._handle = open_append(path)  # open for the run, closed in close(); a planted link is refused
        # Records kept and written about once a second (see Pace), and at every checkpoint commit (flush): a
        # record past the last commit is dropped on resume anyway (truncate_after). Each is kept with the
        # monotonic time Pace read when it came (no clock read of its own), made wall time when written.
        self._pending: list[tuple[int, float, dict[str, float]]] = []
        self._pace = Pace()

    def truncate_after(self, step: int) -> None:
        """Drop records of updates after the checkpoint we resume from: they will be done again."""
        if not self.path.exists():
            return
        kept, torn = [], 0
        for line in self.path.read_text(errors="replace").splitlines():
            record = parse_record(line)
            if record is None:
                torn += 1  # a line cut by a kill, or damaged: no record
                continue
            if record["step"] <= step:
                kept.append(line)
        if torn:
            log.warning(
                "%s: dropped %d unreadable line%s (a write cut by a kill) or line%s holding no record (not a "
                "JSON object with a whole-number step); the updates after update %d are logged again",
                self.path,
                torn,
                "" if torn == 1 else "s",
                "" if torn == 1 else "s",
                step,
            )
        atomic_write_text(self.path, "".join(line + "\n" for line in kept))

    def log_scalars(self, step: int, scalars: dict[str, float]) -> None:
        due = self._pace.due()
        self._pending.append((step, self._pace.now, scalars))
        if due:
            self.show()

    def _line(self, step: int, when: float, scalars: dict[str, float]) -> str:
        record: dict[str, Any] = {"step": step}
        record.update({k: _clean(float(v)) for k, v in scalars.items()})
        record["time"] = round(when, 3)
        if self._index is not None:
            record["hop"] = self._index
        if self._hop_start is not None:
            record["hop_start"], self._hop_start = self._hop_start, None
        return json.dumps(record) + "\n"

    def log_histograms(self, step: int, values: dict[str, np.ndarray]) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        return {}

    def flush(self) -> None:
        self.show()

    def show(self) -> None:
        if self._pending:
            # Monotonic to wall time here, once per write (a wall clock stepped within the last second shifts
            # these records by that step, as it would have shifted a reading at each).
            offset = time.time() - time.monotonic()
            self._handle.write(
                "".join(self._line(step, when + offset, scalars) for step, when, scalars in self._pending)
            )
            self._pending.clear()
        self._handle.flush()

    def close(self) -> None:
        self.show()
        self._handle.close()


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The records of a metrics.jsonl; lines that are none (cut by a kill, damaged) left out."""
    lines = Path(path).read_text(errors="replace").splitlines()
    return [record for record in map(parse_record, lines) if record is not None]


def record_hop(record: dict[str, Any]) -> int | None:
    """The hop index of a metrics record: `hop` (an int), or in records older than that field, the `hop` dict
    of a hop's first record (None: the record does not say)."""
    hop = record.get("hop")
    if isinstance(hop, dict):
        hop = hop.get("hop")
    return hop if isinstance(hop, int) and not isinstance(hop, bool) else None
