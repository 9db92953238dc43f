"""Nothing lost: time-based saves, the NaN/inf guard, and stops that do not wait for an evaluation or for data."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import fsspec
import pytest
import torch

from hpctrain.commands.train import run
from hpctrain.config import presets
from hpctrain.config.loading import ConfigRequest, load_config
from hpctrain.config.remote import StagingConfig
from hpctrain.data.loader import IndexedStream
from hpctrain.data.staging import Stager
from hpctrain.errors import EXIT_FAILURE, EXIT_OK, EXIT_RESUMABLE
from hpctrain.runtime.budget import StopRequested, check_stop, watch_waits
from hpctrain.runtime.env import ClusterEnv
from hpctrain.train.checkpoint import load_verified
from hpctrain.workloads.registry import config_model, fill_default_types
from hpctrain.workloads.regression.task import RegressionTask
from tests.conftest import clean_env, hpctrain, read_jsonl, torchrun_train

# From update 31 on the LR is 1e27: the weights blow up and the loss of update 32 is inf (then nan).
EXPLODE = (
    "schedule.stages=[{type: constant, num_updates: 30}, "
    "{type: constant, num_updates: -1, start_factor: 1.0e30, end_factor: 1.0e30}]"
)
NAN_RUN = ["run.name=nan", "train.total_updates=100", "train.eval_every=0", "checkpoint.every=10", EXPLODE]


def popen_train(*args: str, cwd: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "hpctrain", "train", *args],
        cwd=cwd,
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def latest(run_dir: Path) -> str:
    return (run_dir / "checkpoints" / "latest").read_text().strip()


def sha_on_last_line(out: str) -> str:
    last = out.strip().splitlines()[-1]
    assert "params_sha256=" in last, last
    return last.rsplit("params_sha256=", 1)[1]


def error_lines(err: str) -> list[str]:
    assert "Traceback" not in err, err[-3000:]
    return [line for line in err.splitlines() if line.startswith("error:")]


# ---- A. time-based periodic saves ---------------------------------------------------------------------------


def test_cluster_presets_save_every_30_minutes_and_debug_keeps_its_step_saves():
    for name in ("single_gpu", "multi_gpu", "multi_node"):
        cfg = load_config(ConfigRequest(None, name, [], None), config_model(), prepare=fill_default_types)
        assert cfg.checkpoint.every_minutes == 30.0, name
    debug = load_config(ConfigRequest(None, "debug", [], None), config_model(), prepare=fill_default_types)
    assert debug.checkpoint.every == 100 and debug.checkpoint.every_minutes == 0
    assert "every_minutes" not in presets.debug()["checkpoint"]


def test_time_based_saves_let_a_killed_run_resume_exactly(tmp_path: Path):
    """SIGKILL (a crash, an OOM, a lost node) after a time-based save: the run continues from it, bit-exactly."""
    args = [
        "run.name=t",
        "train.total_updates=1500",
        "train.eval_every=0",
        "data.n_val=0",
        "checkpoint.every=0",  # no step-based saves: any checkpoint before the end is a time-based one
        # 0.12 s: short enough for several saves however fast the 1500 updates go (at 1.2 s a quiet machine
        # finished them before the first one)
        "checkpoint.every_minutes=0.002",
        "checkpoint.keep_last=100",
        "logging.log_every=50",
        "train.threads=1",
    ]
    ref = hpctrain("train", *args, "run.out_dir=ref", cwd=tmp_path)
    assert ref.code == EXIT_OK, ref.err
    ref_dir = tmp_path / "ref" / "t"
    saved = sorted(ref_dir.glob("checkpoints/step_*.json"))
    steps = [json.loads(p.read_text())["step"] for p in saved]
    assert len(steps) >= 2 and steps[-1] == 1500, steps  # time-based ones, then the final save
    # Saves are at least the interval apart (commit times of the sidecars, written right after each save).
    times = [p.stat().st_mtime for p in saved]
    assert all(b - a >= 0.12 * 0.9 for a, b in zip(times[:-2], times[1:-1])), times

    proc = popen_train(*args, "run.out_dir=cut", cwd=tmp_path)
    pointer = tmp_path / "cut" / "t" / "checkpoints" / "latest"
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None and not pointer.exists():
        time.sleep(0.02)
    proc.kill()  # no chance to save
    proc.communicate(timeout=300)
    assert pointer.exists(), "no time-based save before the run ended"
    again = hpctrain("train", *args, "run.out_dir=cut", cwd=tmp_path)
    assert again.code == EXIT_OK, again.err
    resumed = next(line for line in again.out.splitlines() if line.startswith("resumed from"))
    assert int(re.search(r"at update (\d+)", resumed).group(1)) > 0  # type: ignore[union-attr]
    assert sha_on_last_line(again.out) == summary(ref_dir)["params_sha256"]


# ---- B. NaN / inf ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("log_every", "found_at"),
    [(5, 35), (1000, 40)],  # found at the log line of update 35, or by the check before the save at 40
)
def test_nonfinite_loss_stops_with_one_line_and_keeps_the_last_good_checkpoint(
    tmp_path: Path, log_every: int, found_at: int
):
    args = [*NAN_RUN, "run.out_dir=out", f"logging.log_every={log_every}"]
    done = hpctrain("train", *args, cwd=tmp_path)
    assert done.code == EXIT_FAILURE, done.err
    lines = error_lines(done.err)
    assert len(lines) == 1 and "non-finite" in lines[0], done.err
    assert f"at update 32; stopped at update {found_at}" in lines[0]
    assert "latest stays at update 30" in lines[0]
    run_dir = tmp_path / "out" / "nan"
    assert latest(run_dir) == "step_00000030.pt"
    assert not list(run_dir.glob("checkpoints/step_0000004*"))  # nothing saved after the nan
    state = load_verified(run_dir / "checkpoints" / "step_00000030.pt")
    assert all(torch.isfinite(t).all() for t in state["modules"]["model"].values())
    result = summary(run_dir)
    assert result["status"] == "failed" and result["nonfinite_update"] == 32 and result["step"] == 30
    if log_every == 5:
        # The same command again continues from the good checkpoint and meets the same update: same line.
        again = hpctrain("train", *args, cwd=tmp_path)
        assert again.code == EXIT_FAILURE
        assert "resumed from" in again.out and "at update 30" in again.out
        assert error_lines(again.err) == lines
        assert latest(run_dir) == "step_00000030.pt"


def test_skip_batch_stops_after_max_skips_in_a_row(tmp_path: Path):
    args = [*NAN_RUN, "run.out_dir=out", "train.on_nonfinite=skip_batch", "train.max_nonfinite_skips=3"]
    done = hpctrain("train", *args, cwd=tmp_path)
    assert done.code == EXIT_FAILURE, done.err
    lines = error_lines(done.err)
    assert len(lines) == 1 and "3 updates in a row had non-finite gradients" in lines[0]
    assert "from update 32" in lines[0] and "stopped at update 34" in lines[0]
    assert done.err.count("optimizer step skipped") == 3
    run_dir = tmp_path / "out" / "nan"
    assert latest(run_dir) == "step_00000030.pt"
    assert summary(run_dir)["nonfinite_skips"] == 3


def nan_at(monkeypatch: pytest.MonkeyPatch, updates: set[int]) -> None:
    """The training loss of these updates (1-based) is nan: a bad batch, as data can produce."""
    original = RegressionTask.loss
    calls = {"n": 0}

    def loss(self, model, batch):
        calls["n"] += 1
        value, metrics = original(self, model, batch)
        return (value * float("nan") if calls["n"] in updates else value), metrics

    monkeypatch.setattr(RegressionTask, "loss", loss)


def cfg_for(out: Path, *overrides: str):
    base = ["run.name=t", f"run.out_dir={out}", "train.eval_every=0", "logging.log_every=5"]
    return load_config(
        ConfigRequest(None, None, [*base, *overrides], None), config_model(), prepare=fill_default_types
    )


def test_skip_batch_skips_a_bad_batch_and_trains_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys):
    with monkeypatch.context() as patch:
        nan_at(patch, {7, 12})
        cfg = cfg_for(tmp_path / "skip", "train.total_updates=20", "train.on_nonfinite=skip_batch")
        assert run(cfg, ClusterEnv()) == EXIT_OK
    result = summary(tmp_path / "skip" / "t")
    assert result["status"] == "finished" and result["step"] == 20 and result["nonfinite_skips"] == 2
    state = load_verified(tmp_path / "skip" / "t" / "checkpoints" / latest(tmp_path / "skip" / "t"))
    assert all(torch.isfinite(t).all() for t in state["modules"]["model"].values())
    logged = [r for r in read_jsonl(tmp_path / "skip" / "t" / "metrics.jsonl") if "nonfinite_skips" in r]
    assert [r["nonfinite_skips"] for r in logged] == [0, 1, 2, 2]
    # The default (stop) ends the same run at the bad batch, before any save: exit 1, one line.
    capsys.readouterr()
    with monkeypatch.context() as patch:
        nan_at(patch, {7})
        assert run(cfg_for(tmp_path / "stop", "train.total_updates=20"), ClusterEnv()) == EXIT_FAILURE
    err = capsys.readouterr().err
    assert error_lines(err) == [line for line in err.splitlines() if "non-finite" in line]
    assert "at update 7; stopped at update 10 without saving: no checkpoint was saved" in err
    assert not (tmp_path / "stop" / "t" / "checkpoints" / "latest").exists()


# ---- C. stops that do not wait ------------------------------------------------------------------------------

SLOW_EVAL = [
    "run.name=ev",
    "train.total_updates=40",
    "train.eval_every=20",
    "logging.log_every=10",
    "data.n_val=100000",  # ~3000 validation batches: an evaluation takes seconds
    "train.threads=1",
]


def signal_at_line(proc: subprocess.Popen, prefix: str, sig: int = signal.SIGUSR1) -> tuple[list[str], float]:
    """Send `sig` when stdout shows a line starting with `prefix` (the evaluation starts right after it);
    returns stdout and the seconds from the signal to the 'stopped' line."""
    assert proc.stdout is not None
    lines, sent = [], None
    for line in proc.stdout:
        lines.append(line)
        if sent is None and line.startswith(prefix):
            proc.send_signal(sig)
            sent = time.perf_counter()
        if sent is not None and line.startswith("stopped"):
            return lines, time.perf_counter() - sent
    raise AssertionError("".join(lines) + proc.stderr.read())  # type: ignore[union-attr]


def eval_records(run_dir: Path) -> dict[int, float]:
    records = [r for r in read_jsonl(run_dir / "metrics.jsonl") if "val_loss" in r]
    steps = [r["step"] for r in records]
    assert len(steps) == len(set(steps)), f"an evaluation was logged twice: {steps}"
    return {r["step"]: r["val_loss"] for r in records}


def test_stop_during_evaluation_abandons_it_and_the_resumed_run_redoes_it(tmp_path: Path):
    ref = hpctrain("train", *SLOW_EVAL, "run.out_dir=ref", cwd=tmp_path)
    assert ref.code == EXIT_OK, ref.err
    ref_dir = tmp_path / "ref" / "ev"
    one_eval = summary(ref_dir)["seconds"]["eval"] / 2
    args = [*SLOW_EVAL, "run.out_dir=cut"]
    run_dir = tmp_path / "cut" / "ev"
    # 1. USR1 during the evaluation at update 20: abandoned at once, saved at 20, exit 75.
    proc = popen_train(*args, cwd=tmp_path)
    out, waited = signal_at_line(proc, "update 20/")
    proc.communicate(timeout=120)
    assert proc.returncode == EXIT_RESUMABLE
    assert any("evaluation at update 20 cut short (signal)" in line for line in out)
    assert waited < one_eval, (waited, one_eval)  # right away, not after a whole evaluation
    assert summary(run_dir)["step"] == 20 and eval_records(run_dir) == {}
    # 2. The resumed run evaluates update 20 first; USR1 during the final evaluation (update 40).
    proc = popen_train(*args, cwd=tmp_path)
    out, waited = signal_at_line(proc, "update 40/")
    proc.communicate(timeout=120)
    assert proc.returncode == EXIT_RESUMABLE
    assert any("evaluation at update 40 cut short" in line for line in out)
    assert waited < one_eval, (waited, one_eval)
    assert summary(run_dir)["status"] == "stopped" and summary(run_dir)["step"] == 40
    # 3. The final evaluation still happens; everything equals the uninterrupted run.
    done = hpctrain("train", *args, cwd=tmp_path)
    assert done.code == EXIT_OK, done.err
    assert sha_on_last_line(done.out) == sha_on_last_line(ref.out)
    assert eval_records(run_dir) == eval_records(ref_dir)  # each evaluation once, same values
    hops = json.loads((run_dir / "chain.json").read_text())
    assert [h["exit_reason"] for h in hops] == ["signal", "signal", "finished"]


def rank_pids(torchrun_pid: int, world: int, timeout: float = 120) -> dict[int, int]:
    """rank -> pid of torchrun's worker processes (from /proc: their parent and RANK)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        found = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                if ppid != torchrun_pid:
                    continue
                environ = (entry / "environ").read_bytes().split(b"\0")
            except (OSError, IndexError, ValueError):
                continue
            ranks = [v.split(b"=", 1)[1] for v in environ if v.startswith(b"RANK=")]
            if ranks:
                found[int(ranks[0])] = int(entry.name)
        if len(found) == world:
            return found
        time.sleep(0.1)
    raise AssertionError(f"torchrun {torchrun_pid} did not start {world} workers")


