"""A USR1/TERM at any moment of a training process's start, and just after it finished, ends it cleanly: before
training a requeue-able stop (exit 75, as a time-budget stop), after "finished" ignored (exit 0); never a death
by the signal (exit 138 / 143, -10 / -15 from Popen).

The processes start with the stop signals blocked, as a launcher that wants no window at all before Python runs
does: `hpctrain train` lets them through once its handlers are in place (runtime/signals.py), so a signal sent
at delay 0 is delivered to the handler, not to the default action."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from hpctrain.runtime.signals import STOP_SIGNALS
from tests.conftest import clean_env, late_signals

DELAYS = (0.0, 0.3)  # the whole sweep (0 to 1 s, and mid-start-up) is in bench/faults.py


def _block() -> None:
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)


def start(tmp_path: Path, name: str, updates: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            *(sys.executable, "-m", "hpctrain", "train", f"run.out_dir={tmp_path}", f"run.name={name}"),
            *(f"train.total_updates={updates}", "data.n_train=256", "data.n_val=64", "train.eval_every=0"),
        ],
        cwd=tmp_path,
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_block,
    )


def test_a_stop_signal_in_the_first_second_is_a_clean_requeueable_stop(tmp_path: Path) -> None:
    sigs = [signal.SIGUSR1, signal.SIGTERM] * len(DELAYS)
    procs = []
    t0 = time.monotonic()
    for i, delay in enumerate(DELAYS):
        procs.append((delay, sigs[i], start(tmp_path, f"early{i}", updates=100_000), t0 + delay))
    for _delay, sig, proc, when in sorted(procs, key=lambda p: p[3]):
        time.sleep(max(0.0, when - time.monotonic()))
        proc.send_signal(sig)
    for delay, sig, proc, _ in procs:
        out, err = proc.communicate(timeout=240)
        assert proc.returncode == 75, (delay, sig, proc.returncode, err[-2000:])
        assert "stopped (signal)" in out and "run the same command again to continue" in out


def test_a_signal_just_after_finished_is_ignored(tmp_path: Path) -> None:
    proc = start(tmp_path, "late", updates=3)
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("finished at update"):
            proc.send_signal(signal.SIGTERM)
            proc.send_signal(signal.SIGUSR1)
            break
    proc.communicate(timeout=120)
    assert proc.returncode == 0


def test_a_stop_signal_during_the_interpreters_finalization_is_ignored(tmp_path: Path) -> None:
    """U2: USR1 and TERM delivered after the exit handlers, once the interpreter has given Python-handled signals
    their default action back (the window that killed a finished run with exit 138): ignored, exit 0; for
    `hpctrain train` and for a supervisor (`hpctrain supervise`) alike."""
    env = clean_env(**late_signals())
    train = subprocess.run(
        [sys.executable, "-m", "hpctrain", "train", f"run.out_dir={tmp_path}", "run.name=late",
         "train.total_updates=3", "data.n_train=64", "data.n_val=16", "train.eval_every=0"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert train.returncode == 0, (train.returncode, train.stderr[-2000:])
    assert "finished at update 3/3" in train.stdout
    supervise = subprocess.run(
        [sys.executable, "-m", "hpctrain", "supervise", "--run-dir", str(tmp_path / "late"), "--",
         sys.executable, "-c", "pass"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert supervise.returncode == 0, (supervise.returncode, supervise.stderr[-2000:])
