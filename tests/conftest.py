"""Shared fixtures: a clean environment for subprocesses and a runner for the `hpctrain` command."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.xdist_groups import pytest_xdist_make_scheduler  # noqa: F401  (make test's grouping)

pytest_plugins = ["tests.integration.slurm_fixtures"]

ROOT = Path(__file__).resolve().parents[1]
# Variables that would leak the developer's or CI's settings into a test's configuration.
_LEAKY = (
    "LR",
    "BATCH_SIZE",
    "GLOBAL_BATCH_SIZE",
    "TOTAL_UPDATES",
    "EPOCHS",
    "SEED",
    "GPUS",
    "NODES",
    "DATA_TYPE",
    "TRAIN_SAMPLES",
    "VAL_SAMPLES",
    "RESULTS_DIR",
    "DATA_DIR",
    "WANDB_API_KEY",
    # set in this process by an in-process run that compiled (train/compile/cache.py keep_compiled_code): a child
    # must choose its own, beside its own runs
    "TORCHINDUCTOR_CACHE_DIR",
)


if os.environ.get("PYTEST_XDIST_WORKER"):
    # Workers beside each other on few cores, each torch (and every `hpctrain` it starts) with 2 OpenMP threads: spinning
    # threads waiting for each other made a CPU-bound test 2x slower under load (94 s vs 46 s with PASSIVE;
    # on an idle machine spinning wins, 18 s vs 24 s, but under xdist the machine is never idle).
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def clean_env(**extra: str) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("HPCTRAIN_", "SLURM_")) and k not in _LEAKY
    }
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


FAULT_HOOK = Path(__file__).parent / "faulthook"


def save_pause(seconds: float, hops: int | None = None) -> dict[str, str]:
    """Environment for a subprocess whose checkpoint saves pause `seconds` before their rename (the window a
    fault test kills in, or a way to make hops last), in the run's first `hops` hops only if given: see
    tests/faulthook/sitecustomize.py."""
    path = os.pathsep.join(p for p in (str(FAULT_HOOK), os.environ.get("PYTHONPATH", "")) if p)
    env = {"_HPCTRAIN_TEST_SAVE_PAUSE": str(seconds), "PYTHONPATH": path}
    return env if hops is None else {**env, "_HPCTRAIN_TEST_SAVE_PAUSE_HOPS": str(hops)}


def start_pause(seconds: float) -> dict[str, str]:
    """Environment for subprocesses in which each `hpctrain train` sleeps `seconds` before any hpctrain line runs
    (a slow start, the window before its signal handlers): see tests/faulthook/sitecustomize.py."""
    path = os.pathsep.join(p for p in (str(FAULT_HOOK), os.environ.get("PYTHONPATH", "")) if p)
    return {"_HPCTRAIN_TEST_START_PAUSE": str(seconds), "PYTHONPATH": path}


def start_gate(gate: Path) -> dict[str, str]:
    """Environment for subprocesses in which each `hpctrain train` waits, before any hpctrain line runs, until the
    file `gate` exists (a start held open until the test has acted): see tests/faulthook/sitecustomize.py."""
    path = os.pathsep.join(p for p in (str(FAULT_HOOK), os.environ.get("PYTHONPATH", "")) if p)
    return {"_HPCTRAIN_TEST_START_GATE": str(gate), "PYTHONPATH": path}


def kill_once(marker: Path) -> dict[str, str]:
    """Environment for subprocesses of which the first to move `latest` a second time dies by SIGKILL there
    (one committed checkpoint behind it), once for all of them (`marker`): see tests/faulthook/sitecustomize.py."""
    path = os.pathsep.join(p for p in (str(FAULT_HOOK), os.environ.get("PYTHONPATH", "")) if p)
    return {"_HPCTRAIN_TEST_KILL_ONCE": str(marker), "PYTHONPATH": path}


def fake_compile(log: Path) -> dict[str, str]:
    """Environment for a subprocess whose torch.compile only records its arguments in `log` (JSON lines of mode,
    activation-memory budget, network class): see tests/faulthook/sitecustomize.py."""
    path = os.pathsep.join(p for p in (str(FAULT_HOOK), os.environ.get("PYTHONPATH", "")) if p)
    return {"_HPCTRAIN_TEST_FAKE_COMPILE": str(log), "PYTHONPATH": path}


def compile_ahead(how: str) -> dict[str, str]:
    """Environment for a subprocess whose background compile's helper is waited for at the first check step after
    its start; with `fail` it dies at once: see tests/faulthook/sitecustomize.py."""
    path = os.pathsep.join(p for p in (str(FAULT_HOOK), os.environ.get("PYTHONPATH", "")) if p)
    return {"_HPCTRAIN_TEST_COMPILE_AHEAD": how, "PYTHONPATH": path}


def step_fault(**faults: object) -> dict[str, str]:
    """Environment for subprocesses whose task update runs out of memory, stalls or spikes as
    tests/faulthook/step_faults.py's faulty_step(**faults) says."""
    path = os.pathsep.join(p for p in (str(FAULT_HOOK), os.environ.get("PYTHONPATH", "")) if p)
    return {"_HPCTRAIN_TEST_STEP_FAULT": json.dumps(faults), "PYTHONPATH": path}


