"""Start-up: the record of a hop's first update, and what a `train` start does not import."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from hpctrain.train.first_update import on_first_update
from tests.conftest import hpctrain


def _step(optimizer: torch.optim.Optimizer) -> None:
    for group in optimizer.param_groups:
        for p in group["params"]:
            p.grad = torch.ones_like(p)
    optimizer.step()


def test_first_update_fires_once_every_optimizer_stepped_and_unhooks() -> None:
    nets = {name: torch.nn.Linear(2, 1) for name in ("critic", "generator")}
    optimizers = {name: torch.optim.SGD(net.parameters(), lr=0.1) for name, net in nets.items()}
    calls: list[int] = []
    on_first_update(optimizers, lambda: calls.append(1))
    _step(optimizers["critic"])
    _step(optimizers["critic"])  # a GAN's critic steps first, several times: the update is not done yet
    assert calls == []
    _step(optimizers["generator"])
    assert calls == [1]
    for optimizer in optimizers.values():
        _step(optimizer)
        assert not optimizer._optimizer_step_post_hooks  # nothing left to run per update
    assert calls == [1]


def test_every_hop_records_its_start_up(tmp_path: Path) -> None:
    args = ("train", f"run.out_dir={tmp_path}", "run.name=s", "train.total_updates=4", "train.eval_every=0")
    assert hpctrain(*args, cwd=tmp_path).code == 0
    more = hpctrain(*args[:-2], "train.total_updates=8", "train.eval_every=0", cwd=tmp_path)
    assert more.code == 0, more.err
    hops = json.loads((tmp_path / "s" / "chain.json").read_text())
    assert len(hops) == 2
    for hop in hops:  # the process start to its first update: less than the whole hop
        assert 0 < hop["startup_seconds"] < hop["end"] - hop["start"] + 1e-6
