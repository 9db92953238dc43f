"""Uploading a run's offline W&B folders from a machine with internet: in order, once each, honestly.

Every hop of a run writes its own offline folder (<dir>/wandb/offline-run-<YYYYmmdd_HHMMSS>-<id>); all hold
the same run id. They are uploaded oldest first, one `wandb sync` each, stopping at the first failure (a later
hop must not land before an earlier one). What was uploaded is remembered in <run_dir>/wandb_sync.json.
`wandb sync` retries for minutes without a network and can exit 0 after failing, so its retries are capped and
its output is read. This module must not import torch (it runs on login nodes).
"""

from __future__ import annotations

import os
import re
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpctrain.config.secrets import is_masked
from hpctrain.track.chain import read_json, write_json

SYNC_FILE = "wandb_sync.json"
RECORD_FILE = "wandb.json"  # written by WandbTracker: each hop's run id and W&B folder
# Fail within seconds, not minutes, when the server cannot be reached (the caller may override any of these).
RETRY_CAPS = {
    "WANDB__GRAPHQL_RETRY_MAX": "2",
    "WANDB__GRAPHQL_RETRY_WAIT_MAX_SECONDS": "2",
    "WANDB__GRAPHQL_TIMEOUT_SECONDS": "30",
    "WANDB__FILE_STREAM_RETRY_MAX": "3",
    "WANDB__FILE_STREAM_RETRY_WAIT_MAX_SECONDS": "10",
    "WANDB__FILE_STREAM_TIMEOUT_SECONDS": "60",
    "WANDB__FILE_TRANSFER_RETRY_MAX": "3",
}
_FAILED = re.compile(r"\bERROR\b|^Error:|giving up|Traceback|not authenticated|No API key", re.I | re.M)
_RUN_DIR = re.compile(r"^offline-run-(\d{8}_\d{6})-(\w+)$")
_RUN_ID = re.compile(r"\w{1,64}")

# ---- reading offline run files (the LevelDB-style log wandb writes) ----------------------------------------

_BLOCK = 32768
_HEADER = 7  # file header: b":W&B", magic 0xBEE1, version; record header: crc32, length, type
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def iter_raw_records(path: Path) -> Iterator[bytes]:
    """Serialized Record protobufs of a .wandb file; a record cut by a kill ends the iteration."""
    data = Path(path).read_bytes()
    if len(data) < _HEADER or data[:4] != b":W&B":
        raise ValueError(f"{path} is not a W&B run file")
    pos, pending = _HEADER, b""
    while pos + _HEADER <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < _HEADER:
            pos += left  # the tail of a block too small for a header is padding
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + _HEADER])
        pos += _HEADER
        if kind == 0 and length == 0:
            continue
        chunk = data[pos : pos + length]
        if len(chunk) < length:
            return
        pos += length
        if kind == _FULL:
            yield chunk
        elif kind == _FIRST:
            pending = chunk
        elif kind == _MIDDLE:
            pending += chunk
        elif kind == _LAST:
            yield pending + chunk
            pending = b""


def iter_records(path: Path) -> Iterator[Any]:
    """wandb_internal_pb2.Record objects of a .wandb file."""
    from wandb.proto import wandb_internal_pb2

    for raw in iter_raw_records(path):
        record = wandb_internal_pb2.Record()  # type: ignore[attr-defined]
        record.ParseFromString(raw)
        yield record


def read_history(path: Path) -> list[dict[str, Any]]:
    """The logged rows of an offline run file, values JSON-decoded (nested keys joined with '/')."""
    import json

    rows = []
    for record in iter_records(path):
        if record.WhichOneof("record_type") == "history":
            rows.append(
                {
                    (item.key or "/".join(item.nested_key)): json.loads(item.value_json)
                    for item in record.history.item
                }
            )
    return rows


def has_exit_record(path: Path) -> bool:
    """True when the run called finish(): the file is complete."""
    try:
        return any(r.WhichOneof("record_type") == "exit" for r in iter_records(path))
    except (OSError, ValueError):
        return False


# ---- finding and syncing -----------------------------------------------------------------------------------


@dataclass
class OfflineRun:
    folder: Path
    started: str  # YYYYmmdd_HHMMSS from the folder name
    run_id: str

    @property
    def file(self) -> Path:
        return self.folder / f"run-{self.run_id}.wandb"


def find_offline_runs(run_dir: Path) -> list[OfflineRun]:
    """The run's offline folders, oldest first: those under the run folder, and those of the run ids wandb.json
    records in the folders it names (`<dir>/wandb/offline-run-*-<id>`: that one folder is listed, nothing
    outside the run folder is searched: a damaged or planted `dir` of `/` costs one listing)."""
    run_dir = Path(run_dir)
    inside = run_dir.resolve()
    found: dict[Path, OfflineRun] = {}

    def add(folder: Path) -> None:
        match = _RUN_DIR.match(folder.name)
        if match and folder.is_dir():
            found[folder.resolve()] = OfflineRun(folder.resolve(), match.group(1), match.group(2))

    for folder in inside.glob("**/wandb/offline-run-*"):
        add(folder)
    for root, run_id in recorded_hops(run_dir):
        try:
            entries = list((root / "wandb").iterdir())
        except OSError:
            continue
        for folder in entries:  # a shared W&B folder holds other runs too: only our ids count
            if folder.name.startswith("offline-run-") and folder.name.endswith(f"-{run_id}"):
                add(folder)
    return sorted(found.values(), key=lambda r: (r.started, str(r.folder)))


