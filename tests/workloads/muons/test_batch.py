from __future__ import annotations

import itertools
from types import SimpleNamespace

import numpy as np
import torch
from torch import nn

from hpctrain.runtime.env import ClusterEnv
from hpctrain.workloads.muons.data_verbs import synthetic_events
from hpctrain.workloads.muons.events.batch import (
    MuonBatch,
    cut_points,
    from_buffer,
    packed_size,
    split_by_muon_cap,
)
from hpctrain.workloads.muons.tasks.base import MuonTaskBase


def _batch(n: int = 40, seed: int = 3) -> MuonBatch:
    ev = synthetic_events(n, seed, 0)
    return MuonBatch.from_numpy(ev.primaries, ev.muons, ev.counts, ev.ids)


def test_cut_points_respect_cap() -> None:
    counts = np.array([5, 0, 7, 3, 3, 0, 10, 1])
    ranges = cut_points(counts, 10)
    assert ranges[0][0] == 0 and ranges[-1][1] == len(counts)
    assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))  # contiguous, whole events
    assert all(counts[a:b].sum() <= 10 for a, b in ranges)
    assert cut_points(np.array([30, 2]), 10) == [(0, 1), (1, 2)]  # too big alone: its own piece
    assert cut_points(counts, 0) == [(0, len(counts))]


def test_split_keeps_every_event_and_muon() -> None:
    batch = _batch()
    pieces = split_by_muon_cap(batch, 500)
    assert len(pieces) > 1 and all(p.num_muons <= 500 or len(p) == 1 for p in pieces)
    joined = MuonBatch.concat(pieces)
    for name in ("primaries", "muons", "counts", "offsets", "ids"):
        assert torch.equal(getattr(joined, name), getattr(batch, name))
    assert torch.equal(
        batch.event_index()[: int(batch.counts[0])], torch.zeros(int(batch.counts[0]), dtype=torch.long)
    )


class _Task(MuonTaskBase):
    def build_modules(self) -> dict[str, nn.Module]:
        return {}

    def train_step(self, micro_batches, ctx):  # type: ignore[no-untyped-def]
        raise NotImplementedError

    def eval_step(self, batch, ctx):  # type: ignore[no-untyped-def]
        raise NotImplementedError


class _Net(nn.Module):
    """Per-event mean of a muon MLP, compared with a function of the primary: a loss that mixes events."""

    def __init__(self) -> None:
        super().__init__()
        self.muon = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 1))
        self.prim = nn.Linear(4, 1)

    def loss(self, b: MuonBatch) -> torch.Tensor:
        per_muon = self.muon(b.muons).squeeze(1)  # (M,)
        sums = per_muon.new_zeros(len(b)).index_add_(0, b.event_index(), per_muon)
        pooled = sums / b.counts.clamp_min(1)  # (B,)
        return ((self.prim(b.primaries).squeeze(1) - pooled) ** 2).mean()


def test_micro_batch_gradients_equal_whole_batch() -> None:
    torch.manual_seed(0)
    cfg = SimpleNamespace(data=SimpleNamespace(max_muons_per_batch=400))
    task = _Task(cfg, ClusterEnv())
    batch = task.to_device(_batch(), torch.device("cpu"))
    net = _Net().double()
    batch = MuonBatch(
        *(
            t.double() if t.is_floating_point() else t
            for t in (batch.primaries, batch.muons, batch.counts, batch.offsets, batch.ids, batch.positions)
        ),
        normalized=True,
    )
    net.loss(batch).backward()
    whole = [p.grad.clone() for p in net.parameters()]
    net.zero_grad()
    micro = task.split(batch)
    assert len(micro) > 2 and abs(sum(m.weight for m in micro) - 1) < 1e-12
    for m in micro:
        (net.loss(m.data) * m.weight).backward()
    for a, b in zip(whole, [p.grad for p in net.parameters()]):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_empty_batch_is_one_zero_sample_piece() -> None:
    cfg = SimpleNamespace(data=SimpleNamespace(max_muons_per_batch=10))
    task = _Task(cfg, ClusterEnv())
    micro = task.split(MuonBatch.empty())
    assert len(micro) == 1 and micro[0].samples == 0
    assert task.histograms(task.to_device(_batch(), torch.device("cpu")))["multiplicity_log10"].shape == (40,)


