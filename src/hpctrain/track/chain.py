"""The run's history across job hops: chain.json (one record per hop) and summary.json (written at exit)."""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

from hpctrain.config.identity import show
from hpctrain.errors import UserError
from hpctrain.fsutil import atomic_write_text
from hpctrain.track.stages import process_age
from hpctrain.track.what_ran import differences

log = logging.getLogger(__name__)


def write_json(path: Path, data: Any) -> None:
    """Atomically: a reader (status, report, sync) never sees half a file."""
    atomic_write_text(path, json.dumps(data, indent=2) + "\n")


def process_start_time() -> float:
    """When this job's allocation (or at least this process) started: goodput counts start-up time too.

    SLURM_JOB_START_TIME (SLURM 23.02+) is the start of the job's current run; otherwise the process start
    from /proc (Linux); otherwise now.
    """
    now = time.time()
    candidates = [now]
    slurm_start = os.environ.get("SLURM_JOB_START_TIME", "")
    if slurm_start.isdigit():
        candidates.append(float(slurm_start))
    age = process_age()
    if age is not None:
        candidates.append(now - age)
    # A start more than a week ago is a clock or parsing problem, not a real job (SLURM caps far lower).
    return min(c for c in candidates if now - c < 86400 * 7)


def read_json(path: Path, default: Any) -> Any:
    """The JSON value in `path`; `default` when the file is missing, unreadable or not JSON, and, with a dict or
    list `default`, when it holds another kind of value (`[1, 2]` where an object belongs): a damaged small file
    is what its reader does without, never an exception."""
    try:
        value = json.loads(Path(path).read_text())
    except (OSError, ValueError, RecursionError):
        return default
    if isinstance(default, (dict, list)) and not isinstance(value, type(default)):
        return default
    return value


# Bounds of the numbers the run's small files hold: past them (or NaN, or infinite) a number is damage, and its
# readers (status, report, the next start) go without it instead of failing on it.
MAX_COUNT = 2**62  # updates, samples, hops, pids
MAX_STAMP = 1e11  # epoch seconds (the year 5138); durations too


def is_count(value: Any) -> TypeGuard[int]:
    """A whole number a count can be: an int (no bool), 0 .. MAX_COUNT."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_COUNT


def is_stamp(value: Any) -> TypeGuard[float]:
    """A time (epoch seconds) or a duration in seconds: a finite number, 0 .. MAX_STAMP."""
    return _is_number(value) and math.isfinite(value) and 0 <= value <= MAX_STAMP


def is_finite(value: Any) -> bool:
    return _is_number(value) and math.isfinite(value)


def is_record(value: Any) -> bool:
    """Whether a line's JSON value is a metrics record: an object whose `step` is a whole number (0 .. 2**62).
    Anything else (`[1, 2]`, a number, a step of text) is a damaged line, as one cut by a kill."""
    if not isinstance(value, dict):
        return False
    step = value.get("step")
    return isinstance(step, int) and not isinstance(step, bool) and 0 <= step <= MAX_COUNT


def parse_record(line: str | bytes) -> dict[str, Any] | None:
    """One line of metrics.jsonl as a record; None when it is none (cut by a kill, or damaged)."""
    try:
        value = json.loads(line)
    except (ValueError, RecursionError):
        return None
    return value if is_record(value) else None


# summary.json's keys by kind; a value of another kind (or out of bounds) is left out by `read_summary`
_SUMMARY_COUNTS = ("step", "total_updates", "samples", "hops", "nonfinite_update", "stopped_at_update",
                   "nonfinite_skips")  # fmt: skip
_SUMMARY_TEXTS = ("status", "reason", "note", "job_id")


def read_summary(run_dir: Path) -> dict[str, Any]:
    """summary.json as its readers may use it: {} when missing or not a JSON object; a count that is no
    count (NaN, 1e300, text), a text that is no text, a non-finite number, is left out."""
    summary = read_json(Path(run_dir) / "summary.json", {})
    clean: dict[str, Any] = {}
    for key, value in summary.items():
        if key in _SUMMARY_COUNTS:
            ok = is_count(value)
        elif key in _SUMMARY_TEXTS:
            ok = isinstance(value, str)
        else:
            ok = not isinstance(value, float) or math.isfinite(value)
        if ok:
            clean[key] = value
    return clean


def hop_number(record: dict[str, Any], index: int) -> int:
    """The hop as people count it, from 1 (`train` says "hop 1 of this run"): chain.json keeps the 0-based
    index `hop` (older files and metrics records use it); `index` is the record's place when it has none."""
    hop = record.get("hop")
    return (hop if isinstance(hop, int) and not isinstance(hop, bool) else index) + 1


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _hop_problem(record: Any) -> str | None:
    """Why an entry of chain.json is no hop record the readers can use (None: it is one)."""
    if not isinstance(record, dict):
        return f"a JSON {_json_type(record)}, not an object"
    if not is_stamp(record.get("start")):
        return "no start time" if record.get("start") is None else "start is no time"
    for key in ("end", "last_seen", "deadline", "train_seconds", "startup_seconds"):
        if record.get(key) is not None and not is_stamp(record[key]):
            return f"{key} is not a time or duration (a finite number of seconds, 0 .. {MAX_STAMP:.0e})"
    if record.get("goodput") is not None and not is_finite(record["goodput"]):
        return "goodput is not a finite number"
    for key in ("hop", "first_update", "last_update", "world_size"):
        value = record.get(key)
        if value is not None and not is_count(value):
            return f"{key} is not a whole number (0 .. 2**62)"
    for key in ("accepted_changes", "allowed_changes"):
        value = record.get(key)
        pairs = isinstance(value, dict) and all(isinstance(p, list) and len(p) == 2 for p in value.values())
        if value is not None and not pairs:
            return f"{key} is not {{key: [old, new]}}"
    return None


