"""torch.compile in a helper process while the hop trains eagerly (train.compile_background).

Compiling the muon networks takes a minute on an H100 (docs/performance.md): in the training process those are a
minute of no updates, all of a short hop. Instead, at the hop's first update the trainer hands a helper process
(`python -m hpctrain.commands.compile_ahead`) the config, the networks' weights, the task's states to rehearse
and that update's batch, through a pipe (the config may hold secrets: nothing of it is written to disk). The
helper builds the same networks, compiles them with the same call (`Compiler.compiled`) and runs one update per
state, which fills the compile cache (<run.out_dir>/.compile-cache). Meanwhile the hop trains eagerly. At the
first check step after the helper has finished, the trainer wraps its networks in torch.compile; their first
call finds the helper's code in the cache (seconds), booked as compile time as before.

If the helper fails (out of memory next to the training, a compiler error), the trainer says so in one line and
compiles in its own process, as without the helper. The helper leaves its output in <run>/compile-ahead.log; it
ends with the hop (killed by PID) or on its own when the trainer is gone."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch

from hpctrain.errors import UserError
from hpctrain.fsutil import make_folders

HELPER = "hpctrain.commands.compile_ahead"
PARENT_VARIABLE = "HPCTRAIN_COMPILE_AHEAD_PARENT"  # the trainer's PID, for the helper's watchdog
# the least time a helper is started with, and a switch to its code is made with (loading takes seconds)
AHEAD_MIN_SECONDS = 10.0


class CompileAhead:
    """The helper process of one hop: `start` once (the hop's first update), `poll` at check steps, `close`."""

    def __init__(self, plan: dict[str, str], log_path: Path) -> None:
        self.plan = dict(plan)  # network -> compile mode
        self.log_path = log_path.absolute()  # said in lines and summary.json: wherever the command ran
        if self.log_path.is_symlink():  # refused before the hop trains, as the run's other files
            raise UserError(
                f"{self.log_path} is a symbolic link (to {os.readlink(self.log_path)}); hpctrain never writes "
                "through one: remove the link (and check who made it)"
            )
        self.proc: subprocess.Popen[bytes] | None = None
        self.started = 0.0
        self.seconds = 0.0  # the helper's wall time, once finished
        self.eager_updates = 0  # updates the hop ran before the switch
        self.outcome = "not started"  # "running", "done", "failed: <its last line>", "unfinished"
        self.switched = False  # the networks went under torch.compile in this hop
        self._begun = False
        self._unsaid = False  # a failure to start, not yet reported by `poll`

    @property
    def waiting(self) -> bool:
        """Not started yet: the hop's first update starts it."""
        return not self._begun

    @property
    def running(self) -> bool:
        return self.outcome == "running"

    def skip(self, why: str) -> None:
        """Never start the helper in this hop (`why`: too little time left for it to be of use)."""
        self._begun, self.outcome = True, f"not started ({why})"

    def start(self, payload: dict[str, Any]) -> None:
        """Start the helper and feed it `payload` (see commands/compile_ahead.py) from a thread: the helper
        reads it after importing torch, and the hop must not wait for that. The payload's tensors are copied to
        the host here (no second copy of the weights and the batch on the training device); serialising them
        is the thread's work."""
        self._begun = True
        payload = own_tensors(payload)
        try:
            make_folders(self.log_path.parent)
            fd = os.open(
                self.log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644
            )
            with os.fdopen(fd, "wb") as out:
                self.proc = subprocess.Popen(
                    [sys.executable, "-m", HELPER],
                    env=helper_environ(),
                    stdin=subprocess.PIPE,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # a Ctrl-C or a scheduler's signal to the group: the trainer's
                )
        except OSError as exc:  # no helper: the trainer compiles itself at the next check step
            self.outcome, self._unsaid = f"failed: could not start it ({exc})", True
            return
        self.started, self.outcome = time.monotonic(), "running"
        threading.Thread(target=_feed, args=(self.proc, payload), daemon=True).start()

    def poll(self) -> bool:
        """Whether the helper has finished (done or failed: `outcome` says which) since the last call."""
        if self._unsaid:
            self._unsaid = False
            return True
        if self.proc is None or not self.running or self.proc.poll() is None:
            return False
        self.seconds = time.monotonic() - self.started
        self.outcome = "done" if self.proc.returncode == 0 else f"failed: {self._last_line()}"
        return True

    def hop_ended(self, eager_updates: int) -> None:
        """The hop is over before the switch: all its updates ran eagerly. A helper still running is
        `unfinished` (it is ended by `close`)."""
        self.eager_updates = eager_updates
        if self.running and not self.poll():
            self.seconds, self.outcome = time.monotonic() - self.started, "unfinished"

    def close(self, grace: float = 0.0) -> None:
        """End the helper if it still runs, after up to `grace` seconds for it to finish (time that would pass
        idle before the deadline): what it compiled by then stays cached for the next hop."""
        if self.proc is None or self.proc.poll() is not None:
            return
        if grace > 0:
            try:
                self.proc.wait(timeout=grace)
                return
            except subprocess.TimeoutExpired:
                pass
        try:  # its own session: the group holds Inductor's compile workers too
            os.killpg(self.proc.pid, signal.SIGKILL)
        except OSError:
            self.proc.kill()
        # one stuck in the kernel (a hung file system) is not worth holding the run lock for
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5.0)

    def record(self) -> dict[str, Any]:
        """summary.json's `compile.background`."""
        return {
            "networks": self.plan,
            "outcome": self.outcome,
            "seconds": round(self.seconds, 3),
            "eager_updates": self.eager_updates,
            # the helper ended (well or not) and the networks stayed eager for the whole hop
            "kept_eager": not self.switched and (self.outcome == "done" or self.outcome.startswith("failed")),
            "log": str(self.log_path),
            "pid": self.proc.pid if self.proc is not None else None,
        }

    def said(self) -> str:
        """The start of the hop's compile line."""
        log = f"(see {self.log_path})"
        if self.switched:
            if self.outcome == "done":
                return (
                    f"compiled in the background in {self.seconds:.1f} s while {self.eager_updates} update(s) "
                    "ran eagerly; then "
                )
            return f"the background compile {self.outcome} {log}; compiled in this process: "
        if self.outcome == "done":  # finished, but too late in the hop to load (or after its last check step)
            return (
                f"compiled in the background in {self.seconds:.1f} s, too late in the hop to load: the networks "
                f"stayed eager for all {self.eager_updates} update(s) of this hop, the next hop loads them; "
            )
        if self.outcome.startswith("not started"):
            return (
                f"the background compile was {self.outcome}: all {self.eager_updates} update(s) ran eagerly; "
            )
        if self.outcome == "unfinished":
            return (
                f"the background compile was still running when the hop ended ({self.seconds:.1f} s): all "
                f"{self.eager_updates} update(s) ran eagerly, and the next hop finds what it cached; "
            )
        return (
            f"the background compile {self.outcome} {log}: all {self.eager_updates} update(s) ran eagerly; "
        )

    def compiled_all(self) -> bool:
        """The helper ended well, compiled every network of its plan and hit no recompile limit: the kept cache
        holds their code (its last line, commands/compile_ahead.py)."""
        if self.proc is None or self.proc.poll() != 0:  # also one that finished in the grace after the hop
            return False
        try:
            last = json.loads(self._last_line())
        except ValueError:
            return False
        return set(last.get("compiled", ())) == set(self.plan) and not last.get("recompile_limit_hits")

    def _last_line(self) -> str:
        try:
            lines = [
                ln.strip() for ln in self.log_path.read_text(errors="replace").splitlines() if ln.strip()
            ]
        except OSError:
            lines = []
        code = self.proc.returncode if self.proc is not None else None
        return lines[-1][:300] if lines else f"exit {code}"


