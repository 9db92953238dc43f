"""What a report reads from a run folder: metrics.jsonl, chain.json, summary.json, config.yaml, evaluate.json.

evaluate.json (written by a workload's evaluation, all keys optional):

    {"metrics": {"<name>": <number>, ...},                    # headline figures, shown in a table
     "info": {"step", "events", "units", "checkpoint", ...},   # shown under that table
     "distributions": {"<name>": {"label", "unit", "bins": [n+1 edges], "generated": [n], "true": [n],
                                  "y_label", "log_x", "log_y",
                                  "w1", "ks"}},   # one overall plot each; w1/ks optional (else metrics' w1_<name>)
     ...}                       # workload-specific keys, read by its panels (muons: "binned"; fields: "predictions")
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hpctrain.track.chain import read_chain, read_json, read_summary
from hpctrain.track.metrics_file import RECORD_KEYS, read_metrics
from hpctrain.track.runs import read_config

__all__ = ["RunData", "model_type_of", "read_config"]


def model_type_of(run_dir: Path) -> str | None:
    model = read_config(run_dir).get("model")
    return model.get("type") if isinstance(model, dict) else None


@dataclass
class RunData:
    run_dir: Path
    metrics: list[dict[str, Any]]
    hops: list[dict[str, Any]]
    summary: dict[str, Any]
    evaluation: dict[str, Any]
    config: dict[str, Any]

    @classmethod
    def load(cls, run_dir: Path) -> RunData:
        run_dir = Path(run_dir)
        path = run_dir / "metrics.jsonl"
        if not path.is_file():
            raise ValueError(f"{run_dir}: no metrics.jsonl (is this a run folder? <run.out_dir>/<run.name>)")
        return cls(
            run_dir,
            read_metrics(path),
            read_chain(run_dir / "chain.json").hops,
            read_summary(run_dir),
            read_json(run_dir / "evaluate.json", {}),
            read_config(run_dir),
        )

    @property
    def model_type(self) -> str | None:
        model = self.config.get("model")
        return model.get("type") if isinstance(model, dict) else None  # the same as model_type_of

    def scalar_keys(self) -> list[str]:
        """Every key that some record logs as a number, in first-seen order (not the record's own `step`,
        `time` and `hop`)."""
        seen: dict[str, None] = {}
        for record in self.metrics:
            for key, value in record.items():
                if key not in RECORD_KEYS and isinstance(value, (int, float)) and not isinstance(value, bool):
                    seen.setdefault(key, None)
        return list(seen)

    def series(self, key: str) -> tuple[np.ndarray, np.ndarray]:
        """(steps, values) of the records that carry `key` with a finite value."""
        pairs = [(r["step"], r[key]) for r in self.metrics if isinstance(r.get(key), (int, float))]
        pairs = [(s, v) for s, v in pairs if math.isfinite(v)]
        if not pairs:
            return np.zeros(0), np.zeros(0)
        steps, values = zip(*pairs)
        return np.asarray(steps, dtype=float), np.asarray(values, dtype=float)

    def hop_of(self, step: int) -> int:
        """Index of the hop that did update `step` (hop i did first_update_i < step <= last_update_i)."""
        found = 0
        for i, hop in enumerate(self.hops):
            if hop.get("first_update", 0) < step:
                found = i
        return found

    def per_hop_mean(self, key: str) -> np.ndarray:
        """The mean of `key` over each hop's records (NaN for a hop without one)."""
        steps, values = self.series(key)
        hops = np.array([self.hop_of(int(s)) for s in steps], dtype=int)
        return np.array(
            [
                float(values[hops == h].mean()) if np.any(hops == h) else math.nan
                for h in range(max(len(self.hops), 1))
            ]
        )
