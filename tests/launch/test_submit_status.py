"""`hpctrain submit --dry-run` and `hpctrain status` without a cluster, and without torch."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import Done, clean_env, hpctrain


def test_dry_run_prints_the_submitit_script_and_never_imports_torch(tmp_path: Path) -> None:
    code = (
        "import sys; from hpctrain.cli import main; "
        "rc = main(['submit', '--dry-run', 'slurm.gpus_per_node=2', 'slurm.partition=gpu', "
        "'slurm.max_resubmits=7']); "
        "assert 'torch' not in sys.modules, 'submit imported torch'; sys.exit(rc)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=clean_env(), capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert "#SBATCH --gpus-per-node=2" in done.stdout and "#SBATCH --partition=gpu" in done.stdout
    assert "#SBATCH --signal=USR2@30" in done.stdout and "#SBATCH --requeue" in done.stdout
    assert "#SBATCH --time=10" in done.stdout  # the debug preset's 00:10:00, in minutes
    assert "submitit.core._submit" in done.stdout and "dry run: nothing submitted" in done.stdout
    assert (tmp_path / "logs" / "slurm").is_dir()  # sbatch would open its --output there


def test_status_never_imports_torch_and_shows_hops(tmp_path: Path) -> None:
    run = tmp_path / "logs" / "r"
    (run / "checkpoints").mkdir(parents=True)
    now = time.time()
    hops = [
        {
            "hop": 0,
            "job_id": "7",
            "nodes": "c1",
            "start": now - 100,
            "end": now - 60,
            "first_update": 0,
            "last_update": 40,
            "exit_reason": "time_budget",
            "train_seconds": 32.0,
            "goodput": 0.8,
            "deadline": now - 50,
        },
        {
            "hop": 1,
            "job_id": "7",
            "nodes": "c1",
            "start": now - 50,
            "end": None,
            "first_update": 40,
            "last_update": 60,
            "exit_reason": None,
            "train_seconds": 16.0,
            "last_seen": now - 30,
            "deadline": now,
        },
    ]
    (run / "chain.json").write_text(json.dumps(hops))
    (run / "config.yaml").write_text("train:\n  total_updates: 100\nslurm:\n  resubmit: requeue\n")
    (run / "checkpoints" / "latest").write_text("step_00000060.pt\n")
    (run / "checkpoints" / "step_00000060.pt").write_bytes(b"x")
    (run / "checkpoints" / "step_00000060.json").write_text('{"step": 60, "sha256": "0"}')
    code = (
        "import sys; from hpctrain.cli import main; rc = main(['status', sys.argv[1], '--json']); "
        "assert 'torch' not in sys.modules; sys.exit(rc)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(run)], env=clean_env(), capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    info = json.loads(done.stdout)
    assert info["updates_done"] == 60 and info["total_updates"] == 100
    assert info["last_checkpoint"]["step"] == 60
    assert abs(info["goodput"] - 48 / 60) < 1e-6  # 48 s of steps in 40 + 20 s of hops
    # 60 updates in 60 s of hops; a hop gets 50 s (its deadline - its start): 40 left fit in one hop
    assert info["remaining_hops"] == 1 and info["hop_seconds"] == pytest.approx(50)
    text = hpctrain("status", str(run), cwd=tmp_path, env=clean_env(PATH=_bin(tmp_path, squeue="")))
    assert text.code == 0
    assert "updates 60 of 100 (60.0%)" in text.out and "#1 job 7 on c1" in text.out
    assert "-> killed:" in text.out and "step_00000060.pt (update 60" in text.out
    assert hpctrain("status", str(tmp_path / "nope"), cwd=tmp_path).code == 2
    (tmp_path / "afile").write_text("x")
    filed = hpctrain("status", str(tmp_path / "afile"), cwd=tmp_path)
    assert (
        filed.code == 2
        and filed.err.strip() == f"error: run folder '{tmp_path / 'afile'}' is a file, not a run folder"
    )


# ---- submit: what can be caught before queueing, and a failing sbatch ---------------------------------------


def _bin(tmp_path: Path, **scripts: str) -> str:
    """A PATH holding only the given fake commands (name -> shell body)."""
    folder = tmp_path / "bin"
    folder.mkdir(exist_ok=True)
    for name, body in scripts.items():
        script = folder / name
        script.write_text(f"#!/bin/sh\n{body}\n")
        script.chmod(0o755)
    return str(folder)


def _submit(tmp_path: Path, *args: str, path: str | None = None) -> Done:
    env = clean_env() if path is None else clean_env(PATH=path)
    return hpctrain("submit", f"run.out_dir={tmp_path / 'logs'}", *args, cwd=tmp_path, env=env)


def test_check_catches_missing_inputs_token_folder_and_resume_path(tmp_path: Path) -> None:
    muons = ["model.type=muon_wgan", "data.type=muons"]
    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "part-0.parquet").write_bytes(b"x")
    ok = _submit(tmp_path, *muons, f"data.paths=[{tmp_path / 'train'}, pelican:///ns/f.parquet]", "--check")
    assert ok.code == 0, ok.err
    assert "hpctrain_run_dir=" in ok.out
    cases = {
        f"data.val_paths=[{tmp_path / 'val'}]": f"error: data.val_paths: {tmp_path / 'val'}: no such file or "
        f"folder (nearest existing folder: {tmp_path}); if the data lives on a shared or scratch volume, check "
        "that it is mounted on this node",
        f"data.paths=[{tmp_path / 'train' / '*.h5'}]": f"error: data.paths: {tmp_path / 'train' / '*.h5'}: no "
        f"file matches this pattern (nearest existing folder: {tmp_path / 'train'})",
        "data.paths=[pelican://osg-htc.org]": "error: data.paths: pelican://osg-htc.org: no namespace path "
        "(e.g. pelican:///<namespace>/<file or folder>)",
        f"data.pelican.token_file={tmp_path / 'token'}": "error: data.pelican.token_file: cannot read token "
        f"file {tmp_path / 'token'} (No such file or directory)",
        f"checkpoint.resume={tmp_path / 'step_00000010.pt'}": f"error: checkpoint.resume="
        f"{tmp_path / 'step_00000010.pt'}: no such file or folder (give a checkpoint file or a run folder, or "
        "auto | never | latest | best | step_N)",
    }
    for override, line in cases.items():
        done = _submit(tmp_path, *muons, f"data.paths=[{tmp_path / 'train'}]", override, "--check")
        assert (done.code, done.err.strip()) == (2, line), override
    (tmp_path / "token").write_text("")
    done = _submit(tmp_path, f"data.pelican.token_file={tmp_path / 'token'}", "--check")
    assert done.code == 2 and done.err.strip().endswith("is empty")


def test_check_catches_an_unwritable_output_folder(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    done = hpctrain("submit", f"run.out_dir={tmp_path / 'file' / 'sub'}", "--check", cwd=tmp_path)
    assert done.code == 2
    assert done.err.strip() == (
        f"error: run.out_dir: {tmp_path / 'file' / 'sub' / 'debug'} cannot be created: "
        f"{tmp_path / 'file'} is a file, not a folder"
    )
    # Even root cannot create files in /proc: a real probe, not the permission bits.
    done = hpctrain("submit", "run.out_dir=/proc/hpctrain-test", "--check", cwd=tmp_path)
    assert done.code == 2
    assert done.err.startswith("error: run.out_dir: /proc/hpctrain-test/debug is not writable")
    assert "(nearest existing folder: /proc)" in done.err and len(done.err.strip().splitlines()) == 1


def test_sbatch_failures_are_one_line_naming_the_command(tmp_path: Path) -> None:
    none = _submit(tmp_path, path=str(tmp_path / "empty"))
    assert none.code == 2
    assert none.err.strip() == (
        "error: sbatch (through submitit) failed: sbatch and srun not found on PATH; run `hpctrain submit` "
        "on a SLURM login node (or use --local, or --dry-run to see the script)"
    )
    refused = _bin(
        tmp_path,
        srun="exit 0",
        sbatch='echo "sbatch: error: Batch job submission failed: Invalid partition name specified" >&2; '
        "exit 1",
    )
    done = _submit(tmp_path, path=refused)
    assert done.code == 2
    assert done.err.strip() == (
        "error: sbatch (through submitit) failed: sbatch: error: Batch job submission failed: "
        "Invalid partition name specified"
    )
    garbled = _bin(tmp_path, srun="exit 0", sbatch="echo 'all good, probably'")
    done = _submit(tmp_path, path=garbled)
    assert done.code == 2 and len(done.err.strip().splitlines()) == 1
    assert done.err.startswith("error: sbatch (through submitit) failed: FailedSubmissionError: ")
    assert "all good, probably" in done.err


def test_login_node_verbs_never_import_torch(tmp_path: Path) -> None:
    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "a.parquet").write_bytes(b"x")
    code = (
        "import sys\n"
        "import hpctrain.commands.submit, hpctrain.commands.status, hpctrain.commands.sync\n"
        "from hpctrain.cli import main\n"
        "rc = main(['submit', '--check', 'model.type=muon_wgan', 'data.type=muons', "
        f"'data.paths=[{tmp_path / 'train'}]', 'run.out_dir={tmp_path / 'logs'}'])\n"
        "assert rc == 0, rc\n"
        "loaded = sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))\n"
        "assert not loaded, loaded\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=clean_env(), capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr


# ---- status: a state from evidence -------------------------------------------------------------------------


def _hop(n: int, start: float, end: float | None, first: int, last: int, reason: str | None) -> dict:
    return {
        "hop": n,
        "job_id": str(40 + n),
        "nodes": "c1",
        "start": start,
        "end": end,
        "first_update": first,
        "last_update": last,
        "exit_reason": reason,
        "train_seconds": 10.0,
    }


def _run_folder(tmp_path: Path, hops: list[dict], summary: dict | None, lock: dict | None = None) -> Path:
    run = tmp_path / "logs" / "r"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text("train:\n  total_updates: 100\n")
    if hops:
        (run / "chain.json").write_text(json.dumps(hops))
    if summary is not None:
        (run / "summary.json").write_text(json.dumps(summary))
    if lock is not None:
        (run / "run.lock").write_text(json.dumps(lock))
    return run


def _status(tmp_path: Path, run: Path, squeue: str = "") -> dict:
    path = _bin(tmp_path, squeue=squeue)  # squeue answers what the test says (nothing: not in the queue)
    done = hpctrain("status", str(run), "--json", cwd=tmp_path, env=clean_env(PATH=path))
    assert done.code == 0, done.err
    text = hpctrain("status", str(run), cwd=tmp_path, env=clean_env(PATH=path))
    info = json.loads(done.out)
    info["text"] = text.out
    return info


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_status_running_from_a_live_lock_holder(tmp_path: Path) -> None:
    import os
    import socket

    from hpctrain.fsutil import process_started

    now = time.time()
    taken = (process_started(os.getpid()) or now) + 1  # a holder takes its lock after it started
    lock = {"pid": os.getpid(), "host": socket.gethostname(), "job_id": None, "started": taken}
    lock["heartbeat"] = now - 600  # an old heartbeat, but the process is alive on this host
    run = _run_folder(tmp_path, [_hop(0, now - 900, None, 0, 30, None)], None, lock)
    info = _status(tmp_path, run)
    assert info["status"] == "running" and f"live process {os.getpid()}" in info["evidence"]
    assert "#1 job 40 on c1" in info["text"] and "-> running:" in info["text"]  # hops counted from 1
    # where training is now: metrics.jsonl's last record, not the last checkpoint's 30 (issue 31 item 5)
    records = [{"step": step, "time": now - 60 + step, "loss": 1.0} for step in (40, 50)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records) + '{"step": 5')
    info = _status(tmp_path, run)
    assert info["updates_done"] == 50 and "last logged: update 50 at " in info["text"]


def test_status_running_from_a_fresh_heartbeat_on_another_node(tmp_path: Path) -> None:
    now = time.time()
    lock = {"pid": 12345, "host": "another-node", "job_id": "41", "started": now - 300, "heartbeat": now - 20}
    run = _run_folder(tmp_path, [_hop(0, now - 300, None, 0, 30, None)], None, lock)
    info = _status(tmp_path, run)
    assert info["status"] == "running" and "heartbeat" in info["evidence"]


def test_status_running_from_squeue(tmp_path: Path) -> None:
    now = time.time()
    run = _run_folder(tmp_path, [_hop(0, now - 300, None, 0, 30, None)], None)
    info = _status(tmp_path, run, squeue='echo "RUNNING elapsed 5:00, left 55:00, c1"')
    assert info["status"] == "running" and info["evidence"] == "squeue: job 40 RUNNING"


def test_status_crashed_when_the_last_hop_never_closed_and_nobody_holds_the_lock(tmp_path: Path) -> None:
    import socket

    now = time.time()
    hops = [_hop(0, now - 900, now - 600, 0, 40, "time_budget"), _hop(1, now - 500, None, 40, 60, None)]
    stale = {"pid": _dead_pid(), "host": socket.gethostname(), "job_id": "41", "started": now - 500}
    stale["heartbeat"] = now - 400
    summary = {"status": "stopped", "reason": "time_budget", "step": 40, "total_updates": 100, "hops": 1}
    run = _run_folder(tmp_path, hops, summary, stale)
    info = _status(tmp_path, run)
    assert info["status"] == "crashed"
    assert "hop #2 never closed and no process holds run.lock" in info["evidence"]  # counted from 1
    assert info["text"].startswith(f"run {run}: crashed (resume with the same command")
    assert "-> killed:" in info["text"]


def test_status_stopped_resumable_finished_and_not_started(tmp_path: Path) -> None:
    now = time.time()
    hops = [_hop(0, now - 900, now - 600, 0, 40, "time_budget")]
    stopped = {"status": "stopped", "reason": "time_budget", "step": 40, "total_updates": 100, "hops": 1}
    info = _status(tmp_path / "s", _run_folder(tmp_path / "s", hops, stopped))
    assert info["status"] == "stopped" and "resumable" in info["evidence"]
    assert "stopped, resumable" in info["text"]

    hops = [_hop(0, now - 900, now - 600, 0, 100, "finished")]
    done = {"status": "finished", "reason": "finished", "step": 100, "total_updates": 100, "hops": 1}
    info = _status(tmp_path / "f", _run_folder(tmp_path / "f", hops, done))
    assert info["status"] == "finished" and info["remaining_hops"] == 0
    # words that say something (issue 31 item 5): not "finished (finished)", not "0:00:00 of wall time; none"
    assert "finished (summary.json: all updates done)" in info["text"]
    assert info["text"].rstrip().endswith("remaining: nothing (finished)")

    hops = [_hop(0, now - 900, now - 600, 0, 60, "early_stop")]
    early = {"status": "finished", "reason": "early_stop", "step": 60, "total_updates": 100, "hops": 1}
    info = _status(tmp_path / "e", _run_folder(tmp_path / "e", hops, early))
    assert info["status"] == "finished" and info["evidence"] == "summary.json: early stopping"

    info = _status(tmp_path / "n", _run_folder(tmp_path / "n", [], None))
    assert info["status"] == "not started"


def test_status_failed_on_a_nonfinite_loss_is_not_a_crash(tmp_path: Path) -> None:
    now = time.time()
    hops = [_hop(0, now - 900, now - 600, 0, 40, "nonfinite")]
    failed = {
        "status": "failed",
        "reason": "nonfinite",
        "step": 40,
        "nonfinite_update": 47,
        "total_updates": 100,
        "hops": 1,
    }
    info = _status(tmp_path, _run_folder(tmp_path, hops, failed))
    assert info["status"] == "failed" and info["evidence"] == "summary.json: failed (nonfinite at update 47)"
    assert "failed (fix the cause" in info["text"]


def _cli_raising(exc: str) -> subprocess.CompletedProcess:
    """`hpctrain status x` in a subprocess whose verb raises `exc` (what a closed pipe or a second Ctrl-C does)."""
    code = (
        "import sys, hpctrain.commands.status as verb\n"
        f"def boom(argv): raise {exc}\n"
        "verb.main = boom\n"
        "from hpctrain.cli import main\n"
        "sys.exit(main(['status', 'x']))\n"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=clean_env())


def test_a_closed_pipe_and_a_second_ctrl_c_end_without_a_traceback() -> None:
    piped = _cli_raising("BrokenPipeError(32, 'Broken pipe')")  # `hpctrain status RUN | head -1`
    assert (piped.returncode, piped.stderr) == (0, "")
    interrupted = _cli_raising("KeyboardInterrupt")
    assert interrupted.returncode == 130
    assert interrupted.stderr.startswith("error: interrupted (a second Ctrl-C)")
    assert len(interrupted.stderr.strip().splitlines()) == 1 and "Traceback" not in interrupted.stderr
