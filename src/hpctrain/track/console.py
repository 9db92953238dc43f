"""Progress on the console: one tqdm bar on a terminal, a plain line every log_every updates otherwise.

A plain line (what a SLURM log gets) carries what the bar shows beside it: the hop's elapsed time, the ETA at
the current rate and, under a time budget, the time to the deadline (`elapsed 01:02 | eta 03:10 | deadline in
29:00`): a log read an hour later says how far the run was from its end without a calculator.

The bar redraws at most `REDRAW_SECONDS` apart whatever the update rate (a bar redrawn at every update costs
time and floods a terminal multiplexer's scrollback), shows one rate (ours, averaged over the log window, not
tqdm's own next to it), and an ETA bounded by the time budget when there is one: the run stops (and saves)
before the wall time, so the time to the budget's end is the honest "remaining" of this hop.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

from tqdm import tqdm

from hpctrain.track.base import Pace
from hpctrain.track.stages import clock_text

REDRAW_SECONDS = 0.25


def _fmt(key: str, value: float) -> str:
    if key == "lr":
        return f"lr {value:.3e}"
    if key.endswith("_share"):
        return f"{key[:-6]} {100 * value:.0f}%"
    if abs(value) >= 1000:
        return f"{key} {value:.0f}"
    return f"{key} {value:.4g}"


# Keys shown on the progress line, in this order (the rest goes to metrics files and trackers only).
SHOWN = ("loss", "lr", "updates_per_s", "samples_per_s", "events_per_s", "muons_per_s", "data_share")
# On the bar: fewer (it shares one terminal line with the bar), the rate first after the loss.
ON_BAR = ("loss", "updates_per_s", "lr", "data_share")


def _line(step: int, total: int, scalars: dict[str, float], times: list[str] | None = None) -> str:
    shown = [_fmt(k.replace("_per_s", "/s"), scalars[k]) for k in SHOWN if k in scalars]
    return f"update {step}/{total} | " + " | ".join([*shown, *(times or [])])


def timing(elapsed: float, step: int, total: int, rate: float | None, time_left: float | None) -> list[str]:
    """`elapsed`, `eta` (at `rate` updates/s; none before a rate is known) and `deadline in` (None: no
    budget) as the plain lines show them."""
    parts = [f"elapsed {clock_text(elapsed)}"]
    if rate and rate > 0:
        parts.append(f"eta {clock_text(max(total - step, 0) / rate)}")
    if time_left is not None:
        parts.append(f"deadline in {clock_text(time_left)}")
    return parts


class Console:
    """`update` at log steps, `tick` at every update (cheap: a bar redraw only when due), `message` for lines
    that must not tear the bar, `close` before the run's last line."""

    def __init__(
        self,
        total: int,
        start: int,
        mode: str = "auto",
        stream: TextIO | None = None,
        time_left: Callable[[], float | None] | None = None,
        log_file: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stream = stream or sys.stdout
        self._clock = clock
        self.log_file = log_file  # plain lines also go here (training.log), bar or not
        # a log step's figures, shown about once a second (messages, flush and close at once): see Pace
        self._pending: list[tuple[int, dict[str, float], list[str]]] = []
        self._pace = Pace()
        self.total = total
        self.start = start
        self._time_left = time_left or (lambda: None)
        self._rate: float | None = None  # the ETA's: updates per second since the first log step
        self._first: tuple[float, int] | None = None  # (time, update) of the first log step
        self._postfix = ""
        self._drawn_at = self._began = clock()  # tqdm draws once when created
        self._drawn_step = self._step = start
        self._bar: Any = None
        if mode == "bar" or (mode == "auto" and self.stream.isatty()):
            self._bar = tqdm(
                total=total,
                initial=start,
                file=self.stream,
                dynamic_ncols=True,
                mininterval=REDRAW_SECONDS,
                bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]",
            )

    def update(self, step: int, scalars: dict[str, float]) -> None:
        """A log step's figures: on the bar at once, as lines about once a second (see Pace). The ETA's rate is
        the progress since the first log step: the first window holds the hop's start (a first update that
        loads, warms up or compiles) and once showed 01:12 with 13 s to go, so the first step shows none."""
        now = self._clock()
        if self._first is None:
            self._first = (now, step)
        elif step > self._first[1] and now > self._first[0]:
            self._rate = (step - self._first[1]) / (now - self._first[0])
        times = timing(now - self._began, step, self.total, self._rate, self._time_left())
        self._pending.append((step, scalars, times))
        if self._pace.due():
            self.flush()
        self.tick(step)

    def flush(self) -> None:
        """The lines of the figures kept since the last time, written and flushed out."""
        if not self._pending:
            return
        lines = "".join(
            f"{_line(step, self.total, scalars, times)}\n" for step, scalars, times in self._pending
        )
        last = self._pending[-1][1]
        self._pending = []
        if self.log_file is not None and not self.log_file.closed:
            self.log_file.write(lines)
            self.log_file.flush()
        if self._bar is None:
            self.stream.write(lines)
            self.stream.flush()
        else:
            self._postfix = " | ".join(_fmt(k.replace("_per_s", "/s"), last[k]) for k in ON_BAR if k in last)

    def tick(self, step: int) -> None:
        if self._bar is None:
            return
        self._step = step
        now = self._clock()
        final = step >= self.total and self._drawn_step != step
        if now - self._drawn_at < REDRAW_SECONDS and not final:
            return
        self._drawn_at, self._drawn_step = now, step
        self._sync(step)
        self._bar.refresh()

    def _sync(self, step: int) -> None:
        self._step = step
        self._bar.n = step
        self._bar.set_postfix_str(
            " | ".join(p for p in (*self._eta(step), self._postfix) if p), refresh=False
        )

    def _eta(self, step: int) -> list[str]:
        """The plain lines' `eta` and `deadline in` (the hop stops, saving, before the deadline: the earlier of
        the two is where this hop's progress ends); the bar shows its own elapsed time."""
        return timing(0.0, step, self.total, self._rate, self._time_left())[1:]

    def _to_log(self, line: str) -> None:
        if self.log_file is not None and not self.log_file.closed:
            self.log_file.write(line + "\n")
            self.log_file.flush()

    def message(self, text: str) -> None:
        self.flush()  # the progress lines before it first
        self._to_log(text)
        if self._bar is not None:
            self._bar.write(text, file=self.stream)
        else:
            print(text, file=self.stream, flush=True)

    def close(self) -> None:
        """End the bar's line; safe to call twice (the trainer closes it before its final line)."""
        self.flush()
        if self._bar is not None:
            self._sync(self._step)  # the last state, even if its redraw was not due yet
            self._bar.close()
            self._bar = None


class NullConsole(Console):
    """The stand-in on ranks other than 0 (and before tracking starts): prints nothing, needs no `if`."""

    def __init__(self) -> None:
        self.stream = sys.stdout
        self.total = 0
        self._bar = None
        self.log_file = None

    def update(self, step: int, scalars: dict[str, float]) -> None:
        pass

    def tick(self, step: int) -> None:
        pass

    def message(self, text: str) -> None:
        pass

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass
