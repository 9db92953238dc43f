"""Real runs of the fields workload: early stopping agreed by two DDP ranks, and bit-exact resume."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from hpctrain.commands.train import run
from hpctrain.config.loading import ConfigRequest, load_config
from hpctrain.errors import EXIT_OK, EXIT_RESUMABLE
from hpctrain.runtime.env import ClusterEnv
from hpctrain.workloads.fields.task import FieldTask
from hpctrain.workloads.registry import config_model, fill_default_types
from tests.conftest import torchrun_train

TINY = """\
run: {name: f}
data: {type: fields, kind: gaussian, size: 16, n_train: 256, n_val: 32, n_test: 0, batch_size: 8}
model: {type: field_cnn, widths: [8, 16], groups: 4, head_hidden: 8, stem_stride: 1}
optim: {lr: 3.0e-3}
train: {total_updates: 24, eval_every: 6, device: cpu, threads: 1}
logging: {log_every: 1, progress: lines}
checkpoint: {best_metric: val_r2_omega_m, best_mode: max}
"""


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


@pytest.mark.integration
def test_early_stopping_is_agreed_by_both_ddp_ranks(tmp_path: Path):
    (tmp_path / "tiny.yaml").write_text(TINY)
    # lr = 0: the validation loss can never improve, so patience 1 stops at the second evaluation.
    proc = torchrun_train(
        "--config",
        "tiny.yaml",
        "run.out_dir=out",
        "optim.lr=0",
        "train.total_updates=500",
        "train.eval_every=2",
        "train.early_stopping.patience=1",
        "checkpoint.best_metric=val_loss",
        "checkpoint.best_mode=min",
        "train.threads=1",
        cwd=tmp_path,
    )
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err[-3000:]  # torchrun: every rank exited 0
    done = summary(tmp_path / "out" / "f")
    assert done["status"] == "finished" and done["reason"] == "early_stop"
    assert done["step"] == 4 < done["total_updates"] == 500
    best = json.loads((tmp_path / "out" / "f" / "checkpoints" / "best.json").read_text())
    assert best["step"] == 2  # the first evaluation stays the best


def _cfg(out: Path):
    (out / "tiny.yaml").write_text(TINY)
    request = ConfigRequest(str(out / "tiny.yaml"), None, [f"run.out_dir={out}"], None)
    return load_config(request, config_model(), prepare=fill_default_types)


def test_stopped_and_resumed_field_cnn_run_equals_an_uninterrupted_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    assert run(_cfg(tmp_path / "a"), ClusterEnv()) == EXIT_OK
    reference = summary(tmp_path / "a" / "f")
    assert reference["step"] == 24

    original = FieldTask.train_step
    calls = {"n": 0}

    def train_step(self, micro, ctx):  # a real SIGUSR1 while update 9 is computed (after the first eval)
        calls["n"] += 1
        if calls["n"] == 9:
            os.kill(os.getpid(), signal.SIGUSR1)
        return original(self, micro, ctx)

    with monkeypatch.context() as patch:
        patch.setattr(FieldTask, "train_step", train_step)
        assert run(_cfg(tmp_path / "b"), ClusterEnv()) == EXIT_RESUMABLE
    stopped = summary(tmp_path / "b" / "f")
    assert stopped["status"] == "stopped" and stopped["step"] == 9
    assert run(_cfg(tmp_path / "b"), ClusterEnv()) == EXIT_OK
    resumed = summary(tmp_path / "b" / "f")
    assert resumed["step"] == 24
    assert resumed["params_sha256"] == reference["params_sha256"]
    assert resumed["best"] == reference["best"]
