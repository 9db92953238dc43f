"""Out of device memory in an update (torch.OutOfMemoryError injected at the step, on CPU): one line, the last
checkpoint kept, an exit code nothing retries at the same settings; or train.on_oom=split: the same update in
halved micro-batches."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from hpctrain.commands.train import run
from hpctrain.config.loading import ConfigRequest, load_config
from hpctrain.errors import EXIT_OK, EXIT_OUT_OF_MEMORY, OutOfMemory, UserError
from hpctrain.runtime.env import ClusterEnv
from hpctrain.train.checkpoint import load_verified
from hpctrain.train.oom import OomGuard
from hpctrain.train.task import SupervisedTask, halve_tree
from hpctrain.workloads.registry import config_model, fill_default_types
from tests.conftest import clean_env, hpctrain, step_fault
from tests.faulthook.step_faults import faulty_step


def cfg_for(out: Path, *overrides: str):
    base = [
        "run.name=t",
        f"run.out_dir={out}",
        "train.eval_every=0",
        "logging.log_every=5",
        "train.threads=1",
    ]
    return load_config(
        ConfigRequest(None, None, [*base, *overrides], None), config_model(), prepare=fill_default_types
    )


def latest(run_dir: Path) -> dict:
    return load_verified(run_dir / "checkpoints" / (run_dir / "checkpoints" / "latest").read_text().strip())


def test_out_of_memory_is_one_line_and_keeps_the_last_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(SupervisedTask, "train_step", faulty_step(oom_after=12))
    cfg = cfg_for(tmp_path, "data.batch_size=32", "train.total_updates=40", "checkpoint.every=5")
    with pytest.raises(OutOfMemory) as raised:
        run(cfg, ClusterEnv())
    line = str(raised.value)
    assert "\n" not in line
    assert line.startswith(
        "out of memory on cpu at update 13: a micro-batch of 32 samples (data.batch_size=32 x "
    )
    assert "asked 2.00 GiB with 1.23 GiB free of 79.19 GiB" in line
    assert "checkpoints/latest stays at update 10" in line
    for knob in (
        "data.batch_size",
        "train.grad_accum_steps",
        "data.global_batch_size",
        "train.memory_budget",
    ):
        assert knob in line
    assert "train.gradient_checkpointing=true" in line and "train.on_oom=split" in line
    run_dir = tmp_path / "t"
    assert latest(run_dir)["counters"]["step"] == 10  # nothing of the half-done update saved
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["status"], summary["reason"], summary["exit_code"], summary["step"]) == (
        "failed",
        "out_of_memory",
        EXIT_OUT_OF_MEMORY,
        10,
    )
    assert json.loads((run_dir / "chain.json").read_text())[-1]["exit_reason"] == "out_of_memory"


def test_until_done_does_not_start_an_out_of_memory_run_again(tmp_path: Path) -> None:
    """The command's exit code is its own (78), and the supervisor stops at it instead of retrying."""
    done = hpctrain(
        "train", "run.name=o", "train.total_updates=20", "checkpoint.every=4", "--until-done",
        cwd=tmp_path, env=clean_env(**step_fault(oom_after=6)),
    )  # fmt: skip
    assert done.code == EXIT_OUT_OF_MEMORY, done.err[-2000:]
    errors = [line for line in done.err.splitlines() if line.startswith("error: out of memory")]
    assert len(errors) == 1 and "at update 7" in errors[0] and "latest stays at update 4" in errors[0]
    assert done.err.count("hpctrain supervise: attempt ") == 2  # started once, ended once
    assert "out of device memory (exit 78, said above): running it again at the same settings" in done.err


def test_split_halves_the_micro_batches_and_keeps_the_update(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batches of 32 that run out of memory above 8 samples from the 5th update on: split in 4 pieces of 8,
    accumulated; the weights stay those of the run that never ran out, to float rounding."""
    args = ["data.batch_size=32", "train.total_updates=20", "checkpoint.every=10"]
    assert run(cfg_for(tmp_path / "ref", *args), ClusterEnv()) == EXIT_OK
    monkeypatch.setattr(SupervisedTask, "train_step", faulty_step(oom_after=4, oom_above=8))
    assert run(cfg_for(tmp_path / "split", *args, "train.on_oom=split"), ClusterEnv()) == EXIT_OK
    ref, split = latest(tmp_path / "ref" / "t"), latest(tmp_path / "split" / "t")
    assert split["oom"] == {"split": 4} and ref["oom"] == {"split": 1}
    for key, value in ref["modules"]["model"].items():
        torch.testing.assert_close(split["modules"]["model"][key], value, rtol=1e-5, atol=1e-6)
    assert split["counters"]["samples"] == ref["counters"]["samples"] == 20 * 32


def test_a_resumed_hop_splits_as_the_hop_before_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    step = faulty_step(oom_after=2, oom_above=16)
    monkeypatch.setattr(SupervisedTask, "train_step", step)
    args = ["data.batch_size=32", "train.on_oom=split"]
    assert run(cfg_for(tmp_path, *args, "train.total_updates=6"), ClusterEnv()) == EXIT_OK
    calls = step.calls[0]
    assert run(cfg_for(tmp_path, *args, "train.total_updates=12"), ClusterEnv()) == EXIT_OK
    assert step.calls[0] - calls == 6  # no update of the second hop ran out first: it split from its start
    assert latest(tmp_path / "t")["oom"] == {"split": 2}


def test_halving_a_batch() -> None:
    x, y = torch.arange(10.0).reshape(5, 2), torch.arange(5)
    first, second = halve_tree({"x": x, "y": y, "note": "kept"})
    assert first["x"].shape == (3, 2) and second["y"].tolist() == [3, 4] and second["note"] == "kept"
    assert halve_tree((x, torch.arange(4))) is None  # two sizes: not one batch
    assert halve_tree((x[:1],)) is None  # one sample
    assert halve_tree(object()) is None


def test_split_needs_one_process(tmp_path: Path) -> None:
    cfg = cfg_for(tmp_path, "train.on_oom=split")
    with pytest.raises(UserError, match=r"^train.on_oom=split needs one process, not 2: "):
        OomGuard(cfg.train, cfg.data, None, ClusterEnv(rank=0, world_size=2), None, lambda: None)  # type: ignore[arg-type]
