"""`hpctrain submit --dry-run` and `hpctrain status` without a cluster, and without torch."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import clean_env, hpctrain


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
    assert info["remaining_hops"] == 2  # 40 updates left at 30 per hop
    text = hpctrain("status", str(run), cwd=tmp_path)
    assert text.code == 0
    assert "updates 60 of 100 (60.0%)" in text.out and "#1 job 7 on c1" in text.out
    assert "running (or killed)" in text.out and "step_00000060.pt (update 60" in text.out
    assert hpctrain("status", str(tmp_path / "nope"), cwd=tmp_path).code == 2
