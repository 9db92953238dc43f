"""The run life cycle (hpctrain.train.entry): one place, errors never masked, config.yaml only once started."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest

from hpctrain.config.loading import ConfigRequest, load_config
from hpctrain.errors import UserError
from hpctrain.runtime.budget import StopSignals, TimeBudget
from hpctrain.runtime.env import ClusterEnv
from hpctrain.train import entry
from hpctrain.train.trainer import Trainer
from hpctrain.workloads.registry import config_model, fill_default_types, make_task, resolve, task_factory
from tests.conftest import clean_env, hpctrain


def cfg_for(out: Path, *overrides: str):
    base = ["run.name=t", f"run.out_dir={out}", "train.total_updates=4", "logging.log_every=2"]
    return load_config(
        ConfigRequest(None, None, [*base, *overrides], None), config_model(), prepare=fill_default_types
    )


def test_a_failed_resume_is_one_line_and_leaves_config_yaml_alone(tmp_path: Path) -> None:
    common = [f"run.out_dir={tmp_path / 'logs'}", "run.name=r", "train.total_updates=6", "model.hidden=[8]"]
    first = hpctrain("train", *common, cwd=tmp_path)
    assert first.code == 0, first.err[-2000:]
    written = (tmp_path / "logs" / "r" / "config.yaml").read_text()
    # The same run folder with another architecture: its checkpoint cannot be loaded.
    done = hpctrain("train", *common[:-1], "model.hidden=[4]", "train.total_updates=12", cwd=tmp_path)
    assert done.code == 2, done.err[-2000:]
    last = done.err.strip().splitlines()[-1]
    # Refused before any weight is loaded: the identity check names the key that differs.
    assert last.startswith("error: ") and "model.hidden [8] -> [4]" in last, last
    assert "Traceback" not in done.err
    assert (tmp_path / "logs" / "r" / "config.yaml").read_text() == written


def test_a_failure_while_building_shows_its_own_cause(tmp_path: Path) -> None:
    """A failure inside the trainer's build (a corrupt input file, found while indexing): its own message
    last (one line, exit 2: a bad file is the user's to fix), not an AttributeError from closing a half-built
    trainer; no config.yaml for a run that never started."""
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "part-00000.parquet").write_bytes(b"not a parquet file")
    done = hpctrain(
        "train",
        "model.type=muon_wgan",
        "data.type=muons",
        f"data.paths=[{bad}]",
        f"run.out_dir={tmp_path / 'logs'}",
        "run.name=b",
        cwd=tmp_path,
    )
    assert done.code == 2, done.err[-2000:]
    assert "AttributeError" not in done.err and "keeper" not in done.err and "Traceback" not in done.err
    assert "part-00000.parquet" in done.err.strip().splitlines()[-1]
    assert not (tmp_path / "logs" / "b" / "config.yaml").exists()


def test_missing_inputs_are_one_line_before_any_work(tmp_path: Path) -> None:
    done = hpctrain(
        "train",
        "model.type=muon_wgan",
        "data.type=muons",
        f"data.paths=[{tmp_path / 'nope' / 'train'}]",
        f"run.out_dir={tmp_path / 'logs'}",
        cwd=tmp_path,
    )
    assert done.code == 2
    assert done.err.strip() == (
        f"error: data.paths: {tmp_path / 'nope' / 'train'}: no such file or folder "
        f"(nearest existing folder: {tmp_path}); if the data lives on a shared or scratch volume, check that it "
        "is mounted on this node"
    )
    assert not (tmp_path / "logs").exists()


PROBE = "import sys\nfrom hpctrain.cli import main\nprint(main(sys.argv[1:]), 'torch' in sys.modules)"


@pytest.mark.parametrize(
    ("override", "said"),
    [
        (
            "checkpoint.resume={tmp}/gone/step_00000010.pt",
            "error: checkpoint.resume={tmp}/gone/step_00000010.pt: ",
        ),
        ("data.type=muons data.paths=[{tmp}/nope]", "error: data.paths: {tmp}/nope: no such file or folder"),
    ],
    ids=["resume", "data"],
)
def test_a_run_refused_before_the_build_ends_without_importing_torch(
    tmp_path: Path, override: str, said: str
) -> None:
    """A mistake the checks find before the trainer is built costs a second, not torch's import (seconds; a
    minute on a busy login node): the closing steps load nothing the run never used."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE, "train", *override.format(tmp=tmp_path).split(), f"run.out_dir={tmp_path / 'logs'}"],
        cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.stdout.split() == ["2", "False"], (done.stdout, done.stderr[-2000:])
    assert done.stderr.count("\n") == 1 and done.stderr.startswith(said.format(tmp=tmp_path)), done.stderr
    assert not (tmp_path / "logs").exists()


