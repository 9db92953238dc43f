"""How a training process ends: its result, the time it spent per activity, and the lines that explain a
failure."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from hpctrain.errors import UserError
from hpctrain.train.nonfinite import NonFinite
from hpctrain.train.task import StepOutput
from hpctrain.train.train_state import TrainState


@dataclass
class RunResult:
    status: str  # finished | stopped | already_finished | failed
    reason: str
    step: int
    params_sha256: str
    exit_code: int
    message: str = ""  # failed: the one line to print


class Timers:
    """Seconds spent per activity, since the last log line and in total."""

    KINDS = ("data", "step", "eval", "checkpoint")

    def __init__(self) -> None:
        self.window = dict.fromkeys(self.KINDS, 0.0)
        self.total = dict.fromkeys(self.KINDS, 0.0)
        self.window_start = time.perf_counter()

    def add(self, kind: str, seconds: float) -> None:
        self.window[kind] += seconds
        self.total[kind] += seconds

    def shares(self) -> tuple[dict[str, float], float]:
        elapsed = max(time.perf_counter() - self.window_start, 1e-9)
        shares = {f"{k}_share": v / elapsed for k, v in self.window.items()}
        return shares, elapsed

    @property
    def training_seconds(self) -> float:
        """Time inside training updates: fetching their batches and computing them (what goodput counts;
        start-up, evaluation, checkpointing and anything lost to a stop are not)."""
        return self.total["data"] + self.total["step"]

    def reset_window(self) -> None:
        self.window = dict.fromkeys(self.KINDS, 0.0)
        self.window_start = time.perf_counter()


def nonfinite_message(bad: NonFinite, step: int, saved: int | None, skipping: bool) -> str:
    """The one line after a non-finite loss or weight: what is kept, and what to try."""
    kept = f"checkpoints/latest stays at update {saved}" if saved is not None else "no checkpoint was saved"
    skip = "" if skipping else " (train.on_nonfinite=skip_batch skips such updates)"
    again = "to continue from that checkpoint" if saved is not None else "(it starts afresh)"
    return (
        f"{bad}; stopped at update {step} without saving: {kept}. Lower optim.lr, set "
        f"optim.grad_clip_norm or check the data{skip}, then run again {again}"
    )


def data_failure(error: UserError | None, step: int) -> UserError:
    """The error to end with after a bad file met mid-run, once the updates before it are saved (every rank
    saved; the stream's position was put back before the failed fetch, so nothing is skipped)."""
    cause = str(error) if error is not None else "another rank met bad data (see its log)"
    return UserError(
        f"{cause} (the {step} updates done so far are saved: once the data is fixed, the same command "
        "continues from there)"
    )


def update_scalars(
    out: StepOutput, mean_loss: float, grad_norms: dict[str, Any], lr: float
) -> dict[str, float]:
    """The figures of one log line that the update itself gives: its loss, the mean loss since the last line,
    the task's metrics, gradient norms (one per optimizer, named when there are several) and the LR."""
    scalars = {"loss": float(out.loss), "loss_mean": mean_loss}
    scalars.update({k: float(v) for k, v in out.metrics.items()})
    for name, norm in grad_norms.items():
        scalars[f"grad_norm_{name}" if len(grad_norms) > 1 else "grad_norm"] = float(norm)
    scalars["lr"] = lr
    return scalars


def rates(out: StepOutput, updates: int, elapsed: float, world_size: int) -> dict[str, float]:
    """Updates, samples (and the task's extra counts, e.g. muons) per second over all ranks since the last
    log line."""
    per_update = out.samples * world_size
    scalars = {"updates_per_s": updates / elapsed, "samples_per_s": per_update * updates / elapsed}
    for key, count in out.extra_counts.items():
        scalars[f"{key}_per_s"] = count * world_size * updates / elapsed
    return scalars


def summary_record(
    status: str, reason: str, last: int, state: TrainState, digest: str, timers: Timers, hop: dict[str, Any]
) -> dict[str, Any]:
    """summary.json's common keys (the caller adds the job's and the hop's): `last` is the update a next start
    continues from."""
    wall = hop.get("end", time.time()) - hop.get("start", time.time())
    return {
        "status": status,
        "reason": reason,
        "step": last,
        "total_updates": state.total_updates,
        "samples": state.samples,
        "params_sha256": digest,
        "wall_seconds": wall,
        "seconds": dict(timers.total),
        "goodput": hop.get("goodput"),
        "best": state.best,
    }
