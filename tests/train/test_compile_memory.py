"""Compile modes per network, the activation-memory budget and activation checkpointing, through the CLI (a
recording stand-in for torch.compile: compiling for real on CPU takes minutes)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
import torch
from torch import nn

from hpctrain.train.memory import blocks_of, checkpoint_blocks
from hpctrain.workloads.regression.task import MLP
from tests.conftest import clean_env, fake_compile, hpctrain
from tests.workloads.muons.conftest import write_set
from tests.workloads.muons.test_model_run import wgan_overrides

QUICK = ("train.total_updates=3", "train.eval_every=0", "logging.gpu_every_seconds=0")


def compiled(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


@pytest.mark.parametrize(
    ("setting", "mode"),
    [("max-autotune", "max-autotune"), ("true", None)],
)
def test_compile_mode_reaches_torch_compile(tmp_path: Path, setting: str, mode: str | None) -> None:
    log = tmp_path / "compile.jsonl"
    done = hpctrain(
        "train", *QUICK, f"train.compile={setting}", cwd=tmp_path, env=clean_env(**fake_compile(log))
    )
    assert done.code == 0, done.err
    assert compiled(log) == [{"mode": mode, "budget": 1.0, "network": "MLP"}]
    assert "model: torch.compile mode" in done.out


def test_memory_budget_sets_the_compiler_option(tmp_path: Path) -> None:
    log = tmp_path / "compile.jsonl"
    args = ("train.compile=default", "train.memory_budget=0.5")
    done = hpctrain("train", *QUICK, *args, cwd=tmp_path, env=clean_env(**fake_compile(log)))
    assert done.code == 0, done.err
    assert compiled(log) == [{"mode": None, "budget": 0.5, "network": "MLP"}]
    assert "recomputes" not in done.out  # the compiler does it: no explicit checkpointing on top


def test_memory_budget_without_compiling_checkpoints_blocks(tmp_path: Path) -> None:
    log = tmp_path / "compile.jsonl"
    done = hpctrain(
        "train", *QUICK, "train.memory_budget=0.5", cwd=tmp_path, env=clean_env(**fake_compile(log))
    )
    assert done.code == 0, done.err
    assert compiled(log) == []  # train.compile=off by default
    assert "networks: model: recomputes 1 blocks" in done.out
    bad = hpctrain("train", *QUICK, "train.memory_budget=1.5", cwd=tmp_path)
    assert bad.code == 2 and "train.memory_budget" in bad.err and len(bad.err.strip().splitlines()) == 1


def test_per_network_modes_and_the_critic_compiled_with_its_penalty(tmp_path: Path) -> None:
    data = tmp_path / "data"
    write_set(data / "train", files=1, events=64, row_group=32, seed=3)
    write_set(data / "val", files=1, events=32, row_group=32, seed=4)
    log = tmp_path / "compile.jsonl"
    args = [*wgan_overrides(data, tmp_path / "out"), "train.total_updates=2", "logging.gpu_every_seconds=0"]
    modes = "train.compile={generator: reduce-overhead, critic: max-autotune}"
    done = hpctrain("train", *args, modes, cwd=tmp_path, env=clean_env(**fake_compile(log)))
    assert done.code == 0, done.err
    # the critic is compiled under the gradient penalty too (the penalty's input gradient by torch.func.grad)
    assert compiled(log) == [
        {"mode": "reduce-overhead", "budget": 1.0, "network": "Generator"},
        {"mode": "max-autotune", "budget": 1.0, "network": "Critic"},
    ]
    assert "double backward" not in done.out + done.err
    # without the penalty the critic takes its mode; model.compile.<network> wins over train.compile; the
    # networks not compiled recompute their blocks under gradient_checkpointing
    log.unlink()
    again = [*args, "run.name=nogp", "model.lambda_gp=0", modes, "model.compile.generator=off"]
    done = hpctrain(
        "train", *again, "train.gradient_checkpointing=true", cwd=tmp_path, env=clean_env(**fake_compile(log))
    )
    assert done.code == 0, done.err
    assert compiled(log) == [{"mode": "max-autotune", "budget": 1.0, "network": "Critic"}]
    assert "networks: generator: recomputes 3 blocks; critic: recomputes 2 blocks" in done.out
    # a network the workload does not have is named, with the ones it has
    bad = hpctrain("train", *args, "run.name=bad", "train.compile={critc: default}", cwd=tmp_path)
    assert bad.code == 2 and len(bad.err.strip().splitlines()) == 1, bad.err
    assert "critc is not a network of muon_wgan (its networks: generator, critic)" in bad.err


def saved_tensors(model: nn.Module, x: torch.Tensor) -> int:
    count = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal count
        count += 1
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(x).sum().backward()
    return count


def test_checkpointed_blocks_keep_fewer_activations_and_the_same_gradients() -> None:
    torch.manual_seed(0)
    plain = MLP(8, [64, 64, 64], "gelu", 0.0)
    recomputing = MLP(8, [64, 64, 64], "gelu", 0.0)
    recomputing.load_state_dict(plain.state_dict())
    assert checkpoint_blocks(blocks_of(recomputing)) == 1
    x = torch.randn(32, 8)
    assert saved_tensors(recomputing, x) < saved_tensors(plain, x) / 2
    for a, b in zip(plain.parameters(), recomputing.parameters()):
        torch.testing.assert_close(a.grad, b.grad)
    assert set(plain.state_dict()) == set(recomputing.state_dict())  # checkpoints keep their keys


def test_the_compile_cache_and_the_run_folders_are_made_for_the_user_alone(tmp_path: Path) -> None:
    """Under umask 000 the compile cache is made 0700 and run.out_dir, the run folder and checkpoints/ 0750 (the
    umask's mode was 0777: anyone could plant a pickle that Inductor loads); a cache the group may write is one
    line, exit 2, before anything compiles; so is a TORCHINDUCTOR_CACHE_DIR or TRITON_CACHE_DIR others may write."""
    log = tmp_path / "compile.jsonl"
    old = os.umask(0)
    try:
        done = hpctrain(
            "train", *QUICK, "train.compile=true", cwd=tmp_path, env=clean_env(**fake_compile(log))
        )
    finally:
        os.umask(old)
    assert done.code == 0, done.err
    logs = tmp_path / "logs"
    modes = {
        p: stat.S_IMODE(p.stat().st_mode) for p in (logs, logs / "debug", logs / "debug" / "checkpoints")
    }
    assert set(modes.values()) == {0o750}, modes
    assert stat.S_IMODE((logs / ".compile-cache").stat().st_mode) == 0o700
    log.unlink()
    (logs / ".compile-cache").chmod(0o770)
    refused = hpctrain(
        "train", *QUICK, "train.compile=true", cwd=tmp_path, env=clean_env(**fake_compile(log))
    )
    assert refused.code == 2 and len(refused.err.strip().splitlines()) == 1, refused.err
    assert "compile cache (run.out_dir): " in refused.err and "writable by its group" in refused.err
    assert not log.exists()  # nothing compiled
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    for variable in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
        env = clean_env(**fake_compile(log), **{variable: str(shared)})
        chosen = hpctrain("train", *QUICK, "train.compile=true", "run.out_dir=other", cwd=tmp_path, env=env)
        assert chosen.code == 2 and f"compile cache ({variable})" in chosen.err, chosen.err
        assert "writable by group and others" in chosen.err and not log.exists()
