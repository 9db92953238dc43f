"""Test-only fault injection, loaded by every Python process whose PYTHONPATH starts with this folder.

Subprocesses (the CLI, SLURM jobs, submitit workers) cannot be monkeypatched from a test; this file does it for
them: with `_HPCTRAIN_TEST_SAVE_PAUSE=S` each checkpoint (`*.pt`) written through `hpctrain.fsutil` pauses S
seconds once complete and before its rename, a window in which a test kills the writer or slows a hop down.
Production code reads no such variable. Use `tests.conftest.save_pause(S)` to build the environment.
"""

import os

_pause = os.environ.get("_HPCTRAIN_TEST_SAVE_PAUSE")
# `_HPCTRAIN_TEST_SAVE_PAUSE_HOPS=N`: only in the run's first N hops (its chain.json, beside the checkpoints
# folder, holds N hops or fewer): those hops run out of time whatever the machine's speed, the later ones train at
# full speed (a chain of a known length, under SLURM, `hpctrain supervise` or by hand).
_pause_hops = os.environ.get("_HPCTRAIN_TEST_SAVE_PAUSE_HOPS")
if _pause:
    import json
    import time
    from pathlib import Path

    from hpctrain import fsutil

    def _hops(checkpoint: Path) -> int:
        try:
            return len(json.loads((checkpoint.parent.parent / "chain.json").read_text()))
        except (OSError, ValueError):
            return 0

    def _pause_before_commit(tmp: Path, path: Path) -> None:
        if path.suffix == ".pt" and (not _pause_hops or _hops(path) <= int(_pause_hops)):
            time.sleep(float(_pause))

    fsutil.before_commit = _pause_before_commit

# `_HPCTRAIN_TEST_FAKE_COMPILE=FILE`: torch.compile returns the network unchanged and appends what it was asked
# (mode, the compiler's activation-memory budget at that moment, the network's class) to FILE as JSON lines:
# compiling for real on CPU takes minutes. See tests.conftest.fake_compile(FILE).
_compile_log = os.environ.get("_HPCTRAIN_TEST_FAKE_COMPILE")
if _compile_log:
    import json

    import torch
    import torch._functorch.config

    def _fake_compile(model, *, mode=None, **kwargs):  # type: ignore[no-untyped-def]
        budget = torch._functorch.config.activation_memory_budget
        with open(_compile_log, "a") as out:
            out.write(json.dumps({"mode": mode, "budget": budget, "network": type(model).__name__}) + "\n")
        return model

    torch.compile = _fake_compile

# `_HPCTRAIN_TEST_KILL_ONCE=FILE`: the process that is about to move `latest` for the second time while FILE does
# not exist creates FILE and dies by SIGKILL (a crash after one committed checkpoint); later processes, finding
# FILE, run on. See tests.conftest.kill_once(FILE).
_kill_marker = os.environ.get("_HPCTRAIN_TEST_KILL_ONCE")
if _kill_marker:
    import signal
    from pathlib import Path

    from hpctrain import fsutil

    _moves = [0]
    _before = fsutil.before_commit

    def _kill_before_second_latest(tmp: Path, path: Path) -> None:
        if _before is not None:
            _before(tmp, path)
        if path.name == "latest":
            _moves[0] += 1
            if _moves[0] == 2 and not os.path.exists(_kill_marker):
                Path(_kill_marker).touch()
                os.kill(os.getpid(), signal.SIGKILL)

    fsutil.before_commit = _kill_before_second_latest

# `_HPCTRAIN_TEST_START_PAUSE=S`: a `hpctrain train` process sleeps S seconds here, before any line of hpctrain
# runs (a slow start: imports from a loaded network file system), the window in which a stop signal would kill
# a process that has no handlers yet. Other processes (the batch script's helpers) start at once.
# `_HPCTRAIN_TEST_START_GATE=FILE`: the same, held until FILE exists (a window as long as the test needs it,
# however loaded the machine; at most 10 minutes). See tests.conftest.start_pause / start_gate.
_start_pause = os.environ.get("_HPCTRAIN_TEST_START_PAUSE")
_start_gate = os.environ.get("_HPCTRAIN_TEST_START_GATE")
if _start_pause or _start_gate:
    import sys

    if "train" in sys.orig_argv and any(a.endswith("hpctrain") for a in sys.orig_argv):
        import time

        if _start_pause:
            time.sleep(float(_start_pause))
        _until = time.monotonic() + 600
        while _start_gate and not os.path.exists(_start_gate) and time.monotonic() < _until:
            time.sleep(0.05)

