"""Restarts without SLURM: run a training command as a child process until its run is done.

What a SLURM chain does across jobs (launch/chain.py), for a GPU box under tmux or systemd:
- exit 75 (stopped early and resumable: the time budget, or a signal to the child alone): start it again at once;
- any other failure (exit 1, another code, death by a signal): start it again after a pause that doubles with
  each crash in a row, from `backoff` up to `backoff_max` seconds (a clean exit-75 stop resets it);
- exit 0 (finished), 2 (bad input) or 78 (out of device memory at these settings): running it again cannot help,
  stop;
- `max_idle` attempts in a row that completed no update (the chain's rule, `chain.hop_progress` over the hops an
  attempt added to chain.json; an attempt that added none made none either): stop;
- `hpctrain cancel RUN` (a cancel mark newer than the attempt's start: track/cancel.py): stop;
- SIGTERM or SIGINT to the supervisor: forwarded to the child, which saves and exits; supervision ends with it
  (SIGHUP too, passed on as SIGTERM: a closed terminal or tmux session leaves no training behind unsaved).

The child runs in a session of its own, so a Ctrl-C on the terminal reaches it once, through the supervisor
(twice would be the trainer's "stop now, do not save"). torchrun exits 1 whenever a worker exits non-zero, 75
included: the run folder's summary.json, written during the attempt, says what the run really did (as
slurm/common.sh's hpctrain_resolve_torchrun_rc does for the sbatch scripts). Imports no torch.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from hpctrain.errors import EXIT_BAD_INPUT, EXIT_OK, EXIT_OUT_OF_MEMORY, EXIT_RESUMABLE, UserError
from hpctrain.launch.chain import hop_progress, read_hops
from hpctrain.track.cancel import read_mark
from hpctrain.track.chain import read_json

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
# SIGHUP (the terminal or the tmux session closed) reaches the child as SIGTERM: the trainer saves and stops on
# TERM, while a HUP would kill it unsaved.
AS_SENT = {signal.SIGHUP: signal.SIGTERM}
POLL_SECONDS = 0.2  # how soon a signal to the supervisor reaches the child


@dataclass(frozen=True)
class Policy:
    max_idle: int = 2  # slurm.max_hops_without_progress: attempts in a row without an update, then stop
    backoff: float = 5.0  # seconds before the first restart after a crash
    backoff_max: float = 300.0  # the longest pause between restarts


@dataclass(frozen=True)
class Attempt:
    code: int  # the run's exit code: torchrun's 1 resolved through summary.json; 128 + N for a death by signal N
    raw: int  # what the child returned (negative: killed by that signal)
    progressed: bool  # it committed at least one update
    resolved: bool = False  # the code comes from summary.json, not from the child

    def describe(self) -> str:
        said = f"killed by {_signal_name(-self.raw)}" if self.raw < 0 else f"exit code {self.raw}"
        return f"{said} (summary.json: the run exited {self.code})" if self.resolved else said


@dataclass(frozen=True)
class Decision:
    action: str  # restart | wait | done | stop
    reason: str


def decide(attempt: Attempt, idle: int, crashes: int, policy: Policy) -> Decision:
    """What follows an attempt; `idle` counts the attempts in a row without progress (this one included),
    `crashes` the crashes in a row (this one included)."""
    if attempt.code == EXIT_OK:
        return Decision("done", "the run finished")
    if attempt.code == EXIT_BAD_INPUT:
        return Decision("stop", "bad input (exit 2, said above): running it again cannot help")
    if attempt.code == EXIT_OUT_OF_MEMORY:
        return Decision(
            "stop",
            f"out of device memory (exit {EXIT_OUT_OF_MEMORY}, said above): running it again at the same settings "
            "would be too; change them and start again",
        )
    if idle >= policy.max_idle:
        return Decision(
            "stop",
            f"the last {idle} attempts completed no update (max_hops_without_progress={policy.max_idle}); "
            "look at their output",
        )
    if attempt.code == EXIT_RESUMABLE:
        return Decision("restart", "stopped early and resumable: starting it again at once")
    return Decision("wait", f"crashed: starting it again in {backoff(crashes, policy):g} s")


def backoff(crashes: int, policy: Policy) -> float:
    """The pause after the `crashes`-th crash in a row: backoff, doubled each time, at most backoff_max."""
    return float(min(policy.backoff * 2 ** max(crashes - 1, 0), policy.backoff_max))


class Supervisor:
    """Runs `command` again and again for the run in `run_dir`, as the module docstring says."""

    def __init__(
        self,
        command: Sequence[str],
        run_dir: Path,
        policy: Policy,
        later: Sequence[str] = (),
        say: Callable[[str], None] | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.command = list(command)
        self.later = list(later)  # appended to the command from the second attempt on
        self.run_dir = Path(run_dir)
        self.policy = policy
        self.say = say or _stderr
        self.sleep = sleep
        self.received: list[int] = []  # signals to forward, in order (the handler only appends)
        self.forwarded = 0  # how many of them reached a child
        self.stopping: int | None = None  # the first signal received: supervision ends
        # when the current attempt began (a cancel mark newer than it ends supervision)
        self._attempt_start = 0.0

    def run(self) -> int:
        previous = {sig: signal.signal(sig, self._handler) for sig in FORWARDED}
        try:
            return self._loop()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        self.received.append(AS_SENT.get(signal.Signals(signum), signum))
        if self.stopping is None:
            self.stopping = signum

    def _loop(self) -> int:
        """The attempts; returns the run's exit code of the last one (what a shell would report for it)."""
        idle = crashes = 0
        number = 0
        while True:
            number += 1
            command = self.command if number == 1 else self.command + self.later
            attempt = self._attempt(number, command)
            if self.stopping is not None:
                self.say(
                    f"stopped by {_signal_name(self.stopping)}; the child ended with {attempt.describe()}: "
                    "supervision ends"
                )
                return attempt.code
            mark = read_mark(self.run_dir)
            if mark is not None and mark.time >= self._attempt_start:
                self.say(
                    f"the run was {mark.said()}; the child ended with {attempt.describe()}: supervision ends"
                )
                return attempt.code
            idle = 0 if attempt.progressed else idle + 1
            crashes = 0 if attempt.code in (EXIT_OK, EXIT_RESUMABLE) else crashes + 1
            decision = decide(attempt, idle, crashes, self.policy)
            self.say(f"attempt {number} ended with {attempt.describe()}: {decision.reason}")
            if decision.action in ("done", "stop"):
                return attempt.code
            if decision.action == "wait":
                self._pause(backoff(crashes, self.policy))
            if self.stopping is not None:  # during the pause, or since the child ended: start nothing more
                self.say(
                    f"stopped by {_signal_name(self.stopping)} before attempt {number + 1}: supervision ends"
                )
                return attempt.code

    def _attempt(self, number: int, command: list[str]) -> Attempt:
        before = read_hops(self.run_dir)
        started = self._attempt_start = time.time()
        try:
            child = subprocess.Popen(command, start_new_session=True)
        except OSError as exc:  # no such program, not executable: the same at every attempt
            raise UserError(f"cannot start {command[0]!r}: {exc.strerror or exc}") from None
        self.say(f"attempt {number} (pid {child.pid}, run folder {self.run_dir}): {' '.join(command)}")
        try:
            raw = self._wait(child)
        finally:
            if child.poll() is None:  # the supervisor itself failed: do not leave the training behind
                child.terminate()
                child.wait()
        after = read_hops(self.run_dir)
        new = after[len(before) :] if len(after) >= len(before) else after  # a folder moved aside: all new
        progressed = any(hop_progress(hop) > 0 for hop in new)
        code, resolved = self._resolve(raw, started)
        return Attempt(code, raw, progressed, resolved)

    def _wait(self, child: subprocess.Popen[bytes]) -> int:
        """The child's exit status; each signal the supervisor receives meanwhile is forwarded to it once, in
        order (a second Ctrl-C too: the trainer's "stop now")."""
        while True:
            while self.forwarded < len(self.received):
                if child.poll() is None:
                    child.send_signal(self.received[self.forwarded])
                self.forwarded += 1
            try:
                return child.wait(timeout=POLL_SECONDS)
            except subprocess.TimeoutExpired:
                continue

    def _resolve(self, raw: int, started: float) -> tuple[int, bool]:
        """The run's own exit code, and whether summary.json gave it. Another code than 0, 2, 75 or 78 with a
        summary.json written during the attempt is what the summary says (torchrun's 1 for a worker's 75 or 78,
        or torchrun's own death by the SIGTERM forwarded to it after its workers saved); otherwise a death by
        signal N is 128 + N, as a shell reports it."""
        if raw in (EXIT_OK, EXIT_RESUMABLE, EXIT_BAD_INPUT, EXIT_OUT_OF_MEMORY):
            return raw, False
        summary = self.run_dir / "summary.json"
        try:
            fresh = summary.stat().st_mtime >= started
        except OSError:
            fresh = False
        record = read_json(summary, {}) if fresh else {}
        status = record.get("status")
        if status == "stopped":
            return EXIT_RESUMABLE, True
        if status in ("finished", "already_finished"):
            return EXIT_OK, True
        if record.get("exit_code") == EXIT_OUT_OF_MEMORY:
            return EXIT_OUT_OF_MEMORY, True
        return (128 - raw if raw < 0 else raw), False

    def _pause(self, seconds: float) -> None:
        """Wait `seconds`, or less when a signal comes first."""
        left = seconds
        while self.stopping is None and left > 0:
            step = min(left, POLL_SECONDS)
            self.sleep(step)
            left -= step


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _stderr(line: str) -> None:
    print(f"hpctrain supervise: {line}", file=sys.stderr, flush=True)
