"""When each part of the loop is due: one cadence object per part, and the votes all ranks agree on at once.

The loop (trainer.py `_train`) asks, after each update:
    log.due(step, now)     a metrics line: every logging.log_every updates, the last update, and by time (a first
                           line FIRST_LINE_SECONDS after the hop's first update, then every log_every_seconds)
    hist.due(step)         TensorBoard histograms
    check.due(step)        a check step: the budget is asked and every rank votes (Votes, one collective)
and at a check step:
    eval_.due(step)         an evaluation (train.eval_every)
    save.due(step)          a periodic save (checkpoint.every); save.time_due(now) on rank 0: every_minutes

Logging is local (no collective): a rank logs by its own clock. Everything that all ranks must do together (stop,
save, raise on a non-finite update, the next check's stride) is a field of a dist.Votes dataclass, each with its
reduction, agreed in one collective: a flag set on any rank is set on all, the highest-ranked stop wins
(runtime/budget.py Stop), the earliest bad update is the one every rank names.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from hpctrain.config.schema import ConfigBase
from hpctrain.runtime.budget import Stop, TimeBudget, check_stride
from hpctrain.runtime.dist import ANY, EARLIEST, MAX, Reduction, Votes, vote

log = logging.getLogger(__name__)

FIRST_LINE_SECONDS = 10.0  # a hop's first metrics line comes this soon after its first update


def next_multiple(step: int, every: int) -> int:
    """The first multiple of `every` after `step`."""
    return (step // every + 1) * every


@dataclass
class Every:
    """Due at each multiple of `n` updates (0: never)."""

    n: int

    def due(self, step: int) -> bool:
        return bool(self.n) and step % self.n == 0

    def next_due(self, step: int) -> int | None:
        return next_multiple(step, self.n) if self.n else None


class LogCadence:
    """A metrics line every `every` updates, at the last update, and by time: FIRST_LINE_SECONDS after the first
    update of the hop, then `seconds` after the line before (0: by updates only). Times are perf_counter."""

    def __init__(self, every: int, seconds: float, total: int) -> None:
        self.every, self.seconds, self.total = every, seconds, total
        self._next_time = float("inf")  # until start(): by updates only

    def start(self, now: float) -> None:
        if self.seconds:
            self._next_time = now + min(FIRST_LINE_SECONDS, self.seconds)

    def due(self, step: int, now: float) -> bool:
        if step % self.every == 0 or step == self.total or now >= self._next_time:
            if self.seconds:
                self._next_time = now + self.seconds
            return True
        return False

    def next_due(self, step: int) -> int:
        """The next update that logs by count (the time-based ones cannot be foreseen on every rank alike)."""
        return next_multiple(step, self.every)


@dataclass
class EvalCadence:
    """train.eval_every, only with a validation set and never at the last update (the final evaluation is
    _finish's)."""

    every: Every
    has_val: bool
    total: int

    def due(self, step: int) -> bool:
        return self.has_val and self.every.due(step) and step < self.total

    def due_next(self, step: int) -> bool:
        """Whether the update after `step` evaluates (every N, or the final one): its time must fit too."""
        return self.due(step + 1) or (self.has_val and step + 1 == self.total)

    def next_checks(self, step: int) -> list[int]:
        """The updates a check must come at: each evaluation's, or the update before it when that is still
        ahead (whether the evaluation fits is decided there)."""
        if not self.has_val:
            return []
        evals = [self.total] + ([e] if (e := self.every.next_due(step)) else [])
        return [e - 1 if e - 1 > step else e for e in evals]


class SaveCadence:
    """checkpoint.every updates (never the last: _finish saves it, with the finished flag) and every_minutes of
    rank 0's clock (its decision is voted, so all ranks save together), stretched to keep saves under 2% of the
    time (TimeBudget.save_interval)."""

    def __init__(self, every: int, every_minutes: float, total: int, budget: TimeBudget) -> None:
        self.every, self.minutes, self.total, self.budget = Every(every), every_minutes, total, budget
        self._last = time.monotonic()
        self._stretch_noted = False

    def due(self, step: int) -> bool:
        return self.every.due(step) and step < self.total

    def saved(self) -> None:
        self._last = time.monotonic()

    def time_due(self) -> bool:
        if not self.minutes:
            return False
        interval = self.budget.save_interval(self.minutes)
        if interval > self.minutes * 60 and not self._stretch_noted:
            self._stretch_noted = True
            log.info(
                "time-based saves every %.1f min instead of checkpoint.every_minutes=%g: a save takes %.1f s "
                "(saves are kept under 2%% of the time)",
                interval / 60,
                self.minutes,
                self.budget.save.value,
            )
        return time.monotonic() - self._last >= interval


class CheckCadence:
    """The update after which the budget is next asked and the ranks next vote: a stride of about CHECK_SECONDS of
    training away (from the step time agreed last, so the same on every rank), or sooner at the next update that
    logs by count (the NaN guard's findings are agreed there), saves, evaluates or comes right before an
    evaluation, or ends the run; every update under skip_batch (the guard may stop after any one). All of it is a
    function of agreed figures and the update count: every rank votes at the same updates."""

    def __init__(self) -> None:
        self.next = 0
        self.step_seconds = 0.0  # the step time voted last (the slowest rank's)

    def due(self, step: int) -> bool:
        return step >= self.next

    def plan(self, step: int, every_update: bool, upcoming: list[int | None]) -> int:
        """Set the next check; returns how many updates ahead it is (what the budget must look ahead)."""
        stride = 1 if every_update else check_stride(self.step_seconds)
        self.next = min([step + stride, *(u for u in upcoming if u is not None)])
        return self.next - step


# A stop reason voted by all ranks: the highest Stop.rank wins (None: go on).
STOP = Reduction("max", Stop.rank, Stop.ranked)


@dataclass
class FetchVotes(Votes):
    """After fetching an update's batches: skip it only if every rank found it empty (one rank skipping alone would
    deadlock DDP); stop if any rank was stopped while waiting for its data."""

    empty: bool = vote(ANY, False)
    stop: Stop | None = vote(STOP, None)


@dataclass
class GuardVotes(Votes):
    """The first non-finite update any rank found (NonFiniteGuard.first_bad) and the first loss spike to rewind from
    (SpikeGuard.found): every rank raises for the same update."""

    nonfinite: int | None = vote(EARLIEST, None)
    spike: int | None = vote(EARLIEST, None)


@dataclass
class CheckVotes(GuardVotes):
    """At a check step, besides the guards' findings: stop (and why), a time-based save (rank 0's clock), the
    slowest rank's step time (the next stride)."""

    stop: Stop | None = vote(STOP, None)
    save_due: bool = vote(ANY, False)
    step_seconds: float = vote(MAX, 0.0)


GO = FetchVotes()  # the common case, no allocation per update
EMPTY = FetchVotes(empty=True)


@dataclass
class Cadences:
    """Every part's cadence, built once the run's length is known."""

    log: LogCadence
    hist: Every
    eval_: EvalCadence
    save: SaveCadence
    check: CheckCadence

    @classmethod
    def build(cls, cfg: ConfigBase, total: int, has_val: bool, budget: TimeBudget) -> Cadences:
        logging_cfg, train = cfg.logging, cfg.train
        return cls(
            log=LogCadence(logging_cfg.log_every, logging_cfg.log_every_seconds, total),
            hist=Every(logging_cfg.tensorboard.hist_every),
            eval_=EvalCadence(Every(train.eval_every), has_val, total),
            save=SaveCadence(cfg.checkpoint.every, cfg.checkpoint.every_minutes, total, budget),
            check=CheckCadence(),
        )

    def upcoming_checks(self, step: int) -> list[int | None]:
        """The updates the next check must not come after (CheckCadence.plan)."""
        return [
            self.log.total,
            self.log.next_due(step),
            self.save.every.next_due(step),
            *self.eval_.next_checks(step),
        ]
