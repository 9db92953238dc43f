"""Drawing a report's figures into PNG files, on several cores where the machine has them.

Matplotlib draws one figure on one core, and a muon report is 42 figures: ~55 s on one core, ~3/4 of it text
layout and rasterising. The figures are independent once laid out, so they are drawn by forked copies of this
process (each inherits every figure as it is: nothing is pickled but the file's problems), one figure at a
time, handed out in order. Without fork (macOS, Windows), on one usable core, or for a few figures, they are
drawn here in turn: the files are the same either way.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpctrain.errors import UserError
from hpctrain.fsutil import atomic_path
from hpctrain.track.report.panels import save_png, text_problems

MAX_WORKERS = 8  # past this, the start of the processes outweighs what is left to draw
MIN_PER_WORKER = 3  # figures per process, at least


@dataclass
class Drawing:
    """One PNG to write: `figure` into `path`, with these PNG text chunks."""

    figure: Any
    path: Path
    metadata: dict[str, str]


_TO_DRAW: Sequence[Drawing] = ()  # what the forked processes draw, inherited at the fork


def workers(figures: int) -> int:
    """How many processes draw `figures` figures: the usable cores (HPCTRAIN_REPORT_WORKERS overrides; 1 draws
    in this process), at most MAX_WORKERS and one per MIN_PER_WORKER figures; 1 where fork is not offered."""
    given = os.environ.get("HPCTRAIN_REPORT_WORKERS", "").strip()
    if given:
        if not given.isdigit() or int(given) < 1:
            raise UserError(f"HPCTRAIN_REPORT_WORKERS: a whole number of processes >= 1, not {given!r}")
        wanted = int(given)
    else:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        wanted = min(cores, MAX_WORKERS)
    if "fork" not in multiprocessing.get_all_start_methods():
        return 1
    return max(1, min(wanted, figures // MIN_PER_WORKER))


def draw_all(drawings: Sequence[Drawing], done: Callable[[], None] = lambda: None) -> list[list[str]]:
    """Write every drawing's PNG (each atomically: a reader never sees half a file) and return, in order, what
    `text_problems` found in each as drawn; `done()` after each figure. A process that dies (killed, out of
    memory) costs nothing: what it left undrawn is drawn here."""
    global _TO_DRAW
    problems: list[list[str] | None] = [None] * len(drawings)
    count = workers(len(drawings))
    if count > 1:
        _TO_DRAW = drawings
        # a forked process must not write out again what it inherited of these buffers: emptied first
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            context = multiprocessing.get_context("fork")
            with ProcessPoolExecutor(count, context, _die_with, (os.getpid(),)) as pool:
                futures = {pool.submit(_draw_one, i): i for i in range(len(drawings))}
                for future in as_completed(futures):
                    problems[futures[future]] = future.result()
                    done()
        except BrokenProcessPool:
            pass  # the figures not yet drawn are drawn below
        finally:
            _TO_DRAW = ()
    for i, drawing in enumerate(drawings):
        if problems[i] is None:
            problems[i] = _draw(drawing)
            done()
    return [found or [] for found in problems]


def _die_with(parent: int) -> None:
    """In a drawing process: end when the command ends, even killed (a drawing process otherwise waits for work
    forever once its parent is gone). Linux: the kernel's parent-death signal; elsewhere nothing."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before the signal was asked for
        os._exit(1)


def _draw_one(i: int) -> list[str]:
    return _draw(_TO_DRAW[i])


def _draw(drawing: Drawing) -> list[str]:
    with atomic_path(drawing.path, fsync=False) as tmp:  # redrawn on demand
        save_png(drawing.figure, tmp, drawing.metadata)
    return text_problems(drawing.figure, drawn=True)  # its layout as saved (no second drawing)
