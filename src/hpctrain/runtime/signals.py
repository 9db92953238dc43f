"""Stop signals: handlers that only set a flag, installed first thing in a training process and kept until it exits.

SLURM sends USR1 (or TERM) ahead of the walltime and on preemption; a process that has not installed its handlers
yet (still importing torch, loading the config) or has already restored the defaults (after "finished") dies of
it: exit 138 / 143, a failed hop that ends the chain. So `install_early()` runs before anything slow in `hpctrain
train` (cli.py, before the verb's module is even imported), and the run adopts that instance (`for_run`): a
signal received before training starts is the same requeue-able stop as a time-budget one (exit 75); one after
the run finished is noted and ignored (the flag is never read again). The early handlers are never restored: the
process keeps them to its exit handlers, and from the last of those on ignores the stop signals (the
interpreter's finalization would otherwise give them their default, deadly, action back). `hpctrain supervise`
and `train --until-done` get the same (a supervisor that dies of a late TERM fails its job too).

This module imports only the standard library: it runs before everything else.
"""

from __future__ import annotations

import atexit
import signal
from types import FrameType
from typing import Any

STOP_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGINT)


class StopSignals:
    """Installs flag-setting handlers for USR1, USR2, TERM and INT; restores the old ones on close (except for
    the process-wide early instance, which stays until the process exits)."""

    def __init__(self, keep: bool = False) -> None:
        self.received: str | None = None
        self._previous: dict[int, Any] = {}
        self._keep = keep

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        if self.received is None:
            self.received = signal.Signals(signum).name
        elif signum == signal.SIGINT:
            # A second Ctrl-C means "now": give the default behaviour back.
            raise KeyboardInterrupt

    def install(self) -> StopSignals:
        for sig in STOP_SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handler)
        return self

    def close(self) -> None:
        if self._keep:
            return
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()


_early: StopSignals | None = None


def install_early(unblock: bool = True) -> StopSignals:
    """Install the process-wide handlers now (main thread only), and (`unblock`) let signals through that a
    launcher blocked until then (a launcher can block them across exec to close the window before Python runs).
    From the exit handlers on, the stop signals are ignored (`_ignore_late`). A supervisor passes unblock=False:
    the processes it starts inherit its signal mask, and must get the one its own launcher chose."""
    global _early
    if _early is None:
        _early = StopSignals(keep=True).install()
        atexit.register(_ignore_late)  # registered first, so run last of the exit handlers
        if unblock:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    return _early


def _ignore_late() -> None:
    """The process is ending (its outcome decided, its exit code set): a stop signal from now on is ignored. The
    interpreter's finalization, which follows the exit handlers, gives every signal that has a Python handler
    its default action back, and a USR1 or TERM in that window killed a finished run (exit 138/143: a failed hop
    under srun); a signal set to SIG_IGN it leaves ignored, to the end."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


_early_taken = False


def for_run() -> StopSignals:
    """The handlers a run uses: the early ones where `install_early` ran (a signal they already caught counts),
    for the first run of the process only; else new ones, restored when the run closes (in-process callers:
    tests, a notebook, submitit, a second run in one process, which must not inherit the first's stop)."""
    global _early_taken
    if _early is not None and not _early_taken:
        _early_taken = True
        return _early
    return StopSignals().install()


def owns_process(signals: StopSignals) -> bool:
    """Whether `signals` are the early handlers: this process was started for the run that adopted them (its
    wall time is the run's; an in-process run's starts with the call)."""
    return signals is _early and _early is not None


def ignore_stop_signals() -> None:
    """For DataLoader workers: the main process decides when to stop."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