def _json_type(value: Any) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}
    return names.get(type(value), "number")


@dataclass(frozen=True)
class ChainFile:
    """What chain.json holds: the hop records that can be used, and what is wrong with the file (None: it is
    sound, or there is none)."""

    hops: list[dict[str, Any]] = field(default_factory=list)
    problem: str | None = None


def read_chain(path: Path) -> ChainFile:
    """chain.json read for any use (train, status, report, the chain decisions): never an exception; entries
    that are no hop records are left out and named in `problem`."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        return ChainFile()
    except OSError as exc:
        return ChainFile(problem=f"cannot be read ({exc.strerror or exc})")
    except ValueError as exc:  # not JSON, or not text
        return ChainFile(problem=f"is not JSON ({str(exc)[:100]})")
    except RecursionError:
        return ChainFile(problem="nests too deeply to be read")
    if not isinstance(data, list):
        return ChainFile(problem=f"holds a JSON {_json_type(data)}, not a list of hop records")
    hops, bad = [], []
    for index, record in enumerate(data):
        why = _hop_problem(record)
        if why is None:
            hops.append(record)
        else:
            bad.append(f"entry {index}: {why}")
    if not bad:
        return ChainFile(hops)
    more = f"; {len(bad) - 1} more" if len(bad) > 1 else ""
    return ChainFile(hops, f"{len(bad)} of its {len(data)} entries are no hop records ({bad[0]}{more})")


class ChainLog:
    """chain.json: the hops of a run. Rank 0 opens a record at start and closes it at exit."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / "chain.json"
        read = read_chain(self.path)
        self.hops: list[dict[str, Any]] = read.hops
        self.problem = read.problem  # a damaged file, kept aside by `keep_aside_if_damaged`
        self.current: dict[str, Any] | None = None

    def keep_aside_if_damaged(self, saves: list[tuple[int, float]]) -> Path | None:
        """A damaged chain.json (not JSON, another shape, entries that are no hop records) is never overwritten:
        renamed to chain.json.bad-<time> and said in one warning line. What can be rebuilt is written back at
        once: the hop records that could be read, then, when the checkpoints reach further (`saves`: (update,
        time saved) from their sidecars), one record marked `rebuilt` up to the newest of them (the hops that
        trained those updates are unknown). Only the holder of run.lock calls this. Returns the kept file."""
        if self.problem is None:
            return None
        stamp = time.strftime("%Y%m%d-%H%M%S")
        aside = self.path.with_name(f"chain.json.bad-{stamp}")
        count = 1
        while aside.exists():
            count += 1
            aside = self.path.with_name(f"chain.json.bad-{stamp}-{count}")
        try:
            os.replace(self.path, aside)
        except OSError as exc:  # never overwrite it instead: the user moves it
            raise UserError(
                f"chain.json of {self.path.parent} is damaged ({self.problem}) and cannot be renamed to "
                f"{aside.name} ({exc.strerror or exc}); move it away and run again"
            ) from None
        known = max((int(h.get("last_update") or 0) for h in self.hops), default=0)
        later = [(step, saved) for step, saved in saves if step > known]
        rebuilt = ""
        if later:
            reached, saved = max(step for step, _ in later), max(saved for _, saved in later)
            note = f"rebuilt from the checkpoints after chain.json was found damaged (kept as {aside.name})"
            self.hops.append(
                {
                    "hop": len(self.hops),
                    "job_id": None,
                    "nodes": None,
                    "world_size": None,
                    "deadline": None,
                    "start": saved,  # the hops' own times are lost: the newest checkpoint's, no wall time
                    "end": saved,
                    "first_update": known,
                    "last_update": reached,
                    "exit_reason": "unknown",
                    "train_seconds": 0.0,
                    "goodput": None,
                    "rebuilt": note,
                }
            )
            rebuilt = f", and one record of updates {known}-{reached} from the checkpoints"
        try:
            write_json(self.path, self.hops)
        except OSError as exc:  # the damaged file is safe aside; nothing else was written
            raise UserError(
                f"chain.json of {self.path.parent} was damaged and is kept as {aside.name}, but the rebuilt one "
                f"cannot be written ({exc.strerror or exc}); free space or fix the folder and run again"
            ) from None
        log.warning(
            "chain.json of %s is damaged (%s): kept aside as %s; rebuilt with the %d hop records that could be "
            "read%s",
            self.path.parent,
            self.problem,
            aside.name,
            len(self.hops) - (1 if later else 0),
            rebuilt,
        )
        self.problem = None
        return aside

    def open_hop(
        self,
        job_id: str | None,
        node_list: str | None,
        first_update: int,
        world_size: int,
        deadline: float | None = None,
        identity: dict[str, Any] | None = None,
        ran: dict[str, Any] | None = None,
    ) -> None:
        """`identity`: config_hash, accepted_changes and allowed_changes ({key: [old, new]}) of this hop; `ran`:
        what it runs under (track/what_ran.py), said in one line where it differs from the hop before."""
        if (
            self.hops
            and self.hops[-1].get("end") is None
            and first_update > (self.hops[-1].get("last_update") or 0)
        ):
            # Killed after a commit it had no time to record: this hop resumes from that checkpoint.
            self.hops[-1]["last_update"] = first_update
        for hop in self.hops:
            # A hop that never closed was killed (SIGKILL, node failure): say so instead of leaving it open.
            if hop.get("end") is None:
                hop["end"] = hop.get("last_seen", hop["start"])
                hop["exit_reason"] = "failure"
                hop["goodput"] = hop.get("train_seconds", 0.0) / max(hop["end"] - hop["start"], 1e-9)
        before = next((h for h in reversed(self.hops) if isinstance(h.get("ran"), dict)), None)
        if ran and before is not None and (changed := differences(before["ran"], ran)):
            log.warning("this hop runs under other software than hop #%d: %s", hop_number(before, 0), changed)
        self.current = {
            "hop": len(self.hops),
            "job_id": job_id,
            "nodes": node_list or socket.gethostname(),
            "world_size": world_size,
            "deadline": deadline,
            "start": process_start_time(),
            "end": None,
            "first_update": first_update,
            "last_update": first_update,
            "exit_reason": None,
            "train_seconds": 0.0,
            **(identity or {}),
            **({"ran": ran} if ran else {}),
        }
        self.hops.append(self.current)
        write_json(self.path, self.hops)

    def progress(self, last_update: int, train_seconds: float) -> None:
        """Called at checkpoint commits: a hop killed later still shows how far it got."""
        if self.current is None:
            return
        self.current.update(last_update=last_update, train_seconds=train_seconds, last_seen=time.time())
        write_json(self.path, self.hops)

    def first_update_done(self) -> None:
        """Once per hop, when its first update is done: `startup_seconds` from the hop's start (the job's or the
        process's) to then, the price of a hop's start. Written at once (one small file, once per hop): `status`
        and bench/startup.py see it while the hop runs, and a hop killed later keeps it."""
        if self.current is None or "startup_seconds" in self.current:
            return
        self.current["startup_seconds"] = time.time() - self.current["start"]
        write_json(self.path, self.hops)

    def close_hop(self, last_update: int, train_seconds: float, reason: str) -> dict[str, Any]:
        assert self.current is not None
        end = time.time()
        wall = max(end - self.current["start"], 1e-9)
        self.current.update(
            end=end,
            last_update=last_update,
            exit_reason=reason,
            train_seconds=train_seconds,
            goodput=train_seconds / wall,
        )
        self.current.pop("last_seen", None)
        write_json(self.path, self.hops)
        return self.current

    def close_killed(
        self, last_update: int, seen: float | None, reason: str, note: str
    ) -> dict[str, Any] | None:
        """Close the last hop if it never closed although it committed the run's final checkpoint (at
        `last_update`, at time `seen`): it was killed after that save. None when there was nothing to close."""
        if not self.hops or self.hops[-1].get("end") is not None:
            return None
        hop = self.hops[-1]
        end = max(t for t in (hop.get("last_seen"), seen, hop["start"]) if t is not None)
        hop.pop("last_seen", None)
        hop.update(
            end=end,
            last_update=max(int(hop.get("last_update") or 0), last_update),
            exit_reason=reason,
            goodput=hop.get("train_seconds", 0.0) / max(end - hop["start"], 1e-9),
            note=note,
        )
        write_json(self.path, self.hops)
        return hop

    def totals(self) -> dict[str, float]:
        """Run goodput: time in training steps over the wall time of all hops (failed ones too)."""
        wall = sum((h["end"] or h.get("last_seen") or h["start"]) - h["start"] for h in self.hops)
        train = sum(h.get("train_seconds", 0.0) for h in self.hops)
        return {
            "hops": len(self.hops),
            "run_wall_seconds": wall,
            "run_train_seconds": train,
            "run_goodput": train / wall if wall > 0 else 0.0,
        }


