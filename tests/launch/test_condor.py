"""HTCondor's self-checkpointing (hpc/condor/, docs/condor.md), tested as far as it runs without a pool: the submit
description parsed by HTCondor's own parser (the htcondor2 bindings: no schedd needed), its keys, the files it
names, and its executable run as HTCondor runs it (in a scratch folder with the config transferred in): an
eviction's TERM saves and exits 85, the next execution continues and finishes with 0. Not tested here (no pool):
condor_submit itself, the transfer of the run folder back to the access point and into the next slot, matching."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpctrain.config.loading import ConfigRequest
from hpctrain.config.messages import error_line
from hpctrain.errors import UserError
from hpctrain.workloads.registry import resolve
from tests.conftest import ROOT, clean_env, save_pause

htcondor2 = pytest.importorskip("htcondor2")

SUBMIT = ROOT / "hpc" / "condor" / "train.sub"
# The submit commands of the HTCondor manual (condor_submit) that the description may use, and its own macros.
COMMANDS = {
    "executable", "arguments", "transfer_executable", "transfer_input_files", "checkpoint_exit_code",
    "transfer_checkpoint_files", "transfer_output_files", "should_transfer_files", "when_to_transfer_output",
    "request_gpus", "request_cpus", "request_memory", "request_disk", "log", "output", "error",
}  # fmt: skip
MACROS = {"config", "run", "time_limit", "extra"}


def _description() -> object:
    return htcondor2.Submit(SUBMIT.read_text())


def test_the_submit_description_parses_and_names_files_that_exist() -> None:
    sub = _description()
    assert set(sub.keys()) <= COMMANDS | MACROS, set(sub.keys()) - COMMANDS - MACROS
    assert sub["checkpoint_exit_code"] == "85"
    assert sub["when_to_transfer_output"] == "ON_EXIT" and sub["should_transfer_files"] == "YES"
    # the run folder hpctrain writes (run.out_dir=runs) is the checkpoint and the output
    assert sub.expand("transfer_checkpoint_files") == sub.expand("transfer_output_files") == "runs"
    executable = ROOT / sub.expand("executable")
    assert executable.is_file() and os.access(executable, os.X_OK)
    assert (ROOT / sub.expand("transfer_input_files")).is_file()  # the default config
    # the config arrives under its own name, which is what the executable gets
    assert sub.expand("arguments").strip('"').split()[:3] == ["debug.yaml", "debug", "1:00:00"]
    script = executable.read_text()
    assert "train.requeue_exit_code=85" in script and "run.out_dir=runs" in script
    with pytest.raises(ValueError):  # the parser does refuse a line that is no submit command
        htcondor2.Submit(SUBMIT.read_text().replace("\nqueue", "\nthis is no command\nqueue"))


def test_the_executable_saves_with_85_on_eviction_and_the_next_execution_finishes(tmp_path: Path) -> None:
    sandbox = tmp_path / "scratch"
    sandbox.mkdir()
    shutil.copy(ROOT / "configs" / "debug.yaml", sandbox)  # transfer_input_files = $(config)
    venv = str(Path(sys.executable).parent)
    # the first execution's 11 saves after the first pause 1 s each: the eviction comes mid-run however loaded
    env = clean_env(PATH=f"{venv}{os.pathsep}{os.environ['PATH']}", **save_pause(1.0, hops=1))
    argv = ["bash", str(ROOT / "hpc/condor/train.sh"), "debug.yaml", "r", "30:00", "train.total_updates=60",
            "checkpoint.every=5", "logging.progress=lines"]  # fmt: skip
    first = subprocess.Popen(
        argv, cwd=sandbox, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    latest = sandbox / "runs" / "r" / "checkpoints" / "latest"
    deadline = time.time() + 120
    while not latest.exists() and first.poll() is None and time.time() < deadline:
        time.sleep(0.1)
    first.send_signal(signal.SIGTERM)  # HTCondor's eviction (kill_sig) to the executable
    _, err = first.communicate(timeout=120)
    assert first.returncode == 85, err
    assert json.loads((sandbox / "runs" / "r" / "summary.json").read_text())["status"] == "stopped"
    second = subprocess.run(argv, cwd=sandbox, env=env, capture_output=True, text=True, timeout=180)
    assert second.returncode == 0, second.stderr
    hops = json.loads((sandbox / "runs" / "r" / "chain.json").read_text())
    assert [h["exit_reason"] for h in hops] == ["signal", "finished"] and hops[1]["first_update"] > 0


def test_the_executable_without_its_arguments_is_one_line_exit_2(tmp_path: Path) -> None:
    done = subprocess.run(
        ["bash", str(ROOT / "hpc/condor/train.sh")], cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_a_requeue_exit_code_that_means_something_else_is_refused_in_one_line() -> None:
    assert resolve(ConfigRequest(overrides=["train.requeue_exit_code=85"]))[0].train.requeue_exit_code == 85
    for code in ("0", "2", "128", "abc"):
        with pytest.raises(UserError) as refused:
            resolve(ConfigRequest(overrides=[f"train.requeue_exit_code={code}"]))
        line = error_line(refused.value)
        assert line.startswith("train.requeue_exit_code=") and "\n" not in line, line