def test_an_unwritable_run_folder_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    done = hpctrain("train", f"run.out_dir={tmp_path / 'file' / 'logs'}", cwd=tmp_path)
    assert done.code == 2
    assert done.err.strip().startswith("error: run.out_dir: ") and "is a file, not a folder" in done.err
    assert len(done.err.strip().splitlines()) == 1


def test_closing_errors_never_hide_the_root_cause(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken_build(self: Trainer) -> None:
        self.raw_modules = {}
        raise RuntimeError("the root cause")

    def broken_close(self: Trainer) -> None:
        raise OSError("closing failed too")

    monkeypatch.setattr(Trainer, "build", broken_build)
    with pytest.raises(RuntimeError, match="the root cause"):
        entry.run(cfg_for(tmp_path), ClusterEnv(), make_task)
    monkeypatch.setattr(Trainer, "close", broken_close)
    with caplog.at_level(logging.ERROR), pytest.raises(RuntimeError, match="the root cause"):
        entry.run(cfg_for(tmp_path), ClusterEnv(), make_task)
    assert "closing the trainer failed as well: OSError: closing failed too" in caplog.text
    assert not (tmp_path / "t" / "config.yaml").exists()


def test_a_closing_error_after_a_clean_run_is_raised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    original = Trainer.close

    def broken_close(self: Trainer) -> None:
        original(self)
        raise OSError("disk gone at close")

    monkeypatch.setattr(Trainer, "close", broken_close)
    with pytest.raises(OSError, match="disk gone at close"):
        entry.run(cfg_for(tmp_path), ClusterEnv(), make_task)
    assert (tmp_path / "t" / "summary.json").exists()


def test_a_half_built_trainer_closes_cleanly(tmp_path: Path) -> None:
    cfg = cfg_for(tmp_path)
    env = ClusterEnv()
    signals = StopSignals()
    trainer = Trainer(
        cfg, task_factory(cfg.model.type)(cfg, env), env, tmp_path / "t", TimeBudget(cfg.budget, env, signals)
    )
    trainer.close()  # never built: nothing to close, and no AttributeError


def test_the_submitit_job_runs_the_same_life_cycle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hpctrain.launch import submitit_launcher

    seen = []

    def fake_run(cfg, env, factory, naming=None, config_file=None) -> int:
        seen.append((cfg.run.name, factory, naming))
        return 0

    monkeypatch.setattr(entry, "run", fake_run)
    request = ConfigRequest(None, None, [f"run.out_dir={tmp_path}", "run.name=sj"], None)
    assert submitit_launcher.TrainJob(request, resolve, make_task)() == 0
    assert seen == [("sj", make_task, None)]  # the registry's task factory, handed over by `hpctrain submit`
    automatic = ConfigRequest(None, None, [f"run.out_dir={tmp_path}", "optim.lr=0.01"], None)
    assert submitit_launcher.TrainJob(automatic, resolve, make_task)() == 0
    assert seen[1] == ("debug-lr0.01", make_task, "automatic run.name: debug + optim.lr=0.01")

    def mistake(cfg, env, factory, naming=None, config_file=None) -> int:
        raise UserError("data.paths: /x: no such file or folder")

    monkeypatch.setattr(entry, "run", mistake)
    with pytest.raises(submitit_launcher.JobInputError, match=r"^error: data.paths: /x: no such file"):
        submitit_launcher.TrainJob(request, resolve, make_task)()


def test_the_launcher_imports_no_command_and_no_workload() -> None:
    import subprocess

    code = (
        "import sys, hpctrain.launch.submitit_launcher as l, inspect; "
        "src = inspect.getsource(l); "
        "assert 'hpctrain.commands' not in src and 'hpctrain.workloads' not in src; "
        "assert not [m for m in sys.modules if m.startswith(('hpctrain.commands', 'hpctrain.workloads'))]; "
        "print('ok')"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout.strip() == "ok", done.stderr
