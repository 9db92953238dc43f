"""The trainer's counters: where the run is, in one object the checkpoint saves and a resume puts back."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Counters:
    """What the trainer counts. The first six fields are saved (`state_dict`, the checkpoint's "counters");
    the rest say what the last resume found, for this process only."""

    step: int = 0  # optimizer updates done
    samples: int = 0  # samples trained on, over all ranks
    total_updates: int = 0  # the run's length, as this hop computed it
    finished: bool = False  # the final save is done (the last update, or an early stop)
    best: float | None = None  # the best value of checkpoint.best_metric so far
    evals_without_improvement: int = 0  # for train.early_stopping.patience
    # Set by a resume, not saved:
    resumed_step: int | None = None  # the update the run resumed from (None: a fresh start)
    finished_total: int = 0  # total_updates of a run found finished (0: not finished)
    tracker_state: dict[str, Any] = field(default_factory=dict)  # the trackers' saved state (e.g. W&B run id)

    def state_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "samples": self.samples,
            "total_updates": self.total_updates,
            "finished": self.finished,
            "best": self.best,
            "evals_without_improvement": self.evals_without_improvement,
        }

    def load_state_dict(self, counters: dict[str, Any]) -> None:
        """Put the saved counters back; `total_updates` stays this hop's (it may grow between hops)."""
        self.step = int(counters["step"])
        self.resumed_step = self.step
        self.samples = int(counters["samples"])
        self.finished = bool(counters.get("finished"))
        self.finished_total = int(counters.get("total_updates", 0)) if self.finished else 0
        self.best = counters.get("best")
        self.evals_without_improvement = int(counters.get("evals_without_improvement", 0))
