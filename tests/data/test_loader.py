"""The generic loader (data/loader.py, data/stream/epoch_plan.py, runtime/seeding.py): sharding over ranks, worker
seeds, exact resume mid-epoch, one form of the position in a checkpoint, and the close of persistent workers."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from torch.utils.data import Dataset, get_worker_info

from hpctrain.data.loader import IndexedStream, LoaderOptions, SeededLoader, as_batch, load_position
from hpctrain.data.stream.epoch_plan import EpochPlan, PieceSize, Reassembly, work_items
from hpctrain.runtime.seeding import CHUNK_EVENTS, EPOCH_UNITS, LOADER_WORKERS, derive, numpy_rng
from tests.workloads.muons.conftest import event_stream, write_set


class Indices(Dataset[tuple[int, int, int, float]]):
    """Sample i is (i, the worker's pid, its torch seed, a draw of its global NumPy RNG)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[int, int, int, float]:
        worker = get_worker_info()  # its seed: the torch seed of the worker (-1: the main process)
        return i, os.getpid(), worker.seed if worker is not None else -1, float(np.random.random())


def take(stream: IndexedStream, batches: int) -> list[list[int]]:
    it = iter(stream)
    return [next(it)[0].tolist() for _ in range(batches)]


def test_ranks_share_one_global_order_without_duplicates() -> None:
    n, bs, world = 50, 4, 3
    per_rank = [take(IndexedStream(Indices(n), bs, 7, r, world), n // (bs * world)) for r in range(world)]
    seen = [i for batches in per_rank for b in batches for i in b]
    assert len(seen) == len(set(seen)) == n // (bs * world) * bs * world  # the last partial batch dropped
    # rank r holds the r-th slice of each global batch: the same order as one rank taking it whole
    single = take(IndexedStream(Indices(n), bs * world, 7), n // (bs * world))
    interleaved = [[i for r in range(world) for i in per_rank[r][k]] for k in range(len(single))]
    assert interleaved == single
    other_seed = take(IndexedStream(Indices(n), bs * world, 8), 1)
    assert other_seed != single[:1]


def test_resume_mid_epoch_continues_with_the_very_next_sample() -> None:
    n, bs = 40, 4
    reference = take(IndexedStream(Indices(n), bs, 3), 25)  # 2.5 epochs
    first = IndexedStream(Indices(n), bs, 3)
    head = take(first, 13)  # past the first epoch's end, mid second epoch
    state = first.state_dict()
    assert state == {"epoch": 1, "position": 3 * bs}  # one form: epoch and samples consumed by all ranks
    first.close()
    # as two ranks of half the batch, with workers: the same samples follow
    tail = []
    for rank in range(2):
        again = IndexedStream(Indices(n), bs // 2, 3, rank, 2, options=LoaderOptions(num_workers=1))
        again.load_state_dict(state)
        tail.append(take(again, 12))
        again.close()
    resumed = [a + b for a, b in zip(*tail)]
    assert head + resumed == reference


class Batched(Dataset[tuple[int, int]]):
    """Fetches whole batches: by `__getitems__` (torch's protocol: a list of ints) or, with `takes`, by an index
    tensor (TakesIndex); records what it was handed."""

    def __init__(self, n: int) -> None:
        self.data = torch.arange(n) * 10
        self.handed: list[type] = []

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> tuple[int, int]:
        raise AssertionError("whole batches only")

    def __getitems__(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        self.handed.append(type(indices))
        return torch.as_tensor(indices), self.data[torch.as_tensor(indices)]


class Takes(Batched):
    def take(self, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.handed.append(type(index))
        return index, self.data[index]


@pytest.mark.parametrize("kind", [Batched, Takes])
def test_batches_fetched_in_process_are_the_dataloaders(kind: type[Batched]) -> None:
    """0 workers: the stream fetches its batches itself (no DataLoader); the same batches, epochs and resume
    as through the DataLoader's workers, and the model's random stream untouched."""
    n, bs, batches = 30, 4, 17  # 7 full batches an epoch: 2.4 epochs
    before = torch.get_rng_state()
    data = kind(n)
    own = IndexedStream(data, bs, 5, collate_fn=as_batch)
    it = iter(own)
    mine = [next(it)[0].tolist() for _ in range(batches)]
    assert own.state_dict() == {"epoch": 2, "position": 3 * bs}
    assert torch.equal(torch.get_rng_state(), before)
    assert set(data.handed) == {torch.Tensor if kind is Takes else list}
    loaded = IndexedStream(kind(n), bs, 5, options=LoaderOptions(num_workers=1), collate_fn=as_batch)
    assert take(loaded, batches) == mine
    loaded.close()
    resumed = IndexedStream(kind(n), bs, 5, collate_fn=as_batch)
    resumed.load_state_dict({"epoch": 1, "position": 2 * bs})
    assert take(resumed, batches - 9) == mine[9:]
    assert sorted(i for b in mine[:7] for i in b) == sorted(set(i for b in mine[:7] for i in b))


def test_position_state_is_one_key_for_both_streams(tmp_path: Path) -> None:
    files = write_set(tmp_path / "d", files=1, events=100, row_group=50)
    muons = event_stream(files, 10, seed=0)
    indexed = IndexedStream(Indices(30), 10, 0)
    try:
        for stream in (muons, indexed):
            assert isinstance(stream._loader, SeededLoader)  # both built by make_loader
            next(iter(stream))
            state = stream.state_dict()
            assert state["epoch"] == 0 and state["position"] == 10 and "offset" not in state
    finally:
        muons.close()
        indexed.close()
    # IndexedStream checkpoints written before the streams shared the key still resume at their place
    assert load_position({"epoch": 2, "offset": 8}, None, False) == (2, 8)


def _draws(stream: IndexedStream, batches: int) -> dict[int, tuple[int, float]]:
    """pid -> (torch seed, first NumPy draw) of each worker that made one of the first batches."""
    out: dict[int, tuple[int, float]] = {}
    it = iter(stream)
    for _ in range(batches):
        _, pids, seeds, draws = next(it)
        for pid, seed, draw in zip(pids.tolist(), seeds.tolist(), draws.tolist()):
            out.setdefault(pid, (seed, draw))
    stream.close()
    return out


def test_worker_seeds_distinct_per_worker_and_rank_and_repeatable() -> None:
    def draws(rank: int) -> list[tuple[int, float]]:
        options = LoaderOptions(num_workers=2, prefetch_factor=1)
        return sorted(_draws(IndexedStream(Indices(16), 2, 5, rank, 2, options=options), 4).values())

    before = torch.get_rng_state()
    rank0, rank1 = draws(0), draws(1)
    assert torch.equal(torch.get_rng_state(), before)  # worker seeds never come from the global torch RNG
    assert len(rank0) == 2 and rank0[0] != rank0[1]  # two workers, two streams (NumPy's too)
    assert rank0[0][1] != rank0[1][1]
    assert not set(rank0) & set(rank1)  # ranks differ
    assert draws(0) == rank0  # a function of (seed, epoch, rank): the same after a restart
    # worker w's torch seed is the loader's base seed + w, drawn from a generator seeded by (seed, epoch, rank)
    generator = torch.Generator().manual_seed(derive(5, LOADER_WORKERS, 0, 0))
    base = int(torch.empty((), dtype=torch.int64).random_(generator=generator).item())
    assert [seed for seed, _ in rank0] == [base, base + 1]


def test_close_ends_persistent_workers() -> None:
    options = LoaderOptions(num_workers=1, persistent_workers=True)
    stream = IndexedStream(Indices(8), 2, 0, options=options)
    (pid,) = _draws(stream, 2)  # _draws closes the stream
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    pytest.fail(f"worker {pid} still runs after close()")


LEFT_OPEN = """
import sys
import torch
from torch.utils.data import Dataset
from hpctrain.data.loader import IndexedStream, LoaderOptions
from hpctrain.workloads.muons.spec import MuonData
from hpctrain.workloads.muons.events.stream import EventStream

class Squares(Dataset):
    def __len__(self):
        return 64
    def __getitem__(self, i):
        return torch.tensor(i * i)

events = EventStream(sys.argv[1:], MuonData(batch_size=16, num_workers=2, persistent_workers=True), seed=0)
squares = IndexedStream(Squares(), 4, 0, options=LoaderOptions(num_workers=1))
held = [iter(events), iter(squares)]  # suspended, holding their DataLoader iterators, never closed
for it in held:
    next(it)
print("done", flush=True)
"""


def test_streams_left_open_end_their_workers_at_exit(tmp_path: Path) -> None:
    """A script that never closes its streams still exits: their workers ignore SIGTERM, so multiprocessing's
    exit hook alone (terminate, then join) would wait for them forever."""
    import subprocess
    import sys

    files = write_set(tmp_path / "d", files=1, events=200, row_group=50)
    try:
        done = subprocess.run(
            [sys.executable, "-c", LEFT_OPEN, *files], capture_output=True, text=True, timeout=180
        )
    except subprocess.TimeoutExpired:
        pytest.fail("a process with streams left open did not exit")
    assert done.returncode == 0 and done.stdout == "done\n", done.stderr


def test_work_items_cover_each_position_once_and_reassemble_in_order() -> None:
    unit_rows = [[3, 5], [4], [7, 0, 1]]
    plan = EpochPlan(unit_rows, seed=2, epoch=1, shuffle=True, window=4)
    assert plan.total == 20 and all(sum(u.rows for u in c) >= 4 for c in plan.chunks[:-1])
    for start in (0, 5):
        covered = []
        for rank in range(2):
            batches: Reassembly[list[int]] = Reassembly()
            for item in work_items(plan, start, 3, rank, 2, drop_last=False):
                base = int(plan.starts[item.chunk])
                for p in item.pieces:
                    size = PieceSize(p.batch, p.part, p.parts, p.hi - p.lo)
                    batches.add(size, list(range(base + p.lo, base + p.hi)))
            for _, parts in batches.ready():
                covered += [i for part in parts for i in part]
            batches.check_done()
        assert sorted(covered) == list(range(start, 20))


def _work_items_batch_by_batch(
    plan: EpochPlan, start: int, batch_size: int, rank: int, world_size: int, drop_last: bool
) -> list[tuple[int, list[tuple[int, ...]]]]:
    """work_items as first written, a search per batch: what the whole-epoch version must reproduce."""
    g, n, k = batch_size * world_size, plan.total, 0
    items: list[tuple[int, list[tuple[int, ...]]]] = []
    while start + k * g + (g if drop_last else 1) <= n:
        lo = start + k * g + rank * batch_size
        hi, parts, pos = min(lo + batch_size, n), [], lo
        while pos < hi:
            c = plan.chunk_of(pos)
            end = min(hi, int(plan.starts[c + 1]))
            parts.append((c, pos - int(plan.starts[c]), end - int(plan.starts[c])))
            pos = end
        if not parts:
            parts.append((plan.chunk_of(min(lo, n - 1)), 0, 0))
        for i, (c, a, b) in enumerate(parts):
            if not items or items[-1][0] != c:
                items.append((c, []))
            items[-1][1].append((k, i, len(parts), a, b))
        k += 1
    return items


@settings(max_examples=150, deadline=None)
@given(
    rows=st.lists(st.lists(st.integers(0, 9), min_size=1, max_size=3), min_size=1, max_size=5),
    window=st.integers(1, 12),
    shuffle=st.booleans(),
    batch_size=st.integers(1, 7),
    world_size=st.integers(1, 3),
    start=st.integers(0, 40),
    drop_last=st.booleans(),
)
def test_work_items_of_the_whole_epoch_are_those_found_batch_by_batch(
    rows: list[list[int]],
    window: int,
    shuffle: bool,
    batch_size: int,
    world_size: int,
    start: int,
    drop_last: bool,
) -> None:
    assume(sum(map(sum, rows)) > 0)
    plan = EpochPlan(rows, seed=1, epoch=0, shuffle=shuffle, window=window)
    start = start % plan.total
    for rank in range(world_size):
        got = [
            (item.chunk, [tuple(p) for p in item.pieces])
            for item in work_items(plan, start, batch_size, rank, world_size, drop_last)
        ]
        assert got == _work_items_batch_by_batch(plan, start, batch_size, rank, world_size, drop_last)


def test_seed_derivation() -> None:
    assert derive(1, 2, 3) == derive(1, 2, 3)
    seeds = {derive(s, tag, k) for s in range(4) for tag in range(4) for k in range(4)}
    assert len(seeds) == 64 and all(0 <= s < 2**63 for s in seeds)
    assert derive(1, 0) != derive(0, 7919)  # no collisions of a linear formula like seed * 7919 + epoch
    # the NumPy streams keep the numbers they had before they were named (the muon order did not move)
    old = np.random.default_rng([3, 1, EPOCH_UNITS]).permutation(100)
    assert np.array_equal(numpy_rng(3, 1, EPOCH_UNITS).permutation(100), old)
    assert EPOCH_UNITS == 17 and CHUNK_EVENTS == 29


@pytest.mark.parametrize(
    "args, culprit",
    [
        (["--dir", "/nonexistent"], "--dir /nonexistent"),
        (["--passes", "0"], "--passes"),
        (["--rounds", "-1"], "--rounds"),
    ],
)
def test_the_loader_bench_refuses_bad_arguments_in_one_line(args: list[str], culprit: str) -> None:
    import subprocess
    import sys

    bench = Path(__file__).resolve().parents[2] / "bench" / "loader.py"
    done = subprocess.run([sys.executable, str(bench), *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines()[-1].startswith(f"loader.py: error: {culprit}")
    assert "Traceback" not in done.stderr
