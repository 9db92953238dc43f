"""A data file rewritten at the same size is a change (sampled content evidence); a copy with a new mtime is not;
a checkpoint written before the evidence existed still resumes."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from hpctrain.data.fingerprint import SAMPLE_BYTES, FileList, sample_ranges
from hpctrain.data.loader import IndexedStream
from hpctrain.errors import UserError
from hpctrain.workloads.fields.dataset import ShardFields
from hpctrain.workloads.fields.generate import write_split
from tests.workloads.muons.conftest import event_stream, write_set


def shards(out: Path, seed: int, fmt: str, size: int = 8) -> Path:
    prior = [(0.1, 0.5), (0.6, 1.0)]
    write_split(
        out,
        "train",
        24,
        kind="gaussian",
        seed=seed,
        size=size,
        box_size=100.0,
        prior=prior,
        fmt=fmt,
        shard_size=8,
    )
    return out / "train"


def saved_state(folder: Path) -> dict[str, Any]:
    data = ShardFields(folder)
    return IndexedStream(data, 4, 0, files=data.file_list()).state_dict() | {"position": 8}


def resume(folder: Path, state: dict[str, Any], allow: bool = False) -> IndexedStream:
    data = ShardFields(folder)
    stream = IndexedStream(data, 4, 0, files=data.file_list(), allow_changed_files=allow)
    stream.load_state_dict(state)
    return stream


@pytest.mark.parametrize("fmt", ["npy", "hdf5"])
def test_a_file_rewritten_at_the_same_size_is_refused_unless_allowed(tmp_path: Path, fmt: str) -> None:
    folder = shards(tmp_path / "f", seed=1, fmt=fmt)
    state = saved_state(folder)
    sizes = {p.name: p.stat().st_size for p in folder.iterdir()}
    victim = Path(next(n for n in ShardFields(folder).file_list().names if "shard-00001" in n))
    other = shards(tmp_path / "g", seed=2, fmt=fmt)
    shutil.copyfile(other / victim.name, victim)  # other events, same size
    assert {p.name: p.stat().st_size for p in folder.iterdir()} == sizes
    with pytest.raises(UserError) as info:
        resume(folder, state)
    text = str(info.value)
    assert "\n" not in text and f"{victim.name} rewritten (same size, other bytes)" in text
    assert "data.allow_changed_files=true" in text
    assert resume(folder, state, allow=True).position == 0


def test_a_copy_with_new_mtimes_and_an_old_checkpoint_resume(tmp_path: Path) -> None:
    folder = shards(tmp_path / "f", seed=1, fmt="npy")
    state = saved_state(folder)
    moved = tmp_path / "scratch" / "train"
    shutil.copytree(folder, moved, copy_function=shutil.copyfile)  # new mtimes, same bytes
    later = os.stat(folder / "meta.json").st_mtime_ns + 10**9
    for p in moved.iterdir():
        os.utime(p, ns=(later, later))
    assert resume(moved, state).position == 8
    # written before the evidence existed: compared by names, sizes and events alone
    old = state | {"files": {k: v for k, v in state["files"].items() if k not in ("mtimes", "samples")}}
    victim = Path(ShardFields(folder).file_list().names[0])
    shutil.copyfile(shards(tmp_path / "g", seed=2, fmt="npy") / victim.name, victim)
    assert resume(folder, old).position == 8


def test_sampled_ranges_are_few_small_and_cover_head_and_tail() -> None:
    assert sample_ranges(0) == []
    assert sample_ranges(100) == [(0, 100)]
    ranges = sample_ranges(10**9)
    assert len(ranges) == 5 and all(n == SAMPLE_BYTES for _, n in ranges)
    assert ranges[0][0] == 0 and ranges[-1] == (10**9 - SAMPLE_BYTES, SAMPLE_BYTES)
    assert FileList(["pelican://host/a.h5"], [5], [1]).state()["samples"] == [""]  # nothing read remotely


def rewrite_same_size(target: Path, other: Path) -> None:
    """Other bytes in the middle half of `target` (another file's data pages), its head, footer and size kept,
    and a later modification time (as any rewrite has)."""
    data, donor = bytearray(target.read_bytes()), other.read_bytes()
    start, end = len(data) // 4, 3 * len(data) // 4
    data[start:end] = donor[len(donor) // 4 :][: end - start]
    mtime = target.stat().st_mtime_ns
    target.write_bytes(bytes(data))
    os.utime(target, ns=(mtime + 2 * 10**9, mtime + 2 * 10**9))


def test_a_muon_file_rewritten_at_the_same_size_is_refused(tmp_path: Path) -> None:
    """The muon stream's local Parquet files carry the same evidence as the fields' shards."""
    files = write_set(tmp_path / "m", files=2, events=200, seed=5)
    first = event_stream(files, 50, 0, num_workers=0)
    state = first.state_dict() | {"position": 100}
    first.close()
    size = os.path.getsize(files[1])
    rewrite_same_size(Path(files[1]), Path(write_set(tmp_path / "o", files=2, events=200, seed=9)[1]))
    assert os.path.getsize(files[1]) == size
    again = event_stream(files, 50, 0, num_workers=0)
    with pytest.raises(UserError, match=r"f1\.parquet rewritten \(same size, other bytes\)"):
        again.load_state_dict(state)
    again.close()


def edit_one_map_in_place(shard: Path, index: int) -> None:
    """One map of an HDF5 shard overwritten in place (h5py r+): its bytes only, the size kept, a later mtime."""
    import h5py

    mtime = shard.stat().st_mtime_ns
    with h5py.File(shard, "r+") as h5:
        h5["maps"][index] = h5["maps"][index] + 1.0
    os.utime(shard, ns=(mtime + 2 * 10**9, mtime + 2 * 10**9))


def map_outside_the_sampled_ranges(shard: Path) -> int:
    """A map of the shard none of whose bytes the sampled ranges read (the edit they would miss)."""
    import h5py

    with h5py.File(shard, "r") as h5:
        maps = h5["maps"]
        rows = [maps.id.get_chunk_info(i).byte_offset for i in range(maps.shape[0])]
        size = maps.id.get_chunk_info(0).size
    ranges = sample_ranges(shard.stat().st_size)
    for index, start in enumerate(rows):
        if all(start + size <= a or start >= a + n for a, n in ranges):
            return index
    raise AssertionError("every map meets a sampled range: make the shard larger")


def test_one_map_of_an_hdf5_shard_edited_in_place_is_refused(tmp_path: Path) -> None:
    """W3: the sampled ranges miss a map edited in place; the whole-file hash saved with the checkpoint does not
    (the file's mtime moved, so it is hashed again)."""
    folder = shards(tmp_path / "f", seed=1, fmt="hdf5", size=64)  # maps of 16 KiB: most miss every range
    state = saved_state(folder)
    assert all(state["files"]["wholes"])
    victim = Path(next(n for n in ShardFields(folder).file_list().names if "shard-00001" in n))
    size = victim.stat().st_size
    edit_one_map_in_place(victim, map_outside_the_sampled_ranges(victim))
    assert victim.stat().st_size == size
    with pytest.raises(UserError, match=rf"{victim.name} rewritten \(same size, other bytes\)"):
        resume(folder, state)


def test_a_file_past_the_whole_hash_budget_passes_on_its_samples_with_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """What passes is said: a touched file without a saved whole hash is named, with what it was compared by."""
    import hpctrain.data.fingerprint as fingerprint

    folder = shards(tmp_path / "f", seed=1, fmt="hdf5", size=64)
    monkeypatch.setattr(fingerprint, "WHOLE_BYTES", 0)
    fingerprint._hashed.clear()
    state = saved_state(folder)
    assert state["files"]["wholes"] == [""] * len(state["files"]["names"])
    victim = Path(next(n for n in ShardFields(folder).file_list().names if "shard-00001" in n))
    edit_one_map_in_place(victim, map_outside_the_sampled_ranges(victim))
    with caplog.at_level("WARNING", logger="hpctrain.data"):
        assert resume(folder, state).position == 8
    said = [r.getMessage() for r in caplog.records if "sampled ranges" in r.getMessage()]
    assert len(said) == 1 and victim.name in said[0] and "would go unseen" in said[0]
