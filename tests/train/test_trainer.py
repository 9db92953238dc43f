"""The trainer's behaviour: accumulation, optimizers, time budget, early stopping, fine-tuning, outputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from hpctrain.commands.train import run
from hpctrain.config.loading import ConfigRequest, load_config
from hpctrain.errors import EXIT_OK, EXIT_RESUMABLE, UserError
from hpctrain.runtime.budget import StopSignals, TimeBudget
from hpctrain.runtime.env import ClusterEnv
from hpctrain.train.checkpoint import load_verified
from hpctrain.workloads.registry import config_model, fill_default_types
from tests.conftest import hpctrain, read_jsonl


def cfg_for(out: Path, *overrides: str):
    base = ["run.name=t", f"run.out_dir={out}", "train.eval_every=0", "logging.log_every=1"]
    return load_config(
        ConfigRequest(None, None, [*base, *overrides], None), config_model(), prepare=fill_default_types
    )


def summary(out: Path) -> dict:
    return json.loads((out / "t" / "summary.json").read_text())


def weights(out: Path) -> dict[str, torch.Tensor]:
    state = load_verified(
        out / "t" / "checkpoints" / (out / "t" / "checkpoints" / "latest").read_text().strip()
    )
    return state["modules"]["model"]


def test_gradient_accumulation_equals_the_big_batch(tmp_path: Path):
    # Two accumulated batches of 16 are the same 32 samples as one batch of 32 in the global order.
    assert run(cfg_for(tmp_path / "a", "data.batch_size=32", "train.total_updates=20"), ClusterEnv()) == 0
    assert (
        run(
            cfg_for(
                tmp_path / "b", "data.batch_size=16", "train.grad_accum_steps=2", "train.total_updates=20"
            ),
            ClusterEnv(),
        )
        == 0
    )
    a, b = weights(tmp_path / "a"), weights(tmp_path / "b")
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("optimizer", ["sgd", "adam", "adamw"])
def test_optimizers_and_clipping_learn(tmp_path: Path, optimizer: str):
    lr = "0.05" if optimizer == "sgd" else "0.003"
    cfg = cfg_for(
        tmp_path,
        f"optim.name={optimizer}",
        f"optim.lr={lr}",
        "optim.momentum=0",
        "optim.grad_clip_norm=1.0",
        "train.total_updates=150",
    )
    assert run(cfg, ClusterEnv()) == EXIT_OK
    records = [r for r in read_jsonl(tmp_path / "t" / "metrics.jsonl") if "loss" in r]
    first = sum(r["loss"] for r in records[:10]) / 10
    last = sum(r["loss"] for r in records[-10:]) / 10
    assert last < 0.6 * first
    assert all("grad_norm" in r and "lr" in r for r in records)


def test_momentum_zero_is_honoured(tmp_path: Path):
    from hpctrain.train.trainer import Trainer
    from hpctrain.workloads.regression.task import RegressionTask

    cfg = cfg_for(tmp_path, "optim.name=sgd", "optim.momentum=0")
    trainer = Trainer(
        cfg,
        RegressionTask(cfg, ClusterEnv()),
        ClusterEnv(),
        tmp_path / "t",
        TimeBudget(cfg.budget, ClusterEnv(), StopSignals()),
    )
    trainer.build()
    assert trainer.optimizers["main"].param_groups[0]["momentum"] == 0.0
    trainer.close()


def test_time_budget_stops_before_the_deadline_then_continues(tmp_path: Path):
    # the limit counts from the budget's start, before the build: 20 s with an 8-s margin leave a loaded machine's
    # build, first update and save room before the deadline (4 s left a loaded machine none)
    slow = [
        "model.hidden=[512,512,512]",
        "data.batch_size=256",
        "train.total_updates=100000",
        "budget.time_limit=00:00:20",
        "budget.margin_seconds=8",
    ]
    cfg = cfg_for(tmp_path, *slow)
    assert run(cfg, ClusterEnv()) == EXIT_RESUMABLE
    first = summary(tmp_path)
    assert first["status"] == "stopped" and first["reason"] == "time_budget"
    assert 0 < first["step"] < 100000
    hop = json.loads((tmp_path / "t" / "chain.json").read_text())[0]
    assert hop["end"] <= hop["deadline"]  # stopped and saved before the deadline
    # A second hop continues from the saved step (its timings come from the checkpoint).
    assert run(cfg_for(tmp_path, *slow), ClusterEnv()) == EXIT_RESUMABLE
    second = summary(tmp_path)
    assert second["step"] > first["step"]
    hops = json.loads((tmp_path / "t" / "chain.json").read_text())
    assert [h["first_update"] for h in hops] == [0, first["step"]]
    assert second["hops"] == 2 and 0 < second["run_goodput"] <= 1


def test_early_stopping_finishes_with_exit_0(tmp_path: Path):
    cfg = cfg_for(
        tmp_path,
        "optim.lr=0",
        "train.eval_every=10",
        "train.total_updates=1000",
        "train.early_stopping.patience=2",
    )
    assert run(cfg, ClusterEnv()) == EXIT_OK
    done = summary(tmp_path)
    assert done["status"] == "finished" and done["reason"] == "early_stop"
    assert done["step"] == 30  # first eval sets the best, two more without improvement
    assert (tmp_path / "t" / "checkpoints" / "best.pt").exists()
    # Starting it again says so and does not train.
    assert (
        run(
            cfg_for(
                tmp_path,
                "optim.lr=0",
                "train.eval_every=10",
                "train.total_updates=1000",
                "train.early_stopping.patience=2",
            ),
            ClusterEnv(),
        )
        == EXIT_OK
    )


def test_finished_run_again_exits_0_without_training(tmp_path: Path):
    done = hpctrain("train", "run.out_dir=out", "train.total_updates=30", cwd=tmp_path)
    assert done.code == 0, done.err
    digest = json.loads((tmp_path / "out" / "debug" / "summary.json").read_text())["params_sha256"]
    assert done.out.strip().splitlines()[-1].endswith(f"params_sha256={digest}")
    again = hpctrain("train", "run.out_dir=out", "train.total_updates=30", cwd=tmp_path)
    assert again.code == 0 and "already finished" in again.out
    assert len(read_jsonl(tmp_path / "out" / "debug" / "metrics.jsonl")) > 0


def test_finetune_takes_weights_only(tmp_path: Path):
    assert run(cfg_for(tmp_path / "pre", "train.total_updates=40"), ClusterEnv()) == EXIT_OK
    source = tmp_path / "pre" / "t" / "checkpoints" / "step_00000040.pt"
    cfg = cfg_for(
        tmp_path / "ft",
        f"checkpoint.resume={source}",
        "checkpoint.restart=false",
        "train.total_updates=5",
        "optim.lr=0",
    )
    assert run(cfg, ClusterEnv()) == EXIT_OK
    assert summary(tmp_path / "ft")["step"] == 5  # counters start again
    pre, ft = weights(tmp_path / "pre"), weights(tmp_path / "ft")
    for key in pre:  # lr 0: the fine-tuned weights are the loaded ones
        torch.testing.assert_close(pre[key], ft[key])
    full = cfg_for(tmp_path / "full", f"checkpoint.resume={source}", "train.total_updates=45")
    assert run(full, ClusterEnv()) == EXIT_OK
    assert read_jsonl(tmp_path / "full" / "t" / "metrics.jsonl")[0]["step"] == 41


def test_epochs_are_converted_to_updates(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    cfg = cfg_for(tmp_path, "train.epochs=0.5", "data.n_train=1024", "data.batch_size=32")
    assert run(cfg, ClusterEnv()) == EXIT_OK
    assert summary(tmp_path)["total_updates"] == 16
    assert "= 16 updates" in capsys.readouterr().out


def test_bf16_autocast_on_cpu_and_fp16_refused(tmp_path: Path):
    assert run(cfg_for(tmp_path / "bf", "train.precision=bf16", "train.total_updates=10"), ClusterEnv()) == 0
    assert summary(tmp_path / "bf")["step"] == 10
    with pytest.raises(UserError, match="fp16"):
        run(cfg_for(tmp_path / "fp", "train.precision=fp16"), ClusterEnv())


def test_compile_path_runs_on_cpu(tmp_path: Path):
    cfg = cfg_for(tmp_path, "train.compile=true", "train.total_updates=5", "model.hidden=[8]")
    assert run(cfg, ClusterEnv()) == EXIT_OK
    state = weights(tmp_path)
    assert not any(k.startswith("_orig_mod") for k in state)  # saved without wrapper prefixes


def test_outputs_of_the_default_job(tmp_path: Path):
    done = hpctrain("train", "run.out_dir=out", cwd=tmp_path)
    assert done.code == 0, done.err
    run_dir = tmp_path / "out" / "debug"
    assert (run_dir / "config.yaml").read_text().startswith("run:")
    records = read_jsonl(run_dir / "metrics.jsonl")
    train_records = [r for r in records if "loss" in r]
    assert [r["step"] for r in train_records] == list(range(20, 201, 20))
    assert {"loss", "lr", "updates_per_s", "samples_per_s", "data_share"} <= set(train_records[0])
    result = json.loads((run_dir / "summary.json").read_text())
    assert result["status"] == "finished" and result["step"] == 200
    assert len(result["params_sha256"]) == 64 and result["wall_seconds"] > 0
    # Not a terminal: plain progress lines every log_every updates.
    lines = [line for line in done.out.splitlines() if line.startswith("update ")]
    assert len(lines) == 10 and "loss" in lines[0] and "updates/s" in lines[0] and "data" in lines[0]
    assert "global batch 32" in done.out


def test_eval_every_without_validation_data_is_ignored_with_a_warning(tmp_path: Path, caplog):
    cfg = cfg_for(tmp_path, "data.n_val=0", "train.eval_every=5", "train.total_updates=12")
    assert run(cfg, ClusterEnv()) == EXIT_OK
    assert "eval_every=5 is ignored" in caplog.text