def test_a_native_crash_prints_every_threads_python_stack(tmp_path: Path):
    """An abort in native code (gloo's threads, an extension) leaves the Python stacks in the log, not one line
    of C++: which rank died, and where."""
    proc = popen_train(*SLOW_EVAL, "run.out_dir=abort", cwd=tmp_path)
    metrics = tmp_path / "abort" / "ev" / "metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None and not metrics.exists():
        time.sleep(0.05)
    assert proc.poll() is None, proc.communicate()[1][-3000:]
    os.kill(proc.pid, signal.SIGABRT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == -signal.SIGABRT
    assert "Fatal Python error: Aborted" in err, err[-3000:]
    assert re.search(r"File \".*hpctrain/train/\w+\.py\", line \d+ in \w+", err), err[-3000:]


def test_ddp_stop_on_one_rank_during_evaluation_stops_all_together(tmp_path: Path):
    """USR1 to rank 1 only, during an evaluation: both ranks abandon it (no deadlock), save, and the resumed
    run evaluates that update; time-based saves (rank 0's clock) are agreed by both ranks as well."""
    # every_minutes=0.0001 (6 ms): a time-based save before update 20 for sure (then stretched to 50 saves' time).
    args = [*SLOW_EVAL, "run.out_dir=ddp", "checkpoint.every_minutes=0.0001", "checkpoint.keep_last=100"]
    proc = torchrun_train(*args, cwd=tmp_path)
    pids = rank_pids(proc.pid, 2)
    metrics = tmp_path / "ddp" / "ev" / "metrics.jsonl"
    deadline = time.time() + 180
    while time.time() < deadline and proc.poll() is None:
        if metrics.exists() and any(r["step"] == 20 for r in read_jsonl(metrics)):
            os.kill(pids[1], signal.SIGUSR1)
            break
        time.sleep(0.01)
    out, err = proc.communicate(timeout=180)
    run_dir = tmp_path / "ddp" / "ev"
    result = summary(run_dir)
    assert result["status"] == "stopped" and result["reason"] == "signal" and result["step"] == 20, err[
        -3000:
    ]
    assert "evaluation at update 20 cut short" in out and eval_records(run_dir) == {}
    again = torchrun_train(*args, cwd=tmp_path)
    out, err = again.communicate(timeout=240)
    assert again.returncode == 0, err[-3000:]
    assert summary(run_dir)["status"] == "finished"
    assert sorted(eval_records(run_dir)) == [20, 40]
    steps = {json.loads(p.read_text())["step"] for p in run_dir.glob("checkpoints/step_*.json")}
    assert any(step < 20 for step in steps), f"no time-based save: {steps}"


class _BlockingFS(fsspec.AbstractFileSystem):
    """A remote file system whose downloads never finish (until released): a stalled transfer."""

    protocol = "blockingtest"
    release = threading.Event()

    def size(self, path: str) -> int:
        return 10

    def get_file(self, rpath: str, lpath: str, callback=None, **kwargs) -> None:
        self.release.wait(60)
        raise OSError("released")


@pytest.fixture
def stop_after(request):
    """watch_waits with a check that says 'signal' after the given seconds (removed afterwards)."""

    def install(seconds: float) -> float:
        start = time.monotonic()
        watch_waits(lambda: "signal" if time.monotonic() - start > seconds else None)
        return start

    yield install
    watch_waits(None)


@pytest.mark.parametrize("local_rank", [0, 1])
def test_staging_wait_gives_up_when_a_stop_is_due(tmp_path: Path, stop_after, local_rank: int):
    """Local rank 0 waits for its own stalled download, another local rank for local rank 0's: both give up."""
    fsspec.register_implementation("blockingtest", _BlockingFS, clobber=True)
    _BlockingFS.release.clear()
    cfg = StagingConfig(dir=str(tmp_path), wait_timeout=60)
    stager = Stager(
        ["blockingtest://bucket/a.bin"], cfg, local_rank=local_rank, local_world_size=2, job_id="stall"
    )
    try:
        start = stop_after(0.3)
        with pytest.raises(StopRequested):
            stager.get(0)
        # polled at least every 0.5 s: given up long before wait_timeout (a loaded machine stretches the polls)
        assert time.monotonic() - start < cfg.wait_timeout / 2
    finally:
        _BlockingFS.release.set()
        watch_waits(None)
        stager._closing = True  # rank 0 would wait wait_timeout for the missing local rank 1
        stager.close()


def test_prefetch_queue_wait_gives_up_when_a_stop_is_due(stop_after):
    from hpctrain.data.stream.prefetch import Prefetcher

    release = threading.Event()

    stall = 60.0

    def stalled():
        yield 1
        release.wait(stall)  # the next batch is slow to come
        yield 2

    prefetcher = Prefetcher(stalled(), 2)
    items = iter(prefetcher)
    assert next(items) == 1
    start = stop_after(0.3)
    with pytest.raises(StopRequested):
        next(items)
    assert time.monotonic() - start < stall / 2  # given up long before the batch came
    release.set()
    prefetcher.close()


def test_stop_while_waiting_for_data_gives_the_batches_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A signal while the second batch of an update is awaited: the update is dropped, the first batch is
    not lost (the data position is the one before the update), and the resumed run equals an unstopped one."""
    common = ["train.total_updates=30", "train.grad_accum_steps=2", "data.batch_size=16"]
    assert run(cfg_for(tmp_path / "ref", *common), ClusterEnv()) == EXIT_OK
    original = IndexedStream.__iter__
    handed = {"n": 0}

    def iterate(self):
        for batch in original(self):
            handed["n"] += 1
            if handed["n"] == 24:  # the 2nd batch of update 12: a wait that only a stop ends
                os.kill(os.getpid(), signal.SIGUSR1)
                while True:
                    check_stop()
                    time.sleep(0.01)
            yield batch

    with monkeypatch.context() as patch:
        patch.setattr(IndexedStream, "__iter__", iterate)
        assert run(cfg_for(tmp_path / "cut", *common), ClusterEnv()) == EXIT_RESUMABLE
    first = summary(tmp_path / "cut" / "t")
    assert first["status"] == "stopped" and first["reason"] == "signal" and first["step"] == 11
    assert run(cfg_for(tmp_path / "cut", *common), ClusterEnv()) == EXIT_OK
    assert (
        summary(tmp_path / "cut" / "t")["params_sha256"] == summary(tmp_path / "ref" / "t")["params_sha256"]
    )


def test_urgent_stop_reason_signal_and_deadline():
    from hpctrain.config.schema import BudgetConfig
    from hpctrain.runtime.budget import StopSignals, TimeBudget

    now = [1000.0]
    budget = TimeBudget(
        BudgetConfig(time_limit="00:01:00", margin_seconds=5), ClusterEnv(), StopSignals(), lambda: now[0]
    )
    budget.save.observe(10.0)
    assert budget.urgent_stop_reason() is None
    now[0] += 60 - 15 + 0.1  # less than a save plus the margin left
    assert budget.urgent_stop_reason() == "time_budget"
    budget.signals.received = "SIGUSR1"
    assert budget.urgent_stop_reason() == "signal"
    # Saves are spaced so that they take at most 2% of the time: 10 s -> 500 s, even if asked for 1 minute.
    assert budget.save_interval(1.0) == 500.0 and budget.save_interval(30.0) == 1800.0
    assert math.isclose(budget.save_interval(0.0), 500.0)


def test_a_run_of_empty_batches_still_hears_a_stop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Empty batches are skipped without a check step (nothing trained, nothing counted): after a few real updates
    the data gives only empty batches, and a USR1 must still stop the run (issue 45 U1: it spun deaf to TERM and
    USR1 at 100 % CPU). Deaf, this stream gives up after 5,000 empty batches and the test fails."""
    original = IndexedStream.__iter__

    def iterate(self):
        for handed, batch in enumerate(original(self)):
            if handed < 5:
                yield batch
                continue
            for empty in range(5000):
                if empty == 50:
                    os.kill(os.getpid(), signal.SIGUSR1)
                yield tuple(t[:0] for t in batch)
            raise AssertionError("5,000 empty batches and no stop: the loop never asked")

    with monkeypatch.context() as patch:
        patch.setattr(IndexedStream, "__iter__", iterate)
        assert run(cfg_for(tmp_path, "train.total_updates=30"), ClusterEnv()) == EXIT_RESUMABLE
    result = summary(tmp_path / "t")
    assert (result["status"], result["reason"], result["step"]) == ("stopped", "signal", 5)
