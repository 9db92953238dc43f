from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from hpctrain.data.stream import lent_buffers
from hpctrain.errors import UserError
from hpctrain.workloads.muons.data_verbs import synthetic_events
from hpctrain.workloads.muons.events import layouts
from hpctrain.workloads.muons.events.stream import EventStream

from .conftest import event_stream, keys, write_set


def take(stream: EventStream, n: int) -> list:
    it = iter(stream)
    return [next(it) for _ in range(n)]


def epoch_keys(
    files: list[str], rank: int, world: int, workers: int, bs: int = 16
) -> tuple[np.ndarray, np.ndarray]:
    stream = event_stream(
        files, bs, seed=3, rank=rank, world_size=world, num_workers=workers, shuffle_window=150
    )
    try:
        batches = take(stream, stream.samples_per_epoch // (bs * world))
        assert all(len(b) == bs for b in batches)
        assert stream.state_dict()["position"] == stream.samples_per_epoch
        return np.concatenate([keys(b.ids.numpy()) for b in batches]), np.concatenate(
            [b.positions for b in batches]
        )
    finally:
        stream.close()


def test_sharding_two_ranks_two_workers(muon_files: list[str]) -> None:
    parts = [epoch_keys(muon_files, r, 2, 2) for r in range(2)]
    got = np.concatenate([p[0] for p in parts])
    positions = np.concatenate([p[1] for p in parts])
    total = 3 * 400
    per_epoch = total // 32 * 32
    assert len(np.unique(got)) == len(got) == per_epoch  # no duplicates
    assert np.array_equal(np.sort(positions), np.arange(per_epoch))  # no gaps in the global order
    # the same global order as one rank without workers taking the whole global batch
    single, _ = epoch_keys(muon_files, 0, 1, 0, bs=32)
    interleaved = np.stack([p[0].reshape(-1, 16) for p in parts], axis=1).reshape(-1)
    assert np.array_equal(single, interleaved)


def test_shuffle_changes_with_epoch_and_seed(muon_files: list[str]) -> None:
    stream = event_stream(muon_files, 100, seed=1, shuffle_window=150)
    epoch0 = keys(take(stream, 12)[0].ids.numpy())
    epoch1 = keys(next(iter(stream)).ids.numpy())
    assert stream.state_dict()["epoch"] == 1
    assert not np.array_equal(epoch0, epoch1)
    other = event_stream(muon_files, 100, seed=2, shuffle_window=150)
    assert not np.array_equal(epoch0, keys(next(iter(other)).ids.numpy()))


@pytest.mark.parametrize("workers,world", [(2, 1), (0, 2)])
def test_exact_resume(muon_files: list[str], workers: int, world: int) -> None:
    ref = event_stream(muon_files, 16, seed=7, shuffle_window=100)
    expected = np.concatenate([keys(b.ids.numpy()) for b in take(ref, 20)])
    first = event_stream(muon_files, 16, seed=7, shuffle_window=100, num_workers=1, prefetch_batches=3)
    head = np.concatenate([keys(b.ids.numpy()) for b in take(first, 8)])
    state = first.state_dict()
    first.close()
    assert state["position"] == 8 * 16
    # resume with another worker count (or as two ranks of half the batch): the very next events follow
    tail = []
    for rank in range(world):
        again = event_stream(
            muon_files,
            16 // world,
            seed=7,
            shuffle_window=100,
            rank=rank,
            world_size=world,
            num_workers=workers,
        )
        again.load_state_dict(state)
        tail.append(np.stack([keys(b.ids.numpy()) for b in take(again, 12)]))
        again.close()
    resumed = np.concatenate(tail, axis=1).reshape(-1)
    assert np.array_equal(np.concatenate([head, resumed]), expected)


def test_epoch_boundary_resume(muon_files: list[str]) -> None:
    ref = event_stream(muon_files, 100, seed=1)
    seq = [keys(b.ids.numpy()) for b in take(ref, 15)]
    stream = event_stream(muon_files, 100, seed=1)
    take(stream, 12)
    again = event_stream(muon_files, 100, seed=1, num_workers=2)
    again.load_state_dict(stream.state_dict())
    assert np.array_equal(keys(take(again, 1)[0].ids.numpy()), seq[12])


@pytest.mark.parametrize("workers", [0, 2])
def test_endless_stream_runs_on_into_the_next_epochs_as_epoch_by_epoch(
    muon_files: list[str], workers: int
) -> None:
    """One loader pass over all epochs (no drain at the boundaries): the same batches, epochs and positions
    as reading epoch after epoch; a partial last batch is dropped at every boundary."""
    bs = 56  # 1200 events: 21 batches an epoch, 24 events left over
    ref = event_stream(muon_files, bs, seed=5, shuffle_window=150)
    per_epoch = ref.samples_per_epoch // bs
    expected = []
    for epoch in range(3):
        for batch, end in ref.epoch_batches(epoch, 0):
            expected.append((keys(batch.ids.numpy()).tolist(), epoch, end))
    ref.close()
    stream = event_stream(muon_files, bs, seed=5, shuffle_window=150, num_workers=workers)
    got, it = [], iter(stream)
    for _ in range(3 * per_epoch):
        batch = next(it)
        state = stream.state_dict()
        got.append((keys(batch.ids.numpy()).tolist(), state["epoch"], state["position"]))
    stream.close()
    assert got == expected
    assert [g[1:] for g in got[per_epoch - 1 : per_epoch + 1]] == [(0, per_epoch * bs), (1, bs)]


def test_hdf5_and_layouts_stream(tmp_path: Path) -> None:
    for layout in layouts.LAYOUTS:
        files = write_set(tmp_path / layout, layout, files=2, events=100, row_group=30)
        stream = event_stream(files, 50, seed=0, hdf5_unit_events=30)
        batches = take(stream, 4)
        assert len(np.unique(np.concatenate([keys(b.ids.numpy()) for b in batches]))) == 200
        assert all(int(b.counts.sum()) == b.num_muons for b in batches)


def test_values_match_files(muon_files: list[str]) -> None:
    _, events = layouts.read_all(muon_files[1])
    batch = take(event_stream(muon_files[1:2], 400, seed=0, shuffle=False), 1)[0]
    assert np.array_equal(batch.primaries.numpy(), events.primaries)
    assert np.array_equal(batch.muons.numpy(), events.muons)
    assert np.array_equal(batch.counts.numpy(), events.counts)


def test_bad_files(tmp_path: Path) -> None:
    files = write_set(tmp_path / "d", files=3, events=100)
    with open(files[1], "r+b") as fh:  # truncated: the footer is gone
        fh.truncate(os.path.getsize(files[1]) // 2)
    garbage = tmp_path / "d" / "garbage.parquet"
    garbage.write_bytes(b"PAR1" + os.urandom(500))
    files.append(str(garbage))
    with pytest.raises(UserError, match=r"f1\.parquet: cannot be read.*on_bad_file=skip"):
        event_stream(files, 10, seed=0)
    run = tmp_path / "run"
    stream = event_stream(files, 10, seed=0, on_bad_file="skip", run_dir=run)
    assert stream.index.total == 200
    listed = [line.split("\t")[0] for line in (run / "bad_files.txt").read_text().splitlines()]
    assert listed == [files[1], str(garbage)]
    assert len(take(stream, 20)) == 20


def _write_with_bad_events(path: Path) -> None:
    data = synthetic_events(60, 0, 0)
    data.primaries[5, 0] = 0.0  # zero energy
    data.primaries[9, 2] = -1.0  # negative mass
    nonempty = np.flatnonzero(data.counts > 0)
    data.muons[data.offsets[nonempty[3]], 0] = np.nan  # a NaN muon energy
    layouts.write_events(str(path), data, "parquet")


def test_bad_events(tmp_path: Path) -> None:
    path = tmp_path / "bad.parquet"
    _write_with_bad_events(path)
    with pytest.raises(UserError, match=r"bad\.parquet: event at row 5 .*on_bad_event=skip"):
        take(event_stream([str(path)], 60, seed=0, shuffle=False), 1)
    stream = event_stream([str(path)], 60, seed=0, shuffle=False, on_bad_event="skip")
    batch = take(stream, 1)[0]
    assert len(batch) == 57 and stream.stats["bad_events"] == 3
    assert np.isfinite(batch.normalize().muons.numpy()).all()
    assert np.isfinite(batch.normalize().primaries.numpy()).all()


def _removed_line(split: str, n: int, scope: str, events: int, muons: int, lost: int, what: str) -> str:
    share = f"{100 * n / events:.2f} % of them" + (
        f", with {100 * lost / muons:.2f} % of their {muons:,} muons" if lost else ""
    )
    return f"muon data, {split} split: {n:,} of {scope} ({share}) {what}; said once"


OUTLIERS = "have more than data.max_muons_per_event={cap} muons and are removed (raise the limit to keep them; data.outliers_dir=DIR writes them out for a look)"


def test_outliers_and_empty_events(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    files = write_set(tmp_path / "d", files=1, events=300)
    _, events = layouts.read_all(files[0])
    cap = int(np.quantile(events.counts, 0.95))
    big = events.counts > cap
    out = tmp_path / "outliers"
    names = []
    for _ in range(2):  # a second run never overwrites the first one's files
        stream = event_stream(
            files,
            100,
            seed=0,
            max_muons_per_event=cap,
            outliers_dir=str(out),
            drop_empty_events=True,
            num_workers=1,
        )
        batches = take(stream, 3)
        stream.close()
        assert all(int(b.counts.max()) <= cap and int(b.counts.min()) > 0 for b in batches)
        assert sum(len(b) for b in batches) == int(((events.counts <= cap) & (events.counts > 0)).sum())
        names.append(sorted(p.name for p in out.iterdir()))
    assert set(names[0]) < set(names[1])
    # Said once per stream (hop): the distinct events, their share of the events and of the muons, the limit,
    # and what to do.
    said = [r.getMessage() for r in caplog.records if "muon data" in r.getMessage()]
    total = int(events.counts.sum())
    outliers = _removed_line(
        "train",
        int(big.sum()),
        "its 300 events",
        300,
        total,
        int(events.counts[big].sum()),
        OUTLIERS.format(cap=cap),
    )
    empty = int((events.counts == 0).sum())
    dropped = _removed_line(
        "train",
        empty,
        "its 300 events",
        300,
        total,
        0,
        "have no muons and are dropped (data.drop_empty_events=true)",
    )
    assert said == [outliers, dropped] * 2
    table = pq.read_table(out).to_pydict()
    n_big = int(big.sum())
    assert len(table["source_row"]) == 2 * n_big
    rows = table["source_row"][:n_big]
    assert set(table["source_file"]) == {files[0]}
    assert sorted(table["primary_minor_id"][:n_big]) == sorted(rows)  # ids are the row numbers here
    assert all(len(m) > cap for m in table["muons"])


def test_removed_events_are_distinct_and_said_once_per_split_and_hop(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 43: 89 distinct events above the cap were said as 71, then 694, then 1,032 (counted again each
    epoch). The training stream and the validation passes of a hop share their counts: each split is said once,
    with its distinct removed events and their share of events and muons, however many epochs and passes met
    them; the next hop says it again, once."""
    from hpctrain.runtime.env import ClusterEnv
    from hpctrain.workloads.muons.events.stream import ValBatches
    from hpctrain.workloads.muons.spec import MuonData

    files = write_set(tmp_path / "d", files=2, events=300, row_group=50)
    per_file = [layouts.read_all(f)[1].counts for f in files]
    counts = np.concatenate(per_file)
    cap = int(np.quantile(counts, 0.9))
    what = OUTLIERS.format(cap=cap)
    big = counts > cap
    train = _removed_line(
        "train", int(big.sum()), "its 600 events", 600, int(counts.sum()), int(counts[big].sum()), what
    )
    val_big = per_file[1] > cap
    val = _removed_line(
        "val",
        int(val_big.sum()),
        "its 300 events",
        300,
        int(per_file[1].sum()),
        int(per_file[1][val_big].sum()),
        what,
    )
    section = MuonData.model_validate(
        {"batch_size": 50, "pin_memory": False, "val_paths": [files[1]], "max_muons_per_event": cap}
    )
    for _hop in range(2):
        caplog.clear()
        stream = event_stream(files, 50, seed=0, max_muons_per_event=cap, prefetch_batches=0)
        with caplog.at_level(logging.WARNING, logger="hpctrain.muons"):
            take(stream, 30)  # two and a half epochs: every event met two or three times
            for _ in range(2):  # two evaluations in the hop
                assert sum(len(b) for b in ValBatches(section, 0, ClusterEnv(), None, stream.counts)) > 0
            assert stream.stats == {"outliers": int(big.sum())}  # distinct
            stream.close()
        assert [r.getMessage() for r in caplog.records] == [train, val]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="hpctrain.muons"):  # a pass of its own (`hpctrain evaluate`)
        assert sum(len(b) for b in ValBatches(section, 0, ClusterEnv(), None)) > 0
    assert [r.getMessage() for r in caplog.records] == [val]


def test_a_training_set_whose_every_event_is_removed_is_one_line(tmp_path: Path) -> None:
    """Issue 45 U1: every event above data.max_muons_per_event gave endless empty batches (a run spinning at 100 %
    CPU); the first whole epoch that keeps no event is one line naming why and what to do."""
    data = synthetic_events(400, 0, 0)
    many = np.flatnonzero(data.counts >= 2)  # every event has two muons or more
    rows = np.concatenate([np.arange(data.offsets[i], data.offsets[i + 1]) for i in many])
    kept = layouts.Events(data.primaries[many], data.muons[rows], data.counts[many], data.ids[many])
    path = tmp_path / "big.parquet"
    layouts.write_events(str(path), kept, "parquet", 50)
    stream = event_stream([str(path)], 20, seed=0, max_muons_per_event=1, prefetch_batches=0)
    with pytest.raises(UserError) as refused:
        for _, batch in zip(range(1000), stream):  # (bounded: a stream that spins fails the test, not hangs)
            assert len(batch) == 0
    stream.close()
    n = len(many)
    assert str(refused.value).startswith(
        f"muon data, train split: no event of the {n} read in epoch 0 is left to train on ({n} have more "
        "than data.max_muons_per_event=1 muons and are removed): raise the limit"
    ), str(refused.value)


def test_one_pass_keeps_the_tail(muon_files: list[str]) -> None:
    got = []
    for rank in range(2):
        stream = event_stream(muon_files, 64, seed=0, rank=rank, world_size=2, split="val")
        got += [keys(b.ids.numpy()) for b, _ in stream.epoch_batches(0, 0)]
    assert len(np.unique(np.concatenate(got))) == 1200 == sum(len(g) for g in got)


def _copy(batch) -> tuple:  # type: ignore[no-untyped-def]
    return tuple(t.clone() for t in (batch.primaries, batch.muons, batch.counts, batch.ids, batch.positions))


def test_kept_batches_are_never_overwritten(muon_files: list[str]) -> None:
    """Workers write into buffers this process lends and reuses once no tensor refers to them: a consumer
    that keeps every batch (two epochs) finds each one as it was handed out, and one that drops them gets
    the buffers reused (so the first part could fail)."""
    kept, copies = [], []
    stream = event_stream(muon_files, 16, seed=4, shuffle_window=100, num_workers=2, prefetch_factor=1)
    try:
        for batch in take(stream, 2 * (stream.samples_per_epoch // 16)):
            kept.append(batch)
            copies.append(_copy(batch))
        assert stream._lent is not None and stream._lent.stats["fitted"] > 0  # results came in lent buffers
        for batch, copy in zip(kept, copies, strict=True):
            assert all(torch.equal(a, b) for a, b in zip(_copy(batch), copy, strict=True))
    finally:
        stream.close()
    # the same order, dropping each batch at once: buffers are lent again and again
    again = event_stream(muon_files, 16, seed=4, shuffle_window=100, num_workers=2, prefetch_factor=1)
    try:
        for batch, copy in zip(again, copies):  # zip stops after the copies: two epochs
            assert all(torch.equal(a, b) for a, b in zip(_copy(batch), copy, strict=True))
            del batch
        assert again._lent is not None
        assert again._lent.stats["fitted"] > again._lent.keep  # more results than buffers: reused
    finally:
        again.close()


def test_without_lent_buffers_the_same_batches(
    muon_files: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where buffers cannot be lent (no memory files) workers write into fresh ones: the same batches."""

    def two_epochs() -> tuple[list[tuple], dict[str, int]]:
        stream = event_stream(muon_files, 16, seed=4, shuffle_window=100, num_workers=2, prefetch_factor=1)
        try:
            got = [_copy(b) for b in take(stream, 2 * (stream.samples_per_epoch // 16))]
            assert stream._lent is not None
            return got, dict(stream._lent.stats)
        finally:
            stream.close()

    lending, lent_stats = two_epochs()
    monkeypatch.setattr(lent_buffers, "can_lend", lambda: False)
    fresh, fresh_stats = two_epochs()
    assert lent_stats["fitted"] > 0 and fresh_stats == {"lent": 0, "fitted": 0}
    assert len(lending) == len(fresh)
    for a, b in zip(lending, fresh, strict=True):
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("rows", [1, 5, 1023, 1024, 1025, 3000])
def test_the_fast_muon_check_misses_no_bad_value(rows: int) -> None:
    """The per-column min/max proof (outliers.muons_fine) accepts good muons and rejects a zero, negative,
    NaN or infinite energy and a NaN or infinite x/y, wherever it sits (also in the rows beyond the last
    full fold of 1024)."""
    from hpctrain.workloads.muons.events.outliers import muons_fine

    good = np.random.default_rng(rows).random((rows, 3), dtype=np.float32) + 0.5
    good[:, 1:] -= 1.0  # x, y of either sign
    assert muons_fine(good)
    bad_values = {0: [0.0, -0.0, -1.0, np.nan, np.inf, -np.inf], 1: [np.nan, np.inf, -np.inf]}
    for col, values in bad_values.items():
        for value in values:
            for row in {0, rows // 2, rows - 1}:
                muons = good.copy()
                muons[row, col if col == 0 else 2 - row % 2] = value
                assert not muons_fine(muons), (col, value, row)


@pytest.mark.parametrize(("first", "then"), [("parquet", "parquet-legacy"), ("parquet-legacy", "parquet")])
def test_a_file_rewritten_in_another_layout_is_one_line(tmp_path: Path, first: str, then: str) -> None:
    """Readers opened while training take the layout the index found (not detected again): a file rewritten in
    another layout with the same row groups still fails with one line naming it, never a wrong read."""
    path = tmp_path / "f.parquet"
    events = synthetic_events(200, 1, 0)
    layouts.write_events(str(path), events, first, 100)
    stream = event_stream([str(path)], 50, seed=0)
    try:
        layouts.write_events(str(path), events, then, 100)
        with pytest.raises(UserError, match=r"f\.parquet: .*on_bad_file=skip"):
            take(stream, 1)
    finally:
        stream.close()


def test_proven_muons_are_not_checked_again_unless_the_file_changed(tmp_path: Path) -> None:
    """A unit whose muons were proven fine is not proven again in a later epoch (0 workers: the same data
    set object), and a file rewritten with a bad muon between epochs (same row groups) is still caught."""
    from hpctrain.workloads.muons.events import decode

    path = tmp_path / "f.parquet"
    events = synthetic_events(200, 1, 0)
    layouts.write_events(str(path), events, "parquet", 100)
    proofs: list[int] = []

    def counted(muons: np.ndarray) -> bool:
        proofs.append(len(muons))
        return decode_fine(muons)

    decode_fine = decode.muons_fine
    stream = event_stream([str(path)], 50, seed=0, shuffle_window=100)
    try:
        decode.muons_fine = counted  # type: ignore[assignment]
        list(stream.epoch_batches(0, 0))
        assert len(proofs) == 2  # one proof per chunk (a row group each)
        list(stream.epoch_batches(1, 0))
        assert len(proofs) == 2  # remembered: no second proof
        nonempty = np.flatnonzero(events.counts > 0)
        events.muons[events.offsets[nonempty[0]], 0] = -1.0  # a negative energy, same row groups
        layouts.write_events(str(path), events, "parquet", 100)
        stream._dataset.close()  # the next read opens the rewritten file (a new inode and mtime)
        with pytest.raises(UserError, match=r"f\.parquet: event at row \d+ .*on_bad_event=skip"):
            list(stream.epoch_batches(2, 0))
    finally:
        decode.muons_fine = decode_fine  # type: ignore[assignment]
        stream.close()


def test_a_file_truncated_in_place_while_open_is_one_line(tmp_path: Path) -> None:
    """A file cut short in place while its reader is open (a copy over it, a full disk) fails with one line
    naming it: read, never memory-mapped (a mapped file cut short kills the process with SIGBUS)."""
    path = tmp_path / "f.parquet"
    layouts.write_events(str(path), synthetic_events(400, 1, 0), "parquet", 100)
    stream = event_stream([str(path)], 50, seed=0, shuffle=False)
    try:
        it = stream.epoch_batches(0, 0)
        next(it)  # the reader is open now
        with open(path, "r+b") as fh:
            fh.truncate(os.path.getsize(path) // 3)
        with pytest.raises(UserError, match=r"f\.parquet: .*on_bad_file=skip"):
            list(it)
    finally:
        stream.close()


def test_units_proven_in_workers_are_remembered_by_the_main_process(tmp_path: Path) -> None:
    """Workers that are not persistent end with each epoch: the units they proved come back with their
    results, so the next epoch's workers (forked from the main process's data set) start knowing them."""
    path = tmp_path / "f.parquet"
    layouts.write_events(str(path), synthetic_events(200, 1, 0), "parquet", 100)
    stream = event_stream([str(path)], 50, seed=0, shuffle_window=100, num_workers=1)
    try:
        assert not stream._dataset._proven
        list(stream.epoch_batches(0, 0))
        assert {(f, u, rows) for f, u, rows, _ in stream._dataset._proven} == {(0, 0, 100), (0, 1, 100)}
    finally:
        stream.close()


def _batches(stream: EventStream, n: int) -> list[tuple[list[int], int, int, int]]:
    """(event keys, muons, epoch, position) of the next n batches."""
    out, it = [], iter(stream)
    for _ in range(n):
        batch = next(it)
        state = stream.state_dict()
        out.append(
            (keys(batch.ids.numpy()).tolist(), float(batch.muons.sum()), state["epoch"], state["position"])
        )
    return out


@pytest.mark.parametrize("world,layout", [(1, "parquet"), (2, "parquet"), (1, "hdf5")])
def test_reading_ahead_changes_no_batch(
    tmp_path: Path, world: int, layout: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """0 workers: the units are decoded on the read-ahead thread, and every batch, epoch and position is the
    one read without it, over three epochs and after a resume mid-epoch (Parquet row groups, HDF5 slices)."""
    muon_files = write_set(tmp_path / "d", layout, row_group=100)
    threads: set[str] = set()
    reader = layouts.HDF5Reader if layout == "hdf5" else layouts.ParquetReader
    fetch = reader.fetch_unit

    def noted(self: layouts.Reader, i: int) -> object:
        threads.add(threading.current_thread().name)
        return fetch(self, i)  # type: ignore[arg-type]

    monkeypatch.setattr(reader, "fetch_unit", noted)
    bs = 24 // world
    for rank in range(world):
        runs = {}
        for ahead in (False, True):
            options = dict(
                rank=rank, world_size=world, shuffle_window=150, read_ahead=ahead, hdf5_unit_events=100
            )
            stream = event_stream(muon_files, bs, seed=2, **options)  # type: ignore[arg-type]
            per_epoch = stream.samples_per_epoch // (bs * world)
            first = _batches(stream, per_epoch + 7)
            state = stream.state_dict()
            stream.close()
            again = event_stream(muon_files, bs, seed=2, **options)  # type: ignore[arg-type]
            again.load_state_dict(state)
            runs[ahead] = first + _batches(again, 2 * per_epoch)
            again.close()
        assert runs[True] == runs[False]
    assert {"MainThread", "hpctrain-read-ahead_0"} <= threads  # both ways taken


def test_a_corrupt_row_group_read_ahead_is_the_same_one_line_or_skip(tmp_path: Path) -> None:
    """A row group that cannot be decoded fails where its batch is due (not when it is read ahead) with the
    same line naming it; with on_bad_file=skip the same events are counted and the same batches follow."""
    from .test_bad_data import corrupt_row_group

    files = write_set(tmp_path / "d", files=2, events=200, row_group=50)
    corrupt_row_group(files[1], 1)
    expected = keys(layouts.read_all(files[0])[1].ids)
    seen = {}
    for ahead in (False, True):
        stream = event_stream(files, 20, seed=0, shuffle=False, read_ahead=ahead)
        try:
            good = take(stream, 12)  # file 0, then file 1's first 40 events (its row group 0)
            assert np.array_equal(np.concatenate([keys(b.ids.numpy()) for b in good[:10]]), expected)
            with pytest.raises(
                UserError, match=rf"{files[1]}: row group 1 cannot be read.*on_bad_file=skip"
            ) as err:
                take(stream, 1)
        finally:
            stream.close()
        run = tmp_path / f"run{ahead}"
        stream = event_stream(
            files, 20, seed=0, shuffle=False, read_ahead=ahead, on_bad_file="skip", run_dir=run
        )
        try:
            # past row group 1 in the second epoch: 350 good events an epoch, 250 more to reach it again
            got = [keys(b.ids.numpy()).tolist() for b in take(stream, 33)]
            assert stream.stats["bad_file_events"] == 50  # row group 1's events, counted once
            seen[ahead] = (str(err.value), got, dict(stream.stats), (run / "bad_files.txt").read_text())
        finally:
            stream.close()
    assert "row group 1 cannot be read" in seen[True][3]
    assert seen[True] == seen[False]


def test_read_ahead_is_on_where_a_gpu_trains_and_off_with_workers(
    muon_files: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """auto: off on CPU (torch's threads use every core), on when CUDA is there; never with workers. YAML's
    on/off and true/false all mean a bool."""
    from hpctrain.workloads.muons.spec import MuonData

    assert [MuonData.model_validate({"read_ahead": v}).read_ahead for v in ("on", "off", True, "auto")] == [
        True,
        False,
        True,
        "auto",
    ]
    with pytest.raises(ValueError, match="read_ahead"):
        MuonData.model_validate({"read_ahead": "sometimes"})
    cases = {}
    for cuda in (False, True):
        monkeypatch.setattr(torch.cuda, "is_available", lambda cuda=cuda: cuda)
        for workers in (0, 1):
            stream = event_stream(muon_files, 16, seed=0, num_workers=workers)
            cases[cuda, workers] = stream.read_ahead, stream._dataset._ahead is not None
            stream.close()
    assert cases == {
        (False, 0): (False, False),
        (False, 1): (False, False),
        (True, 0): (True, True),
        (True, 1): (False, False),
    }
