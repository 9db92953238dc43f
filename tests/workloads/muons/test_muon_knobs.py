"""Muon-model knobs: gp_sample_fraction, the adaptive critic (bounded, logged, checkpointed), device mps."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hpctrain.workloads.muons.tasks.wgan import gp_pair_cap
from tests.conftest import hpctrain, read_jsonl
from tests.workloads.muons.conftest import write_set
from tests.workloads.muons.test_model_run import wgan_overrides


def test_gp_pair_cap() -> None:
    assert gp_pair_cap(0, 1.0, 1000) == 0  # all pairs
    assert gp_pair_cap(0, 0.25, 1000) == 250
    assert gp_pair_cap(100, 0.25, 1000) == 100  # the smaller cap wins
    assert gp_pair_cap(500, 0.25, 1000) == 250
    assert gp_pair_cap(0, 0.01, 10) == 1  # never no pair at all


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("muondata")
    write_set(root / "train", files=1, events=64, row_group=32, seed=3)
    write_set(root / "val", files=1, events=32, row_group=32, seed=4)
    return root


def test_adaptive_critic_is_bounded_logged_and_checkpointed(data: Path, tmp_path: Path) -> None:
    args = [
        *wgan_overrides(data, tmp_path / "out"),
        "train.total_updates=4",
        "logging.gpu_every_seconds=0",
        "model.gp_sample_fraction=0.5",
        # an estimate always "below" lag_below: the critic lags on every update, steps grow up to max_steps
        "model.adaptive_critic={min_steps: 1, max_steps: 3, lag_below: 1e9, dominate_above: 2e9}",
    ]
    done = hpctrain("train", *args, "checkpoint.every=2", "train.total_updates=2", cwd=tmp_path)
    assert done.code == 0, done.err
    assert "adaptive critic: 1 -> 2 critic steps per update" in done.out + done.err
    done = hpctrain("train", *args, cwd=tmp_path)  # continues at update 2 with 3 steps, and stays there
    assert done.code == 0, done.err
    steps = {
        r["step"]: r["critic_steps"]
        for r in read_jsonl(tmp_path / "out" / "t" / "metrics.jsonl")
        if "loss" in r
    }
    assert steps == {1: 1.0, 2: 2.0, 3: 3.0, 4: 3.0}
    # a critic that dominates loses steps down to min_steps
    dominated = [*args[:-1], "run.name=dom", "model.critic_steps=2"]
    dominated.append(
        "model.adaptive_critic={min_steps: 1, max_steps: 3, lag_below: -2e9, dominate_above: -1e9}"
    )
    done = hpctrain("train", *dominated, cwd=tmp_path)
    assert done.code == 0, done.err
    steps = {
        r["step"]: r["critic_steps"]
        for r in read_jsonl(tmp_path / "out" / "dom" / "metrics.jsonl")
        if "loss" in r
    }
    assert steps == {1: 2.0, 2: 1.0, 3: 1.0, 4: 1.0}
    bad = hpctrain("train", *args, "run.name=bad", "model.adaptive_critic.min_steps=5", cwd=tmp_path)
    assert bad.code == 2 and "min_steps <= max_steps" in bad.err and len(bad.err.strip().splitlines()) == 1
    # the model verbs take --device mps too, or refuse it in one line
    if not torch.backends.mps.is_available():
        refused = hpctrain("evaluate", str(tmp_path / "out" / "t"), "--device", "mps", cwd=tmp_path)
        assert refused.code == 2 and len(refused.err.strip().splitlines()) == 1, refused.err
        assert "--device mps: this machine (or this torch build) has no mps device" in refused.err


@pytest.mark.skipif(torch.backends.mps.is_available(), reason="this machine has an MPS device")
def test_device_mps_without_mps_is_one_line(tmp_path: Path) -> None:
    done = hpctrain("train", "train.device=mps", "train.total_updates=1", cwd=tmp_path)
    assert done.code == 2 and len(done.err.strip().splitlines()) == 1, done.err
    assert "train.device='mps' but this torch has no usable MPS" in done.err
