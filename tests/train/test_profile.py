"""Profiling a window of updates: a trace TensorBoard's profiler plugin reads, a top-operator table, nothing
outside the window."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from hpctrain.config.schema import ProfileConfig
from hpctrain.train.profile import NoProfiler, WindowProfiler, build_profiler


def train(profiler, updates: int) -> None:
    model = torch.nn.Linear(32, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for update in range(1, updates + 1):
        loss = model(torch.randn(16, 32)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        profiler.step(update)
    profiler.close()


def test_window_writes_a_trace_the_plugin_loads(tmp_path: Path) -> None:
    from torch_tb_profiler.profiler.data import RunProfileData

    cfg = ProfileConfig(start=3, warmup=1, active=2, record_shapes=True)
    profiler = build_profiler(cfg, tmp_path, "myrun", rank=0, cuda=False)
    assert isinstance(profiler, WindowProfiler)
    train(profiler, updates=12)
    traces = list((tmp_path / "profile").glob("myrun_rank0.*.pt.trace.json"))
    assert len(traces) == 1, list((tmp_path / "profile").iterdir())
    events = json.loads(traces[0].read_text())["traceEvents"]
    steps = sorted({e["name"] for e in events if e.get("name", "").startswith("ProfilerStep#")})
    assert len(steps) == 2, steps  # `active` updates recorded, the warm-up one discarded
    assert any(e.get("name") == "aten::addmm" for e in events)
    profile = RunProfileData.parse("myrun_rank0", None, str(traces[0]), str(tmp_path / "cache"))
    assert profile.worker == "myrun_rank0" and profile.has_runtime is not None
    table = (tmp_path / "profile" / "top_ops_rank0.txt").read_text()
    assert "aten::" in table and "Self CPU" in table


def test_off_and_other_ranks_profile_nothing(tmp_path: Path) -> None:
    assert isinstance(build_profiler(None, tmp_path, "r", rank=0, cuda=False), NoProfiler)
    assert isinstance(build_profiler(ProfileConfig(), tmp_path, "r", rank=1, cuda=False), NoProfiler)
    all_ranks = build_profiler(ProfileConfig(ranks="all"), tmp_path, "r", rank=1, cuda=False)
    assert isinstance(all_ranks, WindowProfiler)
    all_ranks.close()


def test_a_hop_resumed_past_the_window_profiles_nothing(tmp_path: Path) -> None:
    profiler = build_profiler(ProfileConfig(start=2, warmup=0, active=2), tmp_path, "r", rank=0, cuda=False)
    for update in range(50, 60):  # resumed at update 50
        profiler.step(update)
    profiler.close()
    assert not list((tmp_path / "profile").glob("*.json"))
