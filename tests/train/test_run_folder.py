"""The run folder on the real CLI: one owner at a time, nothing lost when checkpoints are unreadable or the run is
started afresh, one-line errors for checkpoints that do not fit, and a mirror that is whole at every moment."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from hpctrain.commands.train import run
from hpctrain.config.loading import ConfigRequest, load_config
from hpctrain.errors import EXIT_OK, RunError, UserError
from hpctrain.runtime.env import ClusterEnv
from hpctrain.train import runlock
from hpctrain.train.checkpoint import read_checkpoint
from hpctrain.workloads.registry import config_model, fill_default_types
from tests.conftest import clean_env, hpctrain, read_jsonl, wait_for

SMALL = ["run.out_dir=out", "train.eval_every=0", "logging.log_every=1", "train.threads=1"]


def cfg_for(out: Path, *overrides: str):
    base = ["run.name=t", f"run.out_dir={out}", "train.eval_every=0", "logging.log_every=1"]
    return load_config(
        ConfigRequest(None, None, [*base, *overrides], None), config_model(), prepare=fill_default_types
    )


def one_error_line(err: str) -> str:
    # Log lines of the start may come first; the error itself is one line.
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


def dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def write_dead_holders_lock(folder: Path) -> dict:
    """A run.lock on this host whose holder is gone, its heartbeat still fresh (killed a moment ago)."""
    record = {
        "pid": dead_pid(),
        "host": runlock.HOST,
        "job_id": None,
        "started": 1.0,
        "heartbeat": time.time(),
    }
    (folder / "run.lock").write_text(json.dumps(record))
    return record


def listing(folder: Path) -> dict[str, bytes]:
    # config.yaml aside: commands/train.py still writes it before the run folder is locked (to be moved).
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name != "config.yaml")
    return {str(p.relative_to(folder)): p.read_bytes() for p in files}


# ---- one process per run folder ----------------------------------------------------------------------------


def test_a_second_process_in_a_used_run_folder_exits_2_naming_the_holder(tmp_path: Path):
    args = [sys.executable, "-m", "hpctrain", "train", *SMALL, "train.total_updates=1000000"]
    args += ["checkpoint.every=5", "logging.log_every=1000"]
    first = subprocess.Popen(
        args, cwd=tmp_path, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    run_dir = tmp_path / "out" / "debug"
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not (run_dir / "checkpoints" / "latest").exists():
            assert first.poll() is None, first.communicate()
            time.sleep(0.1)
        record = json.loads((run_dir / "run.lock").read_text())
        assert record["pid"] == first.pid and record["host"] == runlock.HOST
        assert record["heartbeat"] >= record["started"]
        second = hpctrain("train", *SMALL, "train.total_updates=1000000", cwd=tmp_path)
        assert second.code == 2
        line = one_error_line(second.err)
        assert f"run folder out/debug is in use by pid {first.pid} on host {runlock.HOST}" in line
        assert "use another run.name" in line
        assert "resumed" not in second.out and "starting" not in second.out
        assert json.loads((run_dir / "run.lock").read_text())["pid"] == first.pid  # left to its holder
        assert first.poll() is None, "the first run must go on untouched"
        first.send_signal(signal.SIGTERM)
        _, err = first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 75, err.decode()[-2000:]
    assert b"Traceback" not in err and b"removing a half-written" not in err
    folder = run_dir / "checkpoints"
    assert read_checkpoint(folder / (folder / "latest").read_text().strip())["counters"]["step"] > 0
    assert not list(folder.glob(".*")) and not (run_dir / "run.lock").exists()  # released on exit


def test_a_dead_holders_lock_and_temporaries_are_taken_over(tmp_path: Path):
    run_dir = tmp_path / "out" / "debug"
    (run_dir / "checkpoints").mkdir(parents=True)
    gone = dead_pid()
    now = time.time()
    record = {"pid": gone, "host": runlock.HOST, "job_id": "7", "started": now - 50, "heartbeat": now}
    (run_dir / "run.lock").write_text(json.dumps(record))
    dead_tmp = run_dir / "checkpoints" / f".step_00000020.pt.tmp-{gone}@{runlock.HOST}"
    dead_tmp.write_bytes(b"half")
    done = hpctrain("train", *SMALL, "train.total_updates=3", cwd=tmp_path)
    assert done.code == 0, done.err
    assert f"taking over the lock of out/debug from a process that is gone (pid {gone} on host" in done.err
    assert not dead_tmp.exists() and not (run_dir / "run.lock").exists()


def test_only_temporaries_of_dead_writers_are_removed(tmp_path: Path):
    from hpctrain.train.checkpoint import CheckpointStore

    live = subprocess.Popen(["sleep", "60"])
    try:
        names = {
            "live": f".step_00000010.pt.tmp-{live.pid}@{runlock.HOST}",
            "dead": f".step_00000020.pt.tmp-{dead_pid()}@{runlock.HOST}",
            "fresh_elsewhere": ".step_00000030.pt.tmp-123@other-node",
            "old_elsewhere": ".step_00000040.pt.tmp-123@other-node",
        }
        for name in names.values():
            (tmp_path / name).write_bytes(b"x")
        old = time.time() - runlock.STALE_SECONDS - 10
        os.utime(tmp_path / names["old_elsewhere"], (old, old))
        CheckpointStore(tmp_path, keep_last=2).clean_temporaries()
        left = {p.name for p in tmp_path.iterdir()}
        assert left == {names["live"], names["fresh_elsewhere"]}
    finally:
        live.kill()
        live.wait()


def test_lock_under_flock_refuses_while_held_across_heartbeats(tmp_path: Path, monkeypatch, caplog):
    monkeypatch.setattr(runlock, "HEARTBEAT_SECONDS", 0.02)
    holder = runlock.RunLock(tmp_path, job_id="1")
    holder.acquire()
    try:
        first_beat = json.loads((tmp_path / "run.lock").read_text())["heartbeat"]
        refused = 0

        def beat() -> bool:
            return json.loads((tmp_path / "run.lock").read_text())["heartbeat"] > first_beat

        # refused at every try while the heartbeat renames a new locked file over run.lock, until at least 50
        # beats' time went by (and a beat was seen: a loaded machine may not run the thread for a while)
        deadline = time.time() + 1.0
        while time.time() < deadline or not beat():
            with pytest.raises(UserError, match=f"in use by pid {os.getpid()}"):
                runlock.RunLock(tmp_path).acquire()
            refused += 1
            assert time.time() < deadline + 30, "no heartbeat in 30 s"
        assert refused > 5
    finally:
        holder.release()
    assert not (tmp_path / "run.lock").exists()
    again = runlock.RunLock(tmp_path)
    again.acquire()
    again.release()
    assert "no longer ours" not in caplog.text


def test_a_live_heartbeat_from_another_host_is_held_even_when_flock_succeeds(tmp_path: Path, caplog):
    now = time.time()
    record = {
        "pid": 4242,
        "host": "node-elsewhere",
        "job_id": "99",
        "started": now - 600,
        "heartbeat": now - 5,
    }
    (tmp_path / "run.lock").write_text(json.dumps(record))
    with pytest.raises(UserError) as info:
        runlock.RunLock(tmp_path, job_id="100").acquire()
    message = str(info.value)
    assert "in use by pid 4242 on host node-elsewhere (job 99)" in message
    assert "stale 120 s after its last heartbeat" in message
    # The same job, requeued by SLURM onto another node: its previous run there has ended.
    requeued = runlock.RunLock(tmp_path, job_id="99", restart_count=1)
    requeued.acquire()
    requeued.release()
    record["heartbeat"] = now - runlock.STALE_SECONDS - 1
    (tmp_path / "run.lock").write_text(json.dumps(record))
    lock = runlock.RunLock(tmp_path, job_id="100")
    lock.acquire()
    assert json.loads((tmp_path / "run.lock").read_text())["job_id"] == "100"
    lock.release()
    assert "taking over the lock" in caplog.text


def test_without_flock_the_lock_is_an_exclusive_file_with_a_heartbeat(tmp_path: Path, monkeypatch, caplog):
    def no_flock(fd: int, op: int) -> None:
        raise OSError(runlock.errno.ENOLCK, "No locks available")

    monkeypatch.setattr(runlock.fcntl, "flock", no_flock)
    monkeypatch.setattr(runlock, "TAKEOVER_PAUSE", 0.01)
    monkeypatch.setattr(runlock, "HEARTBEAT_SECONDS", 0.02)
    holder = runlock.RunLock(tmp_path)
    holder.acquire()
    try:
        with pytest.raises(UserError, match=f"in use by pid {os.getpid()}"):
            runlock.RunLock(tmp_path).acquire()
        before = json.loads((tmp_path / "run.lock").read_text())["heartbeat"]
        # every 0.02 s: a loaded machine may not run the thread for a while, so look for up to 10 s
        wait_for(
            lambda: json.loads((tmp_path / "run.lock").read_text())["heartbeat"] > before, "beat", 10, 0.02
        )
    finally:
        holder.release()
    # A dead holder's record is taken over; a live one on this host is not.
    record = write_dead_holders_lock(tmp_path)
    lock = runlock.RunLock(tmp_path)
    lock.acquire()
    assert "taking over the lock" in caplog.text
    # Someone overwrites the record while we hold it: the heartbeat says so loudly instead of overwriting it.
    # (written again if a heartbeat that had read the file before wrote ours over it)
    record["pid"] = 1

    def overwritten() -> bool:
        if "is no longer ours" in caplog.text:
            return True
        if json.loads((tmp_path / "run.lock").read_text())["pid"] != 1:
            (tmp_path / "run.lock").write_text(json.dumps(record))
        return False

    (tmp_path / "run.lock").write_text(json.dumps(record))
    wait_for(overwritten, '"is no longer ours"', 10, poll=0.02)
    lock.release()
    assert "is no longer ours" in caplog.text
    assert (tmp_path / "run.lock").exists()  # not ours: left alone


def test_close_after_a_failed_build_releases_the_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from hpctrain.workloads.regression.task import RegressionTask

    def broken(self, split, seed):
        raise UserError("broken data")

    # A build that fails half-way (after the lock, before the data): close() must still release the folder.
    with monkeypatch.context() as patch:
        patch.setattr(RegressionTask, "build_data", broken)
        with pytest.raises(UserError, match="broken data"):
            run(cfg_for(tmp_path, "train.total_updates=3"), ClusterEnv())
    assert not (tmp_path / "t" / "run.lock").exists()
    assert run(cfg_for(tmp_path, "train.total_updates=3"), ClusterEnv()) == EXIT_OK


# ---- unreadable checkpoints, fresh starts -----------------------------------------------------------------


def test_unreadable_checkpoints_fail_with_exit_1_and_change_nothing(tmp_path: Path):
    first = hpctrain("train", *SMALL, "train.total_updates=20", "checkpoint.every=10", cwd=tmp_path)
    assert first.code == 0, first.err
    run_dir = tmp_path / "out" / "debug"
    best = (run_dir / "checkpoints" / "best.pt").read_bytes()
    for path in (run_dir / "checkpoints").glob("*.pt"):
        path.write_bytes(path.read_bytes()[:200])  # cut short on disk
    before = listing(run_dir)
    again = hpctrain("train", *SMALL, "train.total_updates=40", cwd=tmp_path)
    assert again.code == 1
    line = one_error_line(again.err)
    assert line.startswith("error: no checkpoint in out/debug/checkpoints can be used (")
    assert "step_00000020.pt: its SHA-256 does not match step_00000020.json" in line
    assert "best.pt" in line and "checkpoint.resume=never" in line
    assert listing(run_dir) == before  # metrics, best.pt, latest, chain: nothing changed
    # best.pt as the last fallback, because it is a full training state: said in a warning.
    (run_dir / "checkpoints" / "best.pt").write_bytes(best)
    third = hpctrain("train", *SMALL, "train.total_updates=40", cwd=tmp_path)
    assert third.code == 0, third.err
    assert "resuming from best.pt, a full training state at update 20" in third.err
    steps = [r["step"] for r in read_jsonl(run_dir / "metrics.jsonl") if "loss" in r]
    assert steps == list(range(1, 41))  # the old run's records kept, each update once


def test_checkpoints_that_vanished_are_no_fresh_start(tmp_path: Path):
    assert run(cfg_for(tmp_path, "train.total_updates=4"), ClusterEnv()) == EXIT_OK
    run_dir = tmp_path / "t"
    for path in (run_dir / "checkpoints").iterdir():
        path.unlink()  # e.g. a listing a parallel file system got wrong, or a cleaned-up scratch
    metrics = (run_dir / "metrics.jsonl").read_bytes()
    with pytest.raises(RunError, match="says this run saved checkpoints up to update 4, but"):
        run(cfg_for(tmp_path, "train.total_updates=8"), ClusterEnv())
    assert (run_dir / "metrics.jsonl").read_bytes() == metrics


def test_resume_never_moves_the_previous_run_aside_and_keeps_to_its_own_checkpoints(tmp_path: Path):
    old = ["train.total_updates=40", "checkpoint.every=10", "checkpoint.keep_last=2"]
    assert hpctrain("train", *SMALL, *old, cwd=tmp_path).code == 0
    run_dir = tmp_path / "out" / "debug"
    old_files = listing(run_dir / "checkpoints")
    new = ["train.total_updates=20", "checkpoint.every=5", "checkpoint.keep_last=2"]
    fresh = hpctrain("train", *SMALL, *new, "checkpoint.resume=never", cwd=tmp_path)
    assert fresh.code == 0, fresh.err
    (aside,) = run_dir.glob("old-*")
    assert f"the previous run was moved to {aside.relative_to(tmp_path)}" in fresh.out
    assert listing(aside / "checkpoints") == old_files
    assert {p.name for p in aside.iterdir()} >= {"checkpoints", "metrics.jsonl", "chain.json", "summary.json"}
    assert max(r["step"] for r in read_jsonl(aside / "metrics.jsonl")) == 40
    folder = run_dir / "checkpoints"
    assert sorted(p.name for p in folder.glob("step_*.pt")) == ["step_00000015.pt", "step_00000020.pt"]
    assert [r["step"] for r in read_jsonl(run_dir / "metrics.jsonl") if "loss" in r] == list(range(1, 21))
    assert len(json.loads((run_dir / "chain.json").read_text())) == 1
    # A corrupt new latest falls back to this run's previous checkpoint, never to the old run's.
    (folder / "step_00000020.pt").write_bytes(b"garbage")
    again = hpctrain("train", *SMALL, *new, cwd=tmp_path)
    assert again.code == 0, again.err
    # ...and says which hop this is: the old run's hops were moved aside with it.
    said = (
        "resumed from out/debug/checkpoints/step_00000015.pt at update 15; hop 2 of this run (the last one: "
    )
    assert said + "no job, ended finished)" in again.out


def test_pruning_goes_by_recency_not_by_step_number(tmp_path: Path):
    from hpctrain.train.checkpoint import CheckpointStore

    store = CheckpointStore(tmp_path, keep_last=2)
    for step in (10, 20, 30, 40):
        store.save({"modules": {}, "counters": {"step": step}}, step)
    # Resumed from step 20 (say 30 and 40 were unreadable): this run writes 25, then 30 again.
    again = CheckpointStore(tmp_path, keep_last=2)
    again.save({"modules": {}, "counters": {"step": 25}}, 25)
    assert sorted(p.name for p in tmp_path.glob("step_*.pt")) == ["step_00000025.pt", "step_00000040.pt"]
    assert [p.name for p in again.candidates()] == ["step_00000025.pt", "step_00000040.pt"]
    again.save({"modules": {}, "counters": {"step": 30}}, 30)
    assert [p.name for p in again.candidates()] == ["step_00000030.pt", "step_00000025.pt"]


# ---- checkpoints that do not fit -------------------------------------------------------------------------


def test_a_checkpoint_that_does_not_fit_the_model_is_one_line_exit_2(tmp_path: Path):
    assert hpctrain("train", *SMALL, "train.total_updates=3", cwd=tmp_path).code == 0
    # Without accepting it the identity check refuses the change first (tests/train/test_identity.py); an
    # accepted architecture change must still fail in one line, naming the parameters that differ.
    # (named: without run.name the other architecture would be another run, in its own folder)
    refused = hpctrain(
        "train", *SMALL, "run.name=debug", "train.total_updates=6", "model.hidden=[32,64]", cwd=tmp_path
    )
    assert refused.code == 2 and "model.hidden [64,64] -> [32,64]" in one_error_line(refused.err)
    done = hpctrain(
        "train",
        *SMALL,
        "run.name=debug",
        "train.total_updates=6",
        "model.hidden=[32,64]",
        "checkpoint.accept_changes=[model.hidden]",
        cwd=tmp_path,
    )
    assert done.code == 2
    line = one_error_line(done.err)
    assert line.startswith(
        "error: checkpoint out/debug/checkpoints/step_00000003.pt does not fit network 'model': shapes differ "
        "for 3 parameters (net.0.weight: checkpoint [64, 16], model [32, 16]; net.0.bias: checkpoint [64], "
        "model [32]; net.2.weight: checkpoint [64, 64], model [64, 32])"
    )
    assert "another run.name, or checkpoint.resume=never" in line
    # A newer checkpoint format is no fallback to an older file either: one line, exit 2.
    path = tmp_path / "out" / "debug" / "checkpoints" / "step_00000003.pt"
    state = read_checkpoint(path)
    state["format"] = 99
    torch.save(state, path)
    data = path.read_bytes()
    sidecar = {"step": 3, "sha256": hashlib.sha256(data).hexdigest(), "seq": 1}
    path.with_suffix(".json").write_text(json.dumps(sidecar))
    newer = hpctrain("train", *SMALL, "train.total_updates=6", cwd=tmp_path)
    assert newer.code == 2
    assert "has format 99, newer than this hpctrain reads (1): update hpctrain" in one_error_line(newer.err)
    missing = hpctrain("train", *SMALL, "run.name=other", "checkpoint.resume=nope/step.pt", cwd=tmp_path)
    assert missing.code == 2
    assert one_error_line(missing.err) == (
        "error: checkpoint.resume=nope/step.pt: no such file or folder (give a checkpoint file or a run folder, "
        "or auto | never | latest | best | step_N)"
    )


def test_missing_and_unexpected_keys_and_unreadable_resume_paths(tmp_path: Path):
    first = cfg_for(tmp_path, "train.total_updates=2", "model.hidden=[8]", "optim.name=adamw")
    assert run(first, ClusterEnv()) == EXIT_OK
    with pytest.raises(UserError) as info:
        # (accepted, so that the identity check lets it through to the weights)
        accept = "checkpoint.accept_changes=[model.hidden]"
        run(cfg_for(tmp_path, "train.total_updates=4", "model.hidden=[8,8]", accept), ClusterEnv())
    message = str(info.value)
    assert (
        "shapes differ for 2 parameters (net.2.weight: checkpoint [1, 8], model [8, 8]; net.2.bias" in message
    )
    assert "2 parameters of the model missing from the checkpoint (net.4.weight; net.4.bias)" in message
    # Another optimizer: one line, not a KeyError in the middle of the first update.
    with pytest.raises(
        UserError, match=r"holds AdamW state for optimizer 'main', this run uses SGD \(optim.name"
    ):
        accept = "checkpoint.accept_changes=[optim.name]"
        run(
            cfg_for(tmp_path, "train.total_updates=4", "model.hidden=[8]", "optim.name=sgd", accept),
            ClusterEnv(),
        )
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a checkpoint")
    with pytest.raises(
        UserError,
        match=r"checkpoint.resume=.*garbage.pt: cannot be used: not a checkpoint: not the zip archive torch.save writes",
    ):
        run(cfg_for(tmp_path / "b", f"checkpoint.resume={garbage}"), ClusterEnv())
    # A run folder works as checkpoint.resume too (its latest checkpoint).
    cfg = cfg_for(tmp_path / "c", f"checkpoint.resume={tmp_path / 't'}", "model.hidden=[8]")
    assert run(cfg, ClusterEnv()) == EXIT_OK


# ---- the mirror --------------------------------------------------------------------------------------------


def test_mirror_is_whole_at_every_moment_while_saves_go_on(tmp_path: Path):
    mirror = tmp_path / "mirror" / "debug-hidden256_256" / "checkpoints"  # the run's own folder in the mirror
    problems: list[str] = []
    reads = {"n": 0}
    stop = threading.Event()

    def reader() -> None:
        seen_latest = False
        while not stop.is_set():
            try:
                name = (mirror / "latest").read_text().strip()
            except FileNotFoundError:
                if seen_latest:
                    problems.append("the mirror had no latest")
                time.sleep(0.001)
                continue
            seen_latest = True
            try:
                data = (mirror / name).read_bytes()
                digest = json.loads((mirror / name).with_suffix(".json").read_text())["sha256"]
                if hashlib.sha256(data).hexdigest() != digest:
                    problems.append(f"{name} does not match its hash")
                reads["n"] += 1
            except FileNotFoundError:
                # Only fine if latest moved on meanwhile (a later save pruned the one we were reading).
                if (mirror / "latest").read_text().strip() == name:
                    problems.append(f"latest names {name}, which the mirror lacks")

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        done = hpctrain(
            "train",
            *SMALL,
            "train.total_updates=80",
            "train.eval_every=10",
            "model.hidden=[256,256]",  # files of about 3 MB: copies take a while, saves come meanwhile
            "checkpoint.every=1",
            "checkpoint.keep_last=1",
            f"checkpoint.mirror_to={tmp_path / 'mirror'}",
            cwd=tmp_path,
        )
    finally:
        stop.set()
        thread.join()
    assert done.code == 0, done.err
    assert "mirroring checkpoints" not in done.err  # no failed copy
    assert not problems, problems[:5]
    assert reads["n"] > 10
    local = tmp_path / "out" / "debug-hidden256_256" / "checkpoints"  # model.hidden names the run
    assert listing(mirror) == listing(local)  # the final state, nothing stale, no temporaries


def test_folder_mirror_copies_only_what_changed(tmp_path: Path):
    import fsspec

    from hpctrain.remote.mirror import FolderMirror

    src = tmp_path / "checkpoints"
    src.mkdir()
    (src / "big.pt").write_bytes(b"a" * 100_000)
    (src / "step_1.pt").write_bytes(b"one")
    (src / "latest").write_text("step_1.pt\n")
    (src / ".step_2.pt.tmp-1@h").write_bytes(b"half")
    dest = tmp_path / "mirror"
    copier = FolderMirror(str(dest))
    copier.sync(src, last=("latest",))
    assert sorted(os.listdir(dest / "checkpoints")) == ["big.pt", "latest", "step_1.pt"]
    inode = (dest / "checkpoints" / "big.pt").stat().st_ino
    (src / "step_2.pt").write_bytes(b"two")
    (src / "step_1.pt").unlink()
    (src / "latest").write_text("step_2.pt\n")
    copier.sync(src, last=("latest",))
    assert sorted(os.listdir(dest / "checkpoints")) == ["big.pt", "latest", "step_2.pt"]
    assert (dest / "checkpoints" / "big.pt").stat().st_ino == inode  # untouched
    assert (dest / "checkpoints" / "latest").read_text() == "step_2.pt\n"
    remote = FolderMirror("memory:///mirror-sync-test")
    remote.sync(src, last=("latest",))
    (src / "step_2.pt").unlink()
    (src / "step_3.pt").write_bytes(b"three")
    (src / "latest").write_text("step_3.pt\n")
    remote.sync(src, last=("latest",))
    fs = fsspec.filesystem("memory")
    assert sorted(p.rsplit("/", 1)[-1] for p in fs.ls("/mirror-sync-test/checkpoints", detail=False)) == [
        "big.pt",
        "latest",
        "step_3.pt",
    ]
    assert fs.cat("/mirror-sync-test/checkpoints/latest") == b"step_3.pt\n"


def test_folder_mirror_holds_a_whole_checkpoint_after_every_single_operation(tmp_path: Path, monkeypatch):
    """Check the mirror after each rename and removal it makes: `latest` always names a file matching its hash."""
    from hpctrain.remote.mirror import FolderMirror
    from hpctrain.train.checkpoint import CheckpointStore

    local, dest = tmp_path / "run" / "checkpoints", tmp_path / "mirror"
    store = CheckpointStore(local, keep_last=1)
    copier = FolderMirror(str(dest))
    checked = {"n": 0}

    def check() -> None:
        folder = dest / "checkpoints"
        if not (folder / "latest").exists():
            assert not checked["n"], "the mirror lost its latest"
            return
        name = (folder / "latest").read_text().strip()
        digest = json.loads((folder / name).with_suffix(".json").read_text())["sha256"]
        assert hashlib.sha256((folder / name).read_bytes()).hexdigest() == digest
        checked["n"] += 1

    real_replace, real_unlink = os.replace, Path.unlink

    def replace(src, dst, **kwargs):
        real_replace(src, dst, **kwargs)
        if str(dst).startswith(str(dest)):
            check()

    def unlink(self, missing_ok=False):
        real_unlink(self, missing_ok=missing_ok)
        if str(self).startswith(str(dest)):
            check()

    for step in range(1, 6):
        store.save({"modules": {"w": torch.full((1000,), float(step))}}, step, best=step % 2 == 1)
        if step == 3:
            store.save({"modules": {"w": torch.zeros(1000)}}, step, best=True)  # the same step saved again
        with monkeypatch.context() as patch:
            patch.setattr(os, "replace", replace)
            patch.setattr(Path, "unlink", unlink)
            copier.sync(local, last=("latest",))
    assert checked["n"] > 15
    assert listing(dest / "checkpoints") == listing(local)


def test_a_flock_kept_by_a_dead_holders_forked_workers_is_taken_over(tmp_path: Path, monkeypatch, caplog):
    monkeypatch.setattr(runlock, "TAKEOVER_PAUSE", 0.01)
    write_dead_holders_lock(tmp_path)
    # A DataLoader worker forked by the dead holder: it still holds the flock of the file for a few seconds.
    orphan = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR); fcntl.flock(fd, fcntl.LOCK_EX); "
            "print('locked', flush=True); time.sleep(60)",
            str(tmp_path / "run.lock"),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert orphan.stdout is not None and orphan.stdout.readline().strip() == "locked"
        lock = runlock.RunLock(tmp_path)
        lock.acquire()
        assert "taking over the lock" in caplog.text
        with pytest.raises(UserError, match=f"in use by pid {os.getpid()}"):
            runlock.RunLock(tmp_path).acquire()  # the new file is locked: nobody else gets in
        lock.release()
    finally:
        orphan.kill()
        orphan.wait()


# ---- a disk that cannot take the checkpoint ------------------------------------------------------------------


def test_a_full_disk_at_a_save_is_one_line_keeps_the_last_checkpoint_and_leaves_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    import errno

    from hpctrain import fsutil

    assert run(cfg_for(tmp_path, "train.total_updates=4", "checkpoint.every=2"), ClusterEnv()) == EXIT_OK
    real_fsync = os.fsync

    def full(fd: int) -> None:
        # The disk fills up while the next checkpoint's data is flushed.
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".pt.tmp-" + str(os.getpid()) + "@" + fsutil.HOST):
            raise OSError(errno.ENOSPC, "No space left on device")
        real_fsync(fd)

    monkeypatch.setattr(fsutil.os, "fsync", full)
    with pytest.raises(RunError) as info:
        run(cfg_for(tmp_path, "train.total_updates=8", "checkpoint.every=2"), ClusterEnv())
    message = str(info.value)
    assert "\n" not in message
    assert "cannot write the checkpoint of update 6" in message and "No space left on device" in message
    assert "the last complete checkpoint (update 4) is kept" in message
    checkpoints = tmp_path / "t" / "checkpoints"
    assert (checkpoints / "latest").read_text().strip() == "step_00000004.pt"
    assert not [p.name for p in checkpoints.iterdir() if ".tmp-" in p.name]


def test_resume_never_moves_the_old_runs_wandb_records_aside_too(tmp_path: Path):
    assert run(cfg_for(tmp_path, "train.total_updates=2"), ClusterEnv()) == EXIT_OK
    folder = tmp_path / "t"
    (folder / "wandb.json").write_text('{"id": "old-run"}')
    (folder / "wandb" / "offline-run-old").mkdir(parents=True)
    assert run(cfg_for(tmp_path, "train.total_updates=2", "checkpoint.resume=never"), ClusterEnv()) == EXIT_OK
    (aside,) = folder.glob("old-*")
    assert (aside / "wandb.json").is_file() and (aside / "wandb" / "offline-run-old").is_dir()
    assert not (folder / "wandb.json").exists() and not (folder / "wandb").exists()


def test_runs_sharing_a_mirror_each_keep_their_own_copies(tmp_path: Path) -> None:
    """Two runs (other learning rates) with one checkpoint.mirror_to: each mirrors into <mirror_to>/<run name>/,
    neither replaces nor prunes the other's. A run of the same name from another run.out_dir is refused (one
    line) before anything moves: its copies would replace the first's."""
    mirror = tmp_path / "m"
    for name, lr in (("a", "1e-3"), ("b", "2e-3")):
        cfg = cfg_for(
            tmp_path / "out",
            f"run.name={name}",
            f"optim.lr={lr}",
            "train.total_updates=4",
            "checkpoint.every=2",
            "checkpoint.keep_last=1",
            f"checkpoint.mirror_to={mirror}",
        )
        assert run(cfg, ClusterEnv()) == EXIT_OK
    for name in ("a", "b"):
        assert listing(mirror / name / "checkpoints") == listing(tmp_path / "out" / name / "checkpoints")
        assert json.loads((mirror / name / ".hpctrain-run").read_text())["run"] == name
    kept = listing(mirror)
    other = cfg_for(
        tmp_path / "other", "run.name=a", "train.total_updates=4", f"checkpoint.mirror_to={mirror}"
    )
    with pytest.raises(
        UserError, match=r"checkpoint.mirror_to: .*/m/a holds the copies of the run folder .*/out/a"
    ):
        run(other, ClusterEnv())
    assert listing(mirror) == kept and not list((tmp_path / "other" / "a").rglob("step_*"))