def exit_marks(marks: Path) -> dict[str, str]:
    """Environment for subprocesses that record in `marks` whether their exit handlers and the interpreter's
    finalization ran, with their RANK: see tests/faulthook/sitecustomize.py."""
    path = os.pathsep.join(p for p in (str(FAULT_HOOK), os.environ.get("PYTHONPATH", "")) if p)
    return {"_HPCTRAIN_TEST_EXIT_MARKS": str(marks), "PYTHONPATH": path}


def late_signals() -> dict[str, str]:
    """Environment for subprocesses in which each `hpctrain` process sends itself USR1 and TERM during the
    interpreter's finalization, after its last line: see tests/faulthook/sitecustomize.py."""
    path = os.pathsep.join(p for p in (str(FAULT_HOOK), os.environ.get("PYTHONPATH", "")) if p)
    return {"_HPCTRAIN_TEST_LATE_SIGNALS": "1", "PYTHONPATH": path}


@dataclass
class Done:
    code: int
    out: str
    err: str


def hpctrain(*args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 480) -> Done:
    """Run `python -m hpctrain ARGS` in a subprocess, as a user would: bounded, generously (a short training
    takes minutes on a loaded machine; pytest's own limit is 600 s)."""
    proc = subprocess.run(
        [sys.executable, "-m", "hpctrain", *args],
        cwd=cwd,
        env=env or clean_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return Done(proc.returncode, proc.stdout, proc.stderr)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def torchrun_train(
    *args: str, cwd: Path, nproc: int = 2, env: dict[str, str] | None = None
) -> subprocess.Popen:
    """`torchrun --nproc-per-node N -m hpctrain train ARGS` on 127.0.0.1 (real DDP, gloo on CPU)."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(nproc),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(free_port()),
        "-m",
        "hpctrain",
        "train",
        *args,
    ]
    return subprocess.Popen(
        cmd, cwd=cwd, env=clean_env(**(env or {})), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """In-process tests must not see the caller's HPCTRAIN_*/SLURM_*/alias variables either."""
    for key in list(os.environ):
        if key.startswith(("HPCTRAIN_", "SLURM_")) or key in _LEAKY:
            monkeypatch.delenv(key, raising=False)


@pytest.fixture(autouse=True)
def _fresh_pelican_filesystems() -> Iterator[None]:
    """Each test's loopback federation gets Pelican filesystems of its own: the process-wide ones (remote/files.py
    `_SHARED`, keyed by the discovery URL) keep namespace and listing caches that must not reach a later test's
    federation on a port that came round again."""
    from hpctrain.remote import files

    files._SHARED.clear()
    yield
    files._SHARED.clear()


def wait_for(predicate: Callable[[], Any], what: str, timeout: float, poll: float = 0.2) -> Any:
    """`predicate()`'s first true value, looked at every `poll` s; TimeoutError naming `what` after `timeout` s (a
    bound that only stops a hang: a loaded machine may not run what is waited for for seconds)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    raise TimeoutError(f"no {what} after {timeout:.0f} s")