def recorded_hops(run_dir: Path) -> list[tuple[Path, str]]:
    """(W&B folder, run id) of each hop wandb.json records; an entry that is no such pair (a damaged or
    hand-edited file) is left out."""
    hops = read_json(Path(run_dir) / RECORD_FILE, {}).get("hops")
    found = []
    for hop in hops if isinstance(hops, list) else []:
        if not isinstance(hop, dict):
            continue
        folder, run_id = hop.get("dir"), hop.get("run_id")
        if isinstance(folder, str) and folder and isinstance(run_id, str) and _RUN_ID.fullmatch(run_id):
            found.append((Path(folder), run_id))
    return found


@dataclass
class SyncReport:
    synced: list[str] = field(default_factory=list)
    already: list[str] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    messages: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failed


def sync_environment(api_key: str | None, base: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    for key, value in RETRY_CAPS.items():
        env.setdefault(key, value)
    # wandb's own switches would hide the errors we judge by, or turn the upload into a no-op.
    for key in ("WANDB_SILENT", "WANDB_QUIET", "WANDB_MODE", "WANDB_DISABLED"):
        env.pop(key, None)
    if is_masked(env.get("WANDB_API_KEY")):  # '**********' copied from a saved config: no key at all
        env.pop("WANDB_API_KEY")
    if api_key and not env.get("WANDB_API_KEY"):
        env["WANDB_API_KEY"] = api_key
    return env


def _scrub(text: str, secret: str | None) -> str:
    return text.replace(secret, "***") if secret else text


def run_wandb_sync(folder: Path, env: dict[str, str], timeout: float) -> tuple[bool, str]:
    """One `wandb sync FOLDER`; success is judged from the output, not only from the exit code."""
    cmd = [sys.executable, "-m", "wandb", "sync", str(folder)]
    proc = subprocess.Popen(
        cmd,
        env=env,
        cwd=str(folder.parent),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # so a hung sync can be killed with its wandb-core child
    )
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        return False, (output or "") + f"\nwandb sync did not finish within {timeout:.0f} s"
    failed = proc.returncode != 0 or bool(_FAILED.search(output or ""))
    return not failed, output or ""


def sync_once(
    run_dir: Path,
    *,
    api_key: str | None = None,
    timeout: float = 600.0,
    idle_seconds: float = 1800.0,
    dry_run: bool = False,
    say: Callable[[str], None] = print,
) -> SyncReport:
    """Upload every complete, not yet uploaded offline folder of the run, oldest first."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ValueError(f"run folder {run_dir} does not exist")
    memory = read_json(run_dir / SYNC_FILE, {})
    if not isinstance(memory.get("synced"), dict):  # none yet, or damaged: what was uploaded is asked again
        memory["synced"] = {}
    report = SyncReport()
    runs = find_offline_runs(run_dir)
    if not runs:
        say(f"no offline W&B runs under {run_dir} (was logging.wandb.enabled set?)")
        return report
    env = sync_environment(api_key)
    for index, run in enumerate(runs):
        key = str(run.folder)
        if key in memory["synced"] or run.file.with_suffix(".wandb.synced").exists():
            report.already.append(key)
            continue
        newest = index == len(runs) - 1
        if newest and not _finished_or_idle(run, idle_seconds):
            say(f"waiting: {run.folder.name} is still being written (no exit record yet)")
            report.pending.append(key)
            continue
        if dry_run:
            say(f"would sync {run.folder}")
            continue
        say(f"syncing {run.folder} (run id {run.run_id})")
        start = time.monotonic()
        ok, output = run_wandb_sync(run.folder, env, timeout)
        output = _scrub(output, env.get("WANDB_API_KEY"))
        if not ok:
            report.failed.append(key)
            report.messages.append(output)
            say(f"FAILED after {time.monotonic() - start:.1f} s: {run.folder.name}\n{_tail(output)}")
            break  # later hops must not be uploaded before this one
        memory["synced"][key] = {"run_id": run.run_id, "at": time.time()}
        write_json(run_dir / SYNC_FILE, memory)
        report.synced.append(key)
        say(f"synced {run.folder.name} in {time.monotonic() - start:.1f} s")
    return report


def _finished_or_idle(run: OfflineRun, idle_seconds: float) -> bool:
    if has_exit_record(run.file):
        return True
    try:
        return time.time() - run.file.stat().st_mtime > idle_seconds  # a killed hop that nobody continued
    except OSError:
        return False


def _tail(text: str, lines: int = 12) -> str:
    return "\n".join("  " + line for line in text.strip().splitlines()[-lines:])


def run_finished(run_dir: Path) -> bool:
    return read_json(Path(run_dir) / "summary.json", {}).get("status") in ("finished", "already_finished")


def sync(
    run_dir: Path,
    *,
    watch: float | None = None,
    api_key: str | None = None,
    timeout: float = 600.0,
    idle_seconds: float = 1800.0,
    dry_run: bool = False,
    say: Callable[[str], None] = print,
) -> SyncReport:
    """sync_once, or with `watch` every that many seconds until the run has finished and all is uploaded."""
    while True:
        report = sync_once(
            run_dir, api_key=api_key, timeout=timeout, idle_seconds=idle_seconds, dry_run=dry_run, say=say
        )
        if watch is None or dry_run:
            return report
        if report.ok and not report.pending and run_finished(run_dir):
            return report
        time.sleep(watch)
