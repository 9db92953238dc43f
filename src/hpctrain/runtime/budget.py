"""Time budget and stop signals.

Signal handlers only set a flag. The trainer asks `TimeBudget.local_stop_reason()` at each step boundary, all
ranks agree through one collective, and the stop (with a save first) happens there. Never save in a handler.

Work that can outlast the budget by itself (an evaluation pass, a wait for staged data) asks
`TimeBudget.urgent_stop_reason()` in between: blocking waits call `check_stop()`, which raises `StopRequested`
once the trainer has installed the check with `watch_waits`. The trainer then abandons that work, the ranks agree,
and it saves as usual.
"""

from __future__ import annotations

import collections
import enum
import logging
import time
from collections.abc import Callable
from typing import Any

import psutil

from hpctrain.config.schema import BudgetConfig, parse_duration
from hpctrain.runtime.env import ClusterEnv
from hpctrain.runtime.signals import StopSignals
from hpctrain.runtime.slurm import job_end_time

# StopSignals is re-exported: it lives in runtime/signals.py, which `hpctrain train` imports first thing.
__all__ = ["Stop", "StopSignals", "TimeBudget"]

log = logging.getLogger(__name__)


class Stop(str, enum.Enum):
    """Why a hop ended. The value is what chain.json (a hop's exit_reason) and summary.json (reason) keep: a Stop
    is a str, written, compared and formatted as that value ("time_budget"), so the files read as before."""

    TIME_BUDGET = "time_budget"  # the deadline came near: saved, resumable
    SIGNAL = "signal"  # SIGTERM/SIGUSR1 (scancel, preemption, `hpctrain cancel`): saved, resumable
    EARLY_STOP = "early_stop"  # patience ran out: finished short of the total
    DATA_ERROR = "data_error"  # a bad file met mid-run: saved, exit 2
    FINISHED = "finished"  # every update done
    HANG = "hang"  # the hang watchdog ended the hop (train/watchdog.py): resumable from the last save
    OUT_OF_MEMORY = "out_of_memory"
    NONFINITE = "nonfinite"  # a NaN/Inf loss or weight (train/nonfinite.py)

    __hash__ = str.__hash__  # a member finds and is found as its value in sets and dicts of plain strings

    def __str__(self) -> str:
        return str(self.value)

    @staticmethod
    def rank(stop: Stop | None) -> int:
        """Its weight in the ranks' vote, where the highest wins (0: go on). Only the VOTED reasons have one."""
        return 0 if stop is None else VOTED.index(stop) + 1

    @staticmethod
    def ranked(rank: float) -> Stop | None:
        """The reason of an agreed `rank` (0: none)."""
        return VOTED[int(rank) - 1] if rank else None


# The reasons all ranks vote on (a max-reduction of Stop.rank), lowest first. early_stop outranks the resumable
# stops: a run that has decided to end must not become a stop that trains on. data_error (a bad file met mid-run)
# ranks above all: the run saves what it trained and ends with exit 2.
VOTED = (Stop.TIME_BUDGET, Stop.SIGNAL, Stop.EARLY_STOP, Stop.DATA_ERROR)

# Time-based saves are spaced so that saving takes at most this share of the wall time (see save_interval).
SAVE_SHARE = 0.02
# The trainer asks the budget (and the ranks agree) every `check_stride` updates, not after each one: about this
# many seconds of training apart, at most MAX_STRIDE updates. A signal is acted on within that time, and the
# deadline check looks that far ahead (`ahead`), so the stop still comes before the walltime.
CHECK_SECONDS = 0.25
MAX_STRIDE = 100


def check_stride(step_seconds: float) -> int:
    """Updates between two budget checks for steps of `step_seconds` (an agreed figure under DDP, so that every
    rank takes the same stride): about CHECK_SECONDS of training; 1 before any step is measured."""
    if step_seconds <= 0:
        return 1
    return max(1, min(MAX_STRIDE, int(CHECK_SECONDS / step_seconds)))


class StopRequested(Exception):
    """Raised out of a blocking wait (data staging, a prefetch queue) when the run must stop now."""

    def __init__(self, reason: Stop) -> None:
        super().__init__(f"stop requested during a wait ({reason})")
        self.reason = reason


_wait_check: Callable[[], Stop | None] | None = None


def watch_waits(check: Callable[[], Stop | None] | None) -> None:
    """Install (None: remove) what `check_stop` asks. Process-wide like the signals it reports on: the waits
    sit deep in data code (and in its threads) that has no trainer to ask."""
    global _wait_check
    _wait_check = check


def check_stop() -> None:
    """Called by blocking waits between polls: raise StopRequested if the installed check says stop."""
    check = _wait_check
    reason = check() if check is not None else None
    if reason:
        raise StopRequested(reason)


