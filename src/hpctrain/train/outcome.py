"""How a training process ends: its result, the time it spent per activity, and the lines that explain a
failure."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from hpctrain.errors import UserError
from hpctrain.runtime.budget import Stop
from hpctrain.train.counters import Counters
from hpctrain.train.nonfinite import NonFinite


@dataclass
class RunResult:
    status: str  # finished | stopped | already_finished | failed
    reason: Stop
    step: int
    params_sha256: str
    exit_code: int
    message: str = ""  # failed: the one line to print
    # the checkpoint copies that did not arrive: {checkpoint.mirror_to or pelican:// checkpoint.dir: why}
    copy_failures: dict[str, str] = field(default_factory=dict)


class Timers:
    """Seconds spent per activity, since the last log line and in total. `compile` is an update during which
    torch.compile compiled (its first updates): neither step time nor goodput."""

    KINDS = ("data", "step", "eval", "checkpoint", "compile")

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

    def rebook(self, device_busy: float) -> None:
        """Split the window's update time (data + step, measured on the host) as the GPU saw it: `device_busy`
        seconds the GPU spent inside steps are step time, the rest (the GPU idle, waiting for a batch or the
        host) is data time. On the host alone, the wait for the GPU's queue lands on whatever blocks next,
        usually the next batch's copy: a GPU-bound run looked data-bound."""
        host = self.window["data"] + self.window["step"]
        step = min(max(device_busy, 0.0), host)
        for kind, value in (("data", host - step), ("step", step)):
            self.total[kind] += value - self.window[kind]
            self.window[kind] = value


class DeviceTimeline:
    """CUDA events around each update's work on the GPU (recorded, never waited for), read at log steps: how long
    the GPU was busy with steps since the last log line. Costs two event records per update, no sync."""

    def __init__(self) -> None:
        self._event: Callable[[], Any] = lambda: torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        self._spans: list[tuple[Any, Any]] = []
        self._open: Any = None

    def start(self) -> None:
        self._open = self._event()
        self._open.record()

    def end(self, counted: bool = True) -> None:
        """Close the update's span; `counted=False` (a compile update) drops it."""
        if counted and self._open is not None:
            done = self._event()
            done.record()
            self._spans.append((self._open, done))
        self._open = None

    def busy_seconds(self) -> float | None:
        """GPU seconds inside the spans since the last call (waits for the last one), None if there were none."""
        if not self._spans:
            return None
        self._spans[-1][1].synchronize()
        busy = float(sum(a.elapsed_time(b) for a, b in self._spans)) / 1000.0
        self._spans.clear()
        return busy


class NoTimeline:
    """The stand-in off CUDA: the host's clock is the truth there."""

    def start(self) -> None:
        pass

    def end(self, counted: bool = True) -> None:
        pass

    def busy_seconds(self) -> float | None:
        return None


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
    if step == 0:  # nothing trained, nothing saved: the same command starts afresh once the data is fixed
        return UserError(cause)
    return UserError(
        f"{cause} (the {step} updates done so far are saved: once the data is fixed, the same command "
        "continues from there)"
    )


def continues_from(status: str, reason: Stop, counters: Counters, saved: int | None) -> int:
    """The update a next start continues from: a failure or a hang got only as far as its last save."""
    if status == "failed" or reason == Stop.HANG:
        return saved if saved is not None else (counters.resumed_step or 0)
    return counters.step


def summary_record(
    status: str, reason: Stop, last: int, state: Counters, digest: str, timers: Timers, hop: dict[str, Any]
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
