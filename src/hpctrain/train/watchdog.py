"""The hang watchdog (distributed.hang_seconds): a rank that stops making progress is said, with every rank's
stacks, and the hop ends with the requeue code instead of waiting out the collective timeout in silence.

A thread per rank looks every few seconds at what the rank has done: its updates, its evaluation batches and the
collectives it entered and left (runtime/dist.py `Collectives`). Nothing is added per update: the thread reads
counters the loop keeps anyway. It arms at the hop's first progress (start-up, a first compile and the first
batch's staging are not timed), and a main thread inside torch.compile counts as progress. When nothing moved
for `hang_seconds`, or another rank has reported a hang:

1. it writes `<run>/hang/rank<R>.txt` (every thread's Python stack, faulthandler's dump) and `rank<R>.json` (its
   update, the collectives it entered and left, the last one and for how long, where its main thread is);
2. it waits a little for the other ranks' reports (each rank's thread sees the first report and writes its own);
3. one rank (rank 0, else the lowest that reported) says in one line which rank is behind: the one that has not
   entered the collective the others wait in, or a rank that wrote no report (dead, frozen, its node gone);
4. rank 0 records the hop as stopped for "hang" (chain.json, summary.json) and every rank ends with the requeue
   code: the chain tries again from the last checkpoint, and its no-progress cap ends repeats.

A thread that cannot run (a native call holding the GIL) is covered by faulthandler's own timer, re-armed at
each look: it dumps the stacks to stderr and ends the process (exit 1) well after the watchdog would have.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hpctrain.config.schema import DistributedConfig
from hpctrain.errors import EXIT_RESUMABLE
from hpctrain.fsutil import atomic_write_text
from hpctrain.runtime.dist import Collectives
from hpctrain.runtime.env import ClusterEnv

_COMPILER = (f"{os.sep}torch{os.sep}_dynamo{os.sep}", f"{os.sep}torch{os.sep}_inductor{os.sep}")


def poll_seconds(hang_seconds: float) -> float:
    """How often the thread looks: a fifth of the limit, between 0.5 and 5 s."""
    return min(max(hang_seconds / 5, 0.5), 5.0)


def build_watchdog(
    cfg: DistributedConfig,
    env: ClusterEnv,
    run_dir: Path,
    progress: Callable[[], tuple[int, ...]],
    on_hang: Callable[[str], None],
    exit_code: int = EXIT_RESUMABLE,
) -> HangWatchdog | NoWatchdog:
    """The watchdog distributed.hang_seconds asks for, else the stand-in; `exit_code`: the process's code for a
    resumable stop."""
    if cfg.hang_seconds is None:
        return NoWatchdog()
    return HangWatchdog(cfg.hang_seconds, env, run_dir, progress, on_hang, exit_code=exit_code)


class NoWatchdog:
    """The stand-in when distributed.hang_seconds is not set: nothing runs."""

    def start(self) -> None:
        pass

    def close(self) -> None:
        pass


class HangWatchdog:
    def __init__(
        self,
        seconds: float,
        env: ClusterEnv,
        run_dir: Path,
        progress: Callable[[], tuple[int, ...]],
        on_hang: Callable[[str], None],
        end: Callable[[int], None] | None = None,
        exit_code: int = EXIT_RESUMABLE,
    ) -> None:
        """`progress`: what the loop has done (updates, backward passes in the update under way, evaluation
        batches), read from the thread. `on_hang`:
        records the hang (rank 0's chain.json and summary.json), given the line. `end`: ends the process with a
        code (default: flush and os._exit; the main thread is stuck), `exit_code` (the requeue code)."""
        self.seconds, self.env, self.folder = seconds, env, run_dir / "hang"
        self.progress, self.on_hang, self.end, self.exit_code = progress, on_hang, end or _end_now, exit_code
        self.poll = poll_seconds(seconds)
        self.grace = 2 * self.poll + 5.0  # for the other ranks' reports
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.started = 0.0  # wall time of start(): reports older than it belong to an earlier hop
        self.line = ""  # what was said (tests)

    def start(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        for suffix in (".json", ".txt"):  # this rank's report of an earlier hop
            (self.folder / f"rank{self.env.rank}{suffix}").unlink(missing_ok=True)
        self.started = time.time()
        self._thread = threading.Thread(target=self._watch, name="hpctrain-hang-watchdog", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)
        faulthandler.cancel_dump_traceback_later()

    # ---- the thread ------------------------------------------------------------------------------------------

    def _watch(self) -> None:
        seen = self._seen()
        armed, since = False, time.monotonic()
        while not self._stop.wait(self.poll):
            faulthandler.dump_traceback_later(self.seconds + self.grace + 60, exit=True)
            now, moved = time.monotonic(), self._seen()
            if moved != seen or _compiling():
                armed, seen, since = armed or moved != seen, moved, now
            if self._stop.is_set():
                return
            idle = now - since
            # another rank's report is looked for only while this one does not move (a moving rank is no part
            # of a hang yet): no listing of a shared folder while all is well
            if (armed and idle >= self.seconds) or (idle >= self.poll and self._peer_reported()):
                self._hang(idle)
                return

    def _seen(self) -> tuple[int, ...]:
        return (*self.progress(), Collectives.entered, Collectives.left)

    def _peer_reported(self) -> bool:
        if not self.env.distributed:
            return False
        return any(r["rank"] != self.env.rank for r in self._reports())

    def _hang(self, idle: float) -> None:
        try:
            self._report(idle)
        except OSError as exc:  # the run folder cannot take it: the line says where the others' are
            print(
                f"hang: rank {self.env.rank} could not write its report: {exc}", file=sys.stderr, flush=True
            )
        deadline = time.monotonic() + self.grace
        while time.monotonic() < deadline and len(self._reports()) < self.env.world_size:
            time.sleep(0.2)
        reports = self._reports()
        self.line = verdict(reports, self.env.world_size, self.seconds, self.folder)
        # rank 0, or the lowest
        say = self.env.rank == min((r["rank"] for r in reports), default=self.env.rank)
        # Saying and recording may block where the main thread is stuck (a full pipe, a hung file system): in a
        # thread of their own, given the grace, and the process ends either way.
        record = threading.Thread(target=self._record, args=(say,), name="hpctrain-hang-record", daemon=True)
        record.start()
        record.join(timeout=self.grace)
        self.end(self.exit_code)
        faulthandler.cancel_dump_traceback_later()  # (an `end` that returns: a test's)

    def _record(self, say: bool) -> None:
        if say:
            print(f"error: {self.line}", file=sys.stderr, flush=True)
        with contextlib.suppress(Exception):  # the record must not keep the process from ending
            self.on_hang(self.line)

    def _report(self, idle: float) -> None:
        rank = self.env.rank
        stacks = self.folder / f"rank{rank}.txt"
        main = threading.main_thread().ident or 0
        with open(stacks, "w") as out:  # faulthandler writes to a file descriptor, under no lock
            out.write(
                f"rank {rank} on {socket.gethostname()} (pid {os.getpid()}); main thread 0x{main:016x}\n\n"
            )
            out.flush()
            faulthandler.dump_traceback(out, all_threads=True)
        inside = Collectives.entered > Collectives.left
        record = {
            "rank": rank,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "time": time.time(),
            "idle_seconds": round(idle, 1),
            "progress": list(self.progress()),  # updates, backward passes in the update, evaluation batches
            "entered": Collectives.entered,
            "left": Collectives.left,
            "last": Collectives.last,
            "inside_seconds": round(time.monotonic() - Collectives.since, 1) if inside else None,
            "where": _where(main),
            "stacks": stacks.name,
        }
        atomic_write_text(self.folder / f"rank{rank}.json", json.dumps(record, indent=1))

    def _reports(self) -> list[dict[str, Any]]:
        """This hop's reports (each rank's own, written since its start; an earlier hop's are older)."""
        found = []
        for path in self.folder.glob("rank*.json"):
            try:
                record = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            fresh = isinstance(record, dict) and record.get("time", 0) >= self.started - 5
            if fresh and 0 <= record.get("rank", -1) < self.env.world_size:
                found.append(record)
        return found


def position(record: dict[str, Any]) -> tuple[int, ...]:
    """How far a rank got, comparable between ranks of one program: collectives entered, updates done, backward
    passes in the update under way."""
    return (record["entered"], *record["progress"][:2])


def verdict(reports: list[dict[str, Any]], world_size: int, seconds: float, folder: Path) -> str:
    """The one line: how long nothing moved, and which rank is behind (the one the others wait for)."""
    ranks = {r["rank"]: r for r in reports}
    missing = [rank for rank in range(world_size) if rank not in ranks]
    head = f"hang: no progress for {seconds:g} s (distributed.hang_seconds)"
    tail = f"every rank's stacks in {folder}; the hop ends for a restart from the last checkpoint"
    if missing:
        return f"{head}; rank {_names(missing)} wrote no report (dead, frozen or its node gone); {tail}"
    furthest = max(position(r) for r in reports)
    behind = sorted(rank for rank, r in ranks.items() if position(r) < furthest)
    ahead = sorted(rank for rank, r in ranks.items() if position(r) == furthest)
    first = ranks[ahead[0]]
    if first["entered"] > first["left"]:
        waits = f"collective #{first['entered']} ({first['last']})"
    elif first["progress"][1]:
        waits = f"the gradient all-reduce of update {first['progress'][0] + 1} (DDP, in backward)"
    else:
        waits = f"update {first['progress'][0] + 1}"
    if behind:
        verb = "waits" if len(ahead) == 1 else "wait"
        return (
            f"{head}; rank {_names(behind)} is behind: rank {_names(ahead)} {verb} for it in {waits}; rank "
            f"{behind[0]} is at {ranks[behind[0]]['where']}; {tail}"
        )
    if world_size > 1 and first["entered"] > first["left"]:
        return (
            f"{head}; every rank waits in {waits}: none is behind, the communication itself hangs (the "
            f"network, NCCL: see docs/troubleshooting.md); {tail}"
        )
    who = "no rank is behind; rank 0" if world_size > 1 else "the main thread"
    return f"{head}; {who} is at {first['where']}; {tail}"


def _names(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks))


def _where(thread: int) -> str:
    """The main thread's innermost frames, outermost first: `file:line in function <- ...` (3 at most)."""
    frame = sys._current_frames().get(thread)
    if frame is None:
        return "(no main thread)"
    frames = traceback.extract_stack(frame)[-3:]
    return " <- ".join(f"{Path(f.filename).name}:{f.lineno} in {f.name}" for f in reversed(frames))


def _compiling() -> bool:
    """Whether the main thread is inside torch.compile (a first or a new graph: minutes, yet progress)."""
    frame = sys._current_frames().get(threading.main_thread().ident or 0)
    while frame is not None:
        if any(part in frame.f_code.co_filename for part in _COMPILER):
            return True
        frame = frame.f_back
    return False


def _end_now(code: int) -> None:
    """End the process from the watchdog's thread: the main thread is stuck and cannot return."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)