# `_HPCTRAIN_TEST_EXIT_MARKS=FILE`: each process appends "exit-handlers rank=R" to FILE from an atexit handler and
# "finalized rank=R" from the interpreter's finalization (a module global's __del__), R its RANK (or SLURM_PROCID): a
# rank that joined a process group ends after its exit handlers, without finalization (hpctrain.runtime.dist.end_process).
_exit_marks = os.environ.get("_HPCTRAIN_TEST_EXIT_MARKS")
if _exit_marks:
    import atexit

    def _mark(
        what: str,
        path: str = _exit_marks,
        rank: str | None = os.environ.get("RANK", os.environ.get("SLURM_PROCID")),
        opener=open,
    ) -> None:  # type: ignore[no-untyped-def]
        with opener(path, "a") as out:
            out.write(f"{what} rank={rank}\n")

    atexit.register(_mark, "exit-handlers")

    class _AtFinalization:
        def __del__(self, mark=_mark) -> None:  # type: ignore[no-untyped-def]
            mark("finalized")

    _at_finalization = _AtFinalization()

# `_HPCTRAIN_TEST_COMPILE_AHEAD=wait|fail`: the background compile's helper (hpctrain/train/compile/ahead.py) is
# waited for at the first check step after its start, so the switch comes at a known update however slow the
# machine; with `fail` the helper cannot start (it dies at once). See tests.conftest.compile_ahead(HOW).
_ahead = os.environ.get("_HPCTRAIN_TEST_COMPILE_AHEAD")
if _ahead:
    from hpctrain.train.compile import ahead as compile_ahead

    _poll = compile_ahead.CompileAhead.poll

    def _waiting_poll(self):  # type: ignore[no-untyped-def]
        if self.proc is not None and self.running:
            self.proc.wait()
        return _poll(self)

    compile_ahead.CompileAhead.poll = _waiting_poll
    if _ahead == "fail":
        compile_ahead.HELPER = "hpctrain.commands.no_such_helper"

# `_HPCTRAIN_TEST_LATE_SIGNALS=1`: a `hpctrain` process (train, supervise) sends itself USR1 then TERM from the
# interpreter's finalization (a module global's __del__), after its exit handlers and after the interpreter gave
# every Python-handled signal its default action back: a stop signal that arrives after the run's last line, in
# the window that killed a finished run (exit 138). See tests.conftest.late_signals().
if os.environ.get("_HPCTRAIN_TEST_LATE_SIGNALS"):
    import sys

    if any(a.endswith("hpctrain") for a in sys.orig_argv):
        import signal
        import time

        class _LateSignals:
            # (bound as defaults: nothing can be imported during finalization)
            def __del__(
                self, kill=os.kill, pid=os.getpid, sleep=time.sleep, sigs=(signal.SIGUSR1, signal.SIGTERM)
            ) -> None:  # type: ignore[no-untyped-def]
                for sig in sigs:
                    kill(pid(), sig)
                    sleep(0.05)

        _late_signals = _LateSignals()

# `_HPCTRAIN_TEST_STEP_FAULT=JSON`: the task's update runs out of memory, stalls or spikes as step_faults.py's
# faulty_step(**JSON) says. See tests.conftest.step_fault(...).
_step_fault = os.environ.get("_HPCTRAIN_TEST_STEP_FAULT")
if _step_fault:
    import json

    from step_faults import faulty_step

    from hpctrain.train.task import SupervisedTask

    SupervisedTask.train_step = faulty_step(**json.loads(_step_fault))  # type: ignore[method-assign]
