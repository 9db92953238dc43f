"""`hpctrain cancel` without SLURM (the SLURM chain is tests/integration/test_slurm_cancel.py): a training under
`--until-done` saves, stops and is not restarted; status says cancelled, resumable; the next start continues the
run and removes the mark. The mark's decisions (chain, a start it names) and the verb's mistakes, one line each."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpctrain.cli import main
from hpctrain.commands.train import run
from hpctrain.config.loading import ConfigRequest
from hpctrain.errors import EXIT_RESUMABLE
from hpctrain.launch.chain import cancelled
from hpctrain.runtime.env import ClusterEnv
from hpctrain.track.cancel import MARK, read_mark, write_mark
from hpctrain.workloads.registry import resolve
from tests.conftest import clean_env, hpctrain, save_pause


def test_a_supervised_training_cancelled_saves_stops_and_continues_when_started_again(tmp_path: Path) -> None:
    run_dir = tmp_path / "logs" / "c"
    args = ["train", "run.name=c", "train.total_updates=60", "checkpoint.every=5", "logging.progress=lines"]
    child = subprocess.Popen(
        [sys.executable, "-m", "hpctrain", *args, "--until-done"],
        cwd=tmp_path,
        env=clean_env(**save_pause(2.0)),  # 12 saves x 2 s: time for a loaded machine's `cancel` mid-run
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.time() + 120
        while not (run_dir / "checkpoints" / "latest").exists() and time.time() < deadline:
            time.sleep(0.1)
        said = hpctrain("cancel", str(run_dir), cwd=tmp_path)
        assert said.code == 0, said.err
        assert "asked to save and stop (USR1)" in said.out and "cancelled, resumable" in said.out
        _, err = child.communicate(timeout=120)
    finally:
        child.kill()
    assert child.returncode == EXIT_RESUMABLE, err
    assert "cancelled by" in err and "supervision ends" in err and "attempt 2" not in err
    hops = json.loads((run_dir / "chain.json").read_text())
    assert len(hops) == 1 and hops[0]["exit_reason"] == "signal" and 0 < hops[0]["last_update"] < 60
    status = hpctrain("status", str(run_dir), cwd=tmp_path)
    assert status.out.startswith(f"run {run_dir}: cancelled, resumable"), status.out
    again = hpctrain(*args, cwd=tmp_path)
    assert again.code == 0, again.err
    assert "continuing the run that was cancelled by" in again.out and not (run_dir / MARK).exists()
    assert json.loads((run_dir / "chain.json").read_text())[1]["first_update"] == hops[0]["last_update"]


def test_a_start_the_mark_names_trains_nothing_and_a_successor_of_a_named_job_stops(tmp_path: Path) -> None:
    cfg = resolve(ConfigRequest(overrides=[f"run.out_dir={tmp_path}", "run.name=m"]))[0]
    cfg.run.dir.mkdir(parents=True)
    mark = write_mark(cfg.run.dir, ["12", "40_3"], [])
    assert run(cfg, ClusterEnv(job_id="12")) == EXIT_RESUMABLE
    assert not (cfg.run.dir / "chain.json").exists() and read_mark(cfg.run.dir) == mark
    stop = cancelled(mark, "13", "12")  # queued (afterany) by a cancelled job
    assert stop is not None and "cancelled by" in stop.reason and "resumable" in stop.reason
    assert cancelled(mark, "40_3", None) is not None and cancelled(mark, "13", "11") is None
    assert cancelled(None, "12", None) is None


def test_cancel_mistakes_are_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty").mkdir()
    for args, said in (
        ([], "name the run folder"),
        ([str(tmp_path / "nowhere")], "no such folder"),
        ([str(tmp_path / "empty")], "is not a run folder"),
        (["--job", "99999"], "--job 99999"),
    ):
        assert main(["cancel", *args]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and said in err, err


def test_cancel_of_a_run_with_nothing_running_marks_it_and_never_imports_torch(tmp_path: Path) -> None:
    run_dir = tmp_path / "logs" / "r"
    run_dir.mkdir(parents=True)
    (run_dir / "summary.json").write_text('{"status": "stopped", "reason": "time_budget", "step": 5}')
    code = "import sys; from hpctrain.cli import main; rc = main(['cancel', sys.argv[1]]); "
    code += "assert 'torch' not in sys.modules, 'cancel imported torch'; sys.exit(rc)"
    done = subprocess.run(
        [sys.executable, "-c", code, str(run_dir)], env=clean_env(), capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert "nothing was running or queued" in done.stdout and read_mark(run_dir) is not None