class NoChain(ChainLog):
    """The stand-in on ranks other than 0: records no hop and writes nothing, so callers need no `if`."""

    def __init__(self) -> None:
        self.hops = []
        self.current = None

    def open_hop(self, *args: Any, **kwargs: Any) -> None:
        pass

    def progress(self, last_update: int, train_seconds: float) -> None:
        pass

    def close_hop(self, last_update: int, train_seconds: float, reason: str) -> dict[str, Any]:
        return {}

    def close_killed(
        self, last_update: int, seen: float | None, reason: str, note: str
    ) -> dict[str, Any] | None:
        return None

    def totals(self) -> dict[str, float]:
        return {}


def changes_text(hop: dict[str, Any], previous: dict[str, Any] | None = None) -> str:
    """What changed at the start of this hop, in one line ("" when nothing did): the identity keys accepted with
    checkpoint.accept_changes, then the keys that may change between hops (world size included)."""
    parts = []
    for kind in ("accepted", "allowed"):
        changes = hop.get(f"{kind}_changes") or {}
        if changes:
            shown = ", ".join(f"{key} {show(old)} -> {show(new)}" for key, (old, new) in changes.items())
            parts.append(f"{shown} ({kind})")
    before, now = (previous or {}).get("config_hash"), hop.get("config_hash")
    if not hop.get("accepted_changes") and before and now and before != now:
        parts.insert(0, f"config hash {before} -> {now}")  # changed without a record (an older version)
    ran = differences((previous or {}).get("ran"), hop.get("ran"))  # another torch, another commit
    if ran:
        parts.append(ran)
    return "; ".join(parts)


def write_summary(run_dir: Path, summary: dict[str, Any]) -> None:
    write_json(run_dir / "summary.json", summary)