def test_a_joined_batch_moves_to_a_device_in_one_transfer() -> None:
    """A batch joined from pieces lies in one buffer: `to` copies it once (not six tensors, each a transfer and,
    from pageable memory, a staging copy on the host's time) and the moved tensors are the same events. The meta
    device stands in for CUDA (copies and views, no values); the layout is checked by reading the buffer back."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Copies(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            if func.__name__.startswith(("_to_copy", "copy_")):
                self.count += 1
            return func(*args, **(kwargs or {}))

    batch = _batch(60, seed=5)
    for joined in (
        MuonBatch.concat(split_by_muon_cap(batch, 700)),
        MuonBatch.concat([batch.select(0, 0), batch]),
    ):
        buffer = joined.buffer()
        assert buffer is not None and buffer.dtype == torch.uint8
        with Copies() as copies:
            moved = joined.to("meta")
        assert copies.count == 1
        assert moved.muons.device.type == "meta" and moved.normalized == joined.normalized
        for name in ("primaries", "muons", "counts", "offsets", "ids", "positions"):
            assert getattr(moved, name).shape == getattr(joined, name).shape, name
        again = from_buffer(buffer.clone(), len(joined), joined.num_muons)
        for name in ("primaries", "muons", "counts", "offsets", "ids", "positions"):
            assert torch.equal(getattr(again, name), getattr(batch, name)), name
    # tensors that do not lie in one buffer (a slice of a batch, normalised copies) move one by one, unchanged
    for loose in (batch.select(5, 30), MuonBatch.concat(split_by_muon_cap(batch, 700)).normalize()):
        assert loose.buffer() is None
        with Copies() as copies:
            moved = loose.to("meta")
        assert copies.count == 6 and moved.muons.shape == loose.muons.shape


def test_the_networks_get_one_layout_whatever_the_batch_lies_in() -> None:
    """torch.compile takes a storage offset of 0 as a constant and any other as a symbol: counts that start
    inside a buffer (a slice, a piece in a worker's larger buffer) in one batch and not in the next made a second
    graph, a second compile mid-run, and so did counts that were a view of a buffer in one batch and not in the
    next (AOTAutograd guards on the view's base). `for_networks` gives every tensor the networks read a storage of
    its own, with the same values; one graph then serves batches of every layout (Dynamo's graph count)."""
    import torch._dynamo

    from hpctrain.train.compile.policy import compile_network
    from hpctrain.train.compile.stats import compiled_graphs

    batch = _batch(60, seed=5)
    larger = torch.zeros(512 + packed_size(len(batch), batch.num_muons), dtype=torch.uint8)
    inside = from_buffer(larger[512:], len(batch), batch.num_muons)
    for name in ("primaries", "muons", "counts", "ids", "positions", "offsets"):
        getattr(inside, name).copy_(getattr(batch, name))
    layouts = {
        "own tensors": batch,
        "a slice": batch.select(5, 45),
        "joined": MuonBatch.concat(split_by_muon_cap(batch, 700)),
        "a piece inside a larger buffer": inside,
    }
    assert inside.counts.storage_offset() and layouts["a slice"].counts.storage_offset()

    class Pool(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.ones(3))

        def forward(self, primaries: torch.Tensor, counts: torch.Tensor, muons: torch.Tensor) -> torch.Tensor:
            index = torch.repeat_interleave(torch.arange(len(counts)), counts, output_size=muons.shape[0])
            per_event = muons.new_zeros(len(counts), 3).index_add_(0, index, muons * self.w)
            return (per_event / counts.clamp_min(1).unsqueeze(1)).sum() + primaries.sum()

    torch._dynamo.reset()
    compile_network(Pool(), "default", None, dynamic=True)  # the run's settings (floats kept constant)
    # Dynamo's guards and AOTAutograd's handling of inputs that are views; no code generated
    net = torch.compile(Pool(), backend="aot_eager", dynamic=True)
    before = compiled_graphs()
    for what, b in layouts.items():
        seen = b.for_networks("cpu")
        assert seen.normalized and len(seen) == len(b), what
        for name in ("primaries", "muons", "counts"):
            t = getattr(seen, name)
            assert t.storage_offset() == 0 and not t._is_view(), (what, name)
        assert torch.equal(seen.counts, b.counts) and torch.equal(seen.muons, b.normalize().muons), what
        net(seen.primaries, seen.counts, seen.muons).backward()
    assert compiled_graphs() - before == 1
    # without it: counts that are a view of a buffer (a joined batch's), then counts of their own, make a graph
    # each (the guard on the view's base fails on the second): the case the method exists for
    torch._dynamo.reset()
    net = torch.compile(Pool(), backend="aot_eager", dynamic=True)
    before = compiled_graphs()
    for counts in (layouts["joined"].counts, batch.counts):
        net(batch.primaries, counts, batch.normalize().muons).backward()
    assert compiled_graphs() - before == 2
