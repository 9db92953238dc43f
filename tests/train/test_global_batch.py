"""data.global_batch_size: the alternative to the per-GPU batch, split over the ranks at start."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpctrain.errors import UserError
from hpctrain.train.setup import per_gpu_batch
from tests.conftest import clean_env, hpctrain

QUICK = ("train.total_updates=2", "train.eval_every=0", "logging.gpu_every_seconds=0")


def test_split_over_ranks_and_accumulation() -> None:
    assert per_gpu_batch(256, 8, 1) == 32
    assert per_gpu_batch(256, 4, 2) == 32
    with pytest.raises(
        UserError, match=r"global_batch_size=100 does not split over 8 processes .* 96 or 104"
    ):
        per_gpu_batch(100, 8, 1)


def test_global_batch_is_split_printed_and_scales_the_lr(tmp_path: Path) -> None:
    args = ("data.global_batch_size=48", "train.grad_accum_steps=2", "optim.lr_scaling=linear")
    done = hpctrain("train", *QUICK, *args, "optim.base_batch_size=24", cwd=tmp_path)
    assert done.code == 0, done.err
    assert "batch 24 per process x 1 processes x 2 accumulation = global batch 48" in done.out
    assert "effective lr main 0.002" in done.out  # 1e-3 x 48 / 24


def test_a_global_batch_that_does_not_divide_is_one_line(tmp_path: Path) -> None:
    done = hpctrain("train", *QUICK, "data.global_batch_size=50", "train.grad_accum_steps=4", cwd=tmp_path)
    assert done.code == 2 and len(done.err.strip().splitlines()) == 1, done.err
    assert "data.global_batch_size=50 does not split over 1 processes x 4 accumulation steps" in done.err


def test_exactly_one_form_per_layer_and_the_later_layer_wins(tmp_path: Path) -> None:
    both = hpctrain("train", *QUICK, "data.global_batch_size=48", "data.batch_size=4", cwd=tmp_path)
    assert both.code == 2 and len(both.err.strip().splitlines()) == 1, both.err
    assert "data.batch_size and data.global_batch_size are both set" in both.err
    # the debug preset's per-GPU batch and an environment BATCH_SIZE give way to a global batch typed later
    env = clean_env(BATCH_SIZE="8")
    done = hpctrain("train", *QUICK, "data.global_batch_size=12", cwd=tmp_path, env=env)
    assert done.code == 0, done.err
    assert "batch 12 per process x 1 processes x 1 accumulation = global batch 12" in done.out


def test_a_saved_config_can_be_given_back(tmp_path: Path) -> None:
    """config.yaml of a global-batch run holds the form in use only, so --config takes it back."""
    done = hpctrain("train", "data.global_batch_size=64", "train.total_updates=3", cwd=tmp_path)
    assert done.code == 0, done.err
    saved = tmp_path / "logs" / "debug-global_batch_size64" / "config.yaml"  # its automatic name
    assert "global_batch_size: 64" in saved.read_text() and "\n  batch_size:" not in saved.read_text()
    again = hpctrain("train", "--config", str(saved), "train.total_updates=5", cwd=tmp_path)
    assert again.code == 0, again.err
    assert "finished at update 5/5" in again.out
