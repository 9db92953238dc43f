"""metrics.jsonl: one JSON object per logged update, exactly once per update across resumed hops."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from hpctrain.fsutil import atomic_write_text
from hpctrain.track.base import Pace


def _clean(value: float) -> float | None:
    return None if value is None or not math.isfinite(value) else value


class MetricsFile:
    name = "metrics"

    def __init__(self, path: Path, resume_step: int | None, hop: dict[str, Any] | None = None) -> None:
        self.path = path
        # The hop's first record carries `hop`: its index, world size, config hash and changes (empty ones left
        # out), so that the history shows where a hop began and what changed there.
        self._hop = {k: v for k, v in (hop or {}).items() if v not in ({}, None)} or None
        if resume_step is not None:
            self.truncate_after(resume_step)
        elif path.exists():
            path.unlink()
        self._handle = open(path, "a")  # noqa: SIM115 (open for the run, closed in close())
        # Records kept and written about once a second (see Pace), and at every checkpoint commit (flush): a
        # record past the last commit is dropped on resume anyway (truncate_after).
        self._pending: list[tuple[int, dict[str, float]]] = []
        self._pace = Pace()

    def truncate_after(self, step: int) -> None:
        """Drop records of updates after the checkpoint we resume from: they will be done again."""
        if not self.path.exists():
            return
        kept = []
        for line in self.path.read_text().splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue  # a line cut by a kill
            if record.get("step", 0) <= step:
                kept.append(line)
        atomic_write_text(self.path, "".join(line + "\n" for line in kept))

    def log_scalars(self, step: int, scalars: dict[str, float]) -> None:
        self._pending.append((step, scalars))
        if self._pace.due():
            self.show()

    def _line(self, step: int, scalars: dict[str, float]) -> str:
        record: dict[str, Any] = {"step": step}
        record.update({k: _clean(float(v)) for k, v in scalars.items()})
        if self._hop is not None:
            record["hop"], self._hop = self._hop, None
        return json.dumps(record) + "\n"

    def log_histograms(self, step: int, values: dict[str, np.ndarray]) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        return {}

    def flush(self) -> None:
        self.show()

    def show(self) -> None:
        if self._pending:
            self._handle.write("".join(self._line(step, scalars) for step, scalars in self._pending))
            self._pending.clear()
        self._handle.flush()

    def close(self) -> None:
        self.show()
        self._handle.close()


def read_metrics(path: Path) -> list[dict[str, Any]]:
    records = []
    for line in Path(path).read_text().splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            continue
    return records