def process_start(env: ClusterEnv) -> tuple[float, str]:
    """When this process's wall time began, and who says so: the job's start where the launcher gives it
    (SLURM_JOB_START_TIME), the torchrun agent's start for its workers (it started them), else this process's
    creation. The interpreter's start-up, torch's import and the set-up before the first update count, as they
    count on the wall clock a limit stands for (a 12 s limit counted from the trainer's start ended 25.7 s
    after the launch)."""
    if env.job_start:
        return float(env.job_start), "the job's start"
    try:
        me = psutil.Process()
        agent = me.parent() if env.torchrun else None
        if agent is not None:
            return agent.create_time(), "torchrun's start"
        return me.create_time(), "the process start"
    except psutil.Error:  # no /proc to read: the trainer's start, as before
        return time.time(), "the trainer's start"


class DurationEstimate:
    """A cautious estimate of a recurring duration: the largest of the recent observations."""

    def __init__(self, initial: float, window: int = 20) -> None:
        self.recent: collections.deque[float] = collections.deque(maxlen=window)
        self.initial = initial

    def observe(self, seconds: float) -> None:
        self.recent.append(seconds)

    @property
    def value(self) -> float:
        return max(self.recent) if self.recent else self.initial

    def state_dict(self) -> dict[str, Any]:
        return {"recent": list(self.recent), "initial": self.initial}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.recent.extend(state.get("recent", []))


class TimeBudget:
    """Knows the deadline and how long steps, evaluations and saves take; says when to stop."""

    def __init__(
        self,
        cfg: BudgetConfig,
        env: ClusterEnv,
        signals: StopSignals | None = None,
        clock: Callable[[], float] = time.time,
        started: tuple[float, str] | None = None,
    ) -> None:
        self.cfg = cfg
        self.env = env
        self.signals = signals or StopSignals()
        self.clock = clock
        # budget.time_limit counts from `started` (process_start() for a process started for this run; an
        # in-process run, a notebook's or a test's, counts from now)
        self.started, self._counted_from = started or (clock(), "the trainer's start")
        self.step = DurationEstimate(initial=0.0)
        self.eval = DurationEstimate(initial=0.0)
        self.save = DurationEstimate(initial=5.0)
        # The update whose evaluation a stop cut short: the next hop runs it before training on (carried in
        # the checkpoint with the timings).
        self.eval_owed: int | None = None
        self._deadline_checked = 0.0
        self.deadline: float | None = None
        self.deadline_source = "none"
        self.refresh_deadline(force=True)

    def refresh_deadline(self, force: bool = False) -> None:
        now = self.clock()
        if not force and now - self._deadline_checked < self.cfg.refresh_seconds:
            return
        self._deadline_checked = now
        # Only rank 0 asks slurmctld (N ranks x every refresh would be a burst); ranks agree on its decision.
        if self.env.under_slurm and self.env.job_id and self.env.is_main:
            end = job_end_time(self.env.scheduler_job or self.env.job_id)
            if end is not None:
                self.deadline, self.deadline_source = end, f"SLURM job {self.env.scheduler_job} end time"
                return
        elif self.env.under_slurm and self.env.job_id:
            return
        if self.cfg.time_limit:
            self.deadline = self.started + parse_duration(self.cfg.time_limit)
            self.deadline_source = f"budget.time_limit={self.cfg.time_limit} from {self._counted_from}"

    def remaining(self) -> float | None:
        return None if self.deadline is None else self.deadline - self.clock()

    def local_stop_reason(self, eval_next: bool, ahead: int = 1) -> Stop | None:
        """This rank's view: a signal arrived, or the next `ahead` steps (the updates until the budget is asked
        again), the evaluation after the next one if `eval_next`, and a save would not fit."""
        if self.signals.received:
            return Stop.SIGNAL
        self.refresh_deadline()
        remaining = self.remaining()
        if remaining is None:
            return None
        # Before any evaluation was timed, guess one as 20 steps.
        eval_time = self.eval.value if self.eval.recent else 20 * self.step.value
        need = ahead * self.step.value + (eval_time if eval_next else 0.0) + self.save.value
        return Stop.TIME_BUDGET if remaining < need + self.cfg.margin_seconds else None

    def urgent_stop_reason(self) -> Stop | None:
        """Stop even in the middle of an evaluation or a data wait: a signal arrived, or only a save (and the
        margin) still fits before the deadline. Asked often, from any thread: uses the known deadline."""
        if self.signals.received:
            return Stop.SIGNAL
        remaining = self.remaining()
        if remaining is not None and remaining < self.save.value + self.cfg.margin_seconds:
            return Stop.TIME_BUDGET
        return None

    def save_interval(self, every_minutes: float) -> float:
        """Seconds between time-based saves: `every_minutes`, stretched once saves are measured so that they
        take at most SAVE_SHARE of the time (a 60 s save: at least 50 min apart)."""
        measured = max(self.save.recent) if self.save.recent else 0.0
        return max(every_minutes * 60.0, measured / SAVE_SHARE)

    def state_dict(self) -> dict[str, Any]:
        return {
            "step": self.step.state_dict(),
            "eval": self.eval.state_dict(),
            "save": self.save.state_dict(),
            "eval_owed": self.eval_owed,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Earlier hops' timings make the first decisions of this hop informed."""
        for name in ("step", "eval", "save"):
            if name in state:
                getattr(self, name).load_state_dict(state[name])
        self.eval_owed = state.get("eval_owed")
