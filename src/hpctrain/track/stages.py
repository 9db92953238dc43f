"""A long verb's stages as lines, so that a minute of work is never a minute of silence: one line as each stage
begins (`evaluate: generating 4 x 10000 bundles ... [12 s]`), and for a stage that knows its size a line at
most every `every` seconds with how far it is and an ETA (`evaluate: generating ...: 9000/40000 bundles, eta
00:41`). In brackets: seconds since the process began. The verbs write them to stdout, with their results
(as training's progress lines), so that stderr stays the one line of an error.

`NO_STAGES` is the stand-in for callers that want no lines (the end-of-training evaluation, tests)."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TextIO, TypeVar

T = TypeVar("T")


def clock_text(seconds: float) -> str:
    """`mm:ss`, or `h:mm:ss` from an hour."""
    seconds = max(0, int(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60:02d}:{rest % 60:02d}"


def process_age() -> float | None:
    """Seconds since this process started (Linux /proc, to 10 ms; None elsewhere). Field 22 of /proc/self/stat
    is the start in clock ticks after boot, /proc/uptime the seconds since boot to 10 ms: the boot time in
    /proc/stat is whole seconds, up to a second off for a start-up that takes two."""
    try:
        ticks = float(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return max(uptime - ticks / os.sysconf("SC_CLK_TCK"), 0.0)
    except (OSError, ValueError, IndexError):
        return None


class Stages:
    """`stage(what, total, unit)` as each stage begins; `advance(n)` as its work is done; `done(what)` at the
    end."""

    def __init__(
        self,
        verb: str,
        stream: TextIO | None = None,
        every: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        began: float | None = None,
    ) -> None:
        """`began`: when the verb began (clock's time); None: the process's start where known."""
        self.verb = verb
        self.stream = stream
        self.every = every
        self._clock = clock
        age = process_age() if began is None else None
        self._began = began if began is not None else clock() - (age or 0.0)
        self._what, self._unit = "", ""
        self._total, self._done = 0.0, 0.0
        self._stage_began = self._said_at = self._began

    def _say(self, text: str) -> None:
        print(f"{self.verb}: {text}", file=self.stream or sys.stderr, flush=True)

    def stage(self, what: str, total: float = 0, unit: str = "") -> None:
        now = self._clock()
        self._what, self._total, self._unit, self._done = what, float(total), unit, 0.0
        self._stage_began = self._said_at = now
        self._say(f"{what} [{now - self._began:.0f} s]")

    def advance(self, amount: float = 1) -> None:
        """`amount` more of the stage's total done: a line with the ETA when `every` seconds passed."""
        self._done += amount
        now = self._clock()
        if not self._total or now - self._said_at < self.every or self._done >= self._total:
            return
        self._said_at = now
        rate = self._done / max(now - self._stage_began, 1e-9)
        eta = clock_text((self._total - self._done) / rate) if rate > 0 else "?"
        self._say(f"{self._what}: {self._done:.0f}/{self._total:.0f} {self._unit}, eta {eta}")

    def done(self, what: str = "done") -> None:
        self._say(f"{what} [{self._clock() - self._began:.0f} s]")

    def counted(self, items: Iterable[T], size: Callable[[T], float]) -> Iterator[T]:
        """`items` as they come, each advancing the stage by its `size`."""
        for item in items:
            self.advance(size(item))
            yield item


class NoStages(Stages):
    """Says nothing (the stand-in: no `if` at the callers)."""

    def __init__(self) -> None:
        super().__init__("", began=0.0)

    def stage(self, what: str, total: float = 0, unit: str = "") -> None:
        pass

    def advance(self, amount: float = 1) -> None:
        pass

    def done(self, what: str = "done") -> None:
        pass


NO_STAGES = NoStages()
