"""Loss spikes (train.on_spike), injected into the regression task's update: the rule, warn, skip_batch, and a
rewind to the last checkpoint with the LR scaled that stays bit-exact across a later stop."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

from hpctrain.commands.train import run
from hpctrain.config.loading import ConfigRequest, load_config
from hpctrain.config.schema import SpikeConfig
from hpctrain.errors import EXIT_OK
from hpctrain.runtime.env import ClusterEnv
from hpctrain.train.checkpoint import load_verified
from hpctrain.train.spikes import SpikeRule
from hpctrain.train.task import SupervisedTask
from hpctrain.workloads.registry import config_model, fill_default_types
from tests.faulthook.step_faults import faulty_step
from tests.train.test_resume import signal_at

ARGS = [
    "data.batch_size=32",
    "train.total_updates=60",
    "checkpoint.every=10",
    "train.spike.window=10",
    "train.spike.threshold=20",
]


def cfg_for(out: Path, *overrides: str):
    base = [
        "run.name=t",
        f"run.out_dir={out}",
        "train.eval_every=0",
        "logging.log_every=1",
        "train.threads=1",
    ]
    return load_config(
        ConfigRequest(None, None, [*base, *ARGS, *overrides], None),
        config_model(),
        prepare=fill_default_types,
    )


def latest(run_dir: Path) -> dict:
    return load_verified(run_dir / "checkpoints" / (run_dir / "checkpoints" / "latest").read_text().strip())


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def distance(a: dict, b: dict) -> float:
    return sum(float((a[k] - b[k]).norm()) for k in a)


def test_the_rule_judges_against_the_median_and_mad_of_a_full_window() -> None:
    rule = SpikeRule(SpikeConfig(window=5, threshold=3.0))
    for value in (1.0, 1.1, 0.9, 1.0, 1.05):
        assert rule.judge(value) is None  # not full yet: nothing judged
        rule.keep(value)
    assert rule.judge(1.2) is None  # MAD 0.05 (x1.4826): 1.2 is 2.7 of them above the median 1.0
    said = rule.judge(5.0)
    assert said is not None and said.startswith("loss 5 is 54.0 MADs above the median 1 of the last 5")
    assert rule.judge(float("nan")) is None  # the non-finite guard's
    flat = SpikeRule(SpikeConfig(window=5, threshold=3.0))
    for _ in range(5):
        flat.keep(2.0)
    assert flat.judge(2.05) is None and flat.judge(2.1) is not None  # MAD 0: 1% of the median is the scale


def test_warn_says_the_spike_and_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    assert run(cfg_for(tmp_path / "ref"), ClusterEnv()) == EXIT_OK
    monkeypatch.setattr(SupervisedTask, "train_step", faulty_step(spike_at=[25], spike_factor=1.0))
    with caplog.at_level(logging.WARNING, logger="hpctrain.train.spikes"):
        assert run(cfg_for(tmp_path / "warn", "train.on_spike=warn"), ClusterEnv()) == EXIT_OK
    assert not caplog.records  # a factor of 1: no spike, no word
    ref = latest(tmp_path / "ref" / "t")
    assert torch.equal(
        ref["modules"]["model"]["net.0.weight"],
        latest(tmp_path / "warn" / "t")["modules"]["model"]["net.0.weight"],
    )
    monkeypatch.setattr(SupervisedTask, "train_step", faulty_step(spike_at=[25]))
    with caplog.at_level(logging.WARNING, logger="hpctrain.train.spikes"):
        assert run(cfg_for(tmp_path / "spiked", "train.on_spike=warn"), ClusterEnv()) == EXIT_OK
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and said[0].startswith("update 25: loss ") and "MADs above the median" in said[0]
    assert summary(tmp_path / "spiked" / "t")["spikes"] == {"skipped": 0, "rewinds": 0, "lr_scale": 1.0}


def test_skip_batch_skips_the_spiked_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert run(cfg_for(tmp_path / "ref"), ClusterEnv()) == EXIT_OK
    monkeypatch.setattr(SupervisedTask, "train_step", faulty_step(spike_at=[25], spike_factor=1000.0))
    assert run(cfg_for(tmp_path / "off"), ClusterEnv()) == EXIT_OK
    monkeypatch.setattr(SupervisedTask, "train_step", faulty_step(spike_at=[25], spike_factor=1000.0))
    assert run(cfg_for(tmp_path / "skip", "train.on_spike=skip_batch"), ClusterEnv()) == EXIT_OK
    assert summary(tmp_path / "skip" / "t")["spikes"]["skipped"] == 1
    ref, off, skip = (latest(tmp_path / name / "t")["modules"]["model"] for name in ("ref", "off", "skip"))
    assert distance(skip, ref) < distance(off, ref) / 10  # one update of 60 missing, not a jump taken


def test_rewind_goes_back_with_the_lr_scaled_and_stays_bit_exact_across_a_stop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The spike at update 25 is undone: back to the checkpoint of update 20, the LR halved from there on. A run
    stopped after the rewind and resumed ends with the very same weights."""
    monkeypatch.setattr(SupervisedTask, "train_step", faulty_step(spike_at=[25]))
    assert run(cfg_for(tmp_path / "a", "train.on_spike=rewind"), ClusterEnv()) == EXIT_OK
    done = summary(tmp_path / "a" / "t")
    assert done["spikes"] == {"skipped": 0, "rewinds": 1, "lr_scale": 0.5} and done["step"] == 60
    state = latest(tmp_path / "a" / "t")
    assert state["spikes"]["lr_scale"] == 0.5 and state["spikes"]["target"] == 20
    assert state["optimizers"]["main"]["param_groups"][0]["lr"] == pytest.approx(
        0.5 * load_lr(tmp_path / "a")
    )

    with monkeypatch.context() as patch:  # the same spike; a stop signal 15 updates after it
        patch.setattr(SupervisedTask, "train_step", faulty_step(spike_at=[25]))
        signal_at(patch, 40)
        assert run(cfg_for(tmp_path / "b", "train.on_spike=rewind"), ClusterEnv()) == 75
    stopped = latest(tmp_path / "b" / "t")
    assert stopped["spikes"]["rewinds"] == 1 and stopped["counters"]["step"] > 25
    monkeypatch.setattr(SupervisedTask, "train_step", faulty_step())
    assert run(cfg_for(tmp_path / "b", "train.on_spike=rewind"), ClusterEnv()) == EXIT_OK
    assert summary(tmp_path / "b" / "t")["params_sha256"] == done["params_sha256"]


def load_lr(out: Path) -> float:
    """The configured (effective) LR of the run, from its config.yaml."""
    import yaml

    return float(yaml.safe_load((out / "t" / "config.yaml").read_text())["optim"]["lr"])


def test_a_spike_that_comes_back_after_max_rewinds_stops_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(SupervisedTask, "train_step", faulty_step(spike_at=list(range(25, 500))))
    assert run(cfg_for(tmp_path, "train.on_spike=rewind", "train.spike.max_rewinds=2"), ClusterEnv()) == 1
    done = summary(tmp_path / "t")
    assert done["status"] == "failed" and done["step"] == 20 and done["spikes"]["rewinds"] == 3
    err = capsys.readouterr().err
    assert "the loss spiked again at update 21 after 2 rewinds to update 20 (train.spike.max_rewinds=2" in err
    assert latest(tmp_path / "t")["counters"]["step"] == 20  # nothing saved after the spike