def helper_environ() -> dict[str, str]:
    """The helper's environment: the trainer's (the compile cache's folder included), with Inductor's parallel
    compile workers held to half the allocation's cores unless the user set them: the training process and its
    data workers keep the rest while the hop trains on."""
    env = dict(os.environ)
    # the helper ends when this process is gone, even during its imports
    env[PARENT_VARIABLE] = str(os.getpid())
    if "TORCHINDUCTOR_COMPILE_THREADS" not in env:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 2
        env["TORCHINDUCTOR_COMPILE_THREADS"] = str(max(1, cores // 2))
    return env


def own_tensors(tree: Any) -> Any:
    """`tree` with every tensor copied to the host into a storage of its own (dicts, lists, tuples, named
    tuples and dataclasses walked).
    A batch laid out in one byte buffer (events/batch.py `packed`) holds int64 and float32 views of one uint8
    storage, which torch.save writes but torch.load refuses ("record size ... does not match")."""
    if isinstance(tree, torch.Tensor):
        return tree.detach().to("cpu", copy=True)
    if dataclasses.is_dataclass(tree) and not isinstance(tree, type):
        fields = {f.name: own_tensors(getattr(tree, f.name)) for f in dataclasses.fields(tree) if f.init}
        return dataclasses.replace(tree, **fields)
    if isinstance(tree, dict):
        return {key: own_tensors(value) for key, value in tree.items()}
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):  # a named tuple
        return type(tree)(*(own_tensors(value) for value in tree))
    if isinstance(tree, list | tuple):
        return type(tree)(own_tensors(value) for value in tree)
    return tree


def _feed(proc: subprocess.Popen[bytes], payload: dict[str, Any]) -> None:
    assert proc.stdin is not None
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    try:
        proc.stdin.write(buffer.getvalue())
        proc.stdin.close()
    except OSError:  # the helper died before reading: poll() reports its exit
        pass
