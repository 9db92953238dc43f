"""Map-style data (regression, fields): a batch larger than the data, bad shards and changed files are one-line
UserErrors naming the sizes or the files (the muon data's own cases: tests/workloads/muons/test_bad_data.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from hpctrain.data.loader import IndexedStream
from hpctrain.errors import UserError
from hpctrain.workloads.fields.dataset import ShardFields
from hpctrain.workloads.fields.generate import write_split
from hpctrain.workloads.regression.task import make_dataset
from tests.conftest import hpctrain


def one_line(call: object) -> str:
    with pytest.raises(UserError) as info:
        call()  # type: ignore[operator]
    assert "\n" not in str(info.value)
    return str(info.value)


def shards(out: Path, n: int = 24, fmt: str = "npy") -> Path:
    prior = [(0.1, 0.5), (0.6, 1.0)]
    write_split(
        out, "train", n, kind="gaussian", seed=1, size=8, box_size=100.0, prior=prior, fmt=fmt, shard_size=8
    )
    return out / "train"


def test_regression_batch_larger_than_the_data_on_the_command_line(tmp_path: Path) -> None:
    done = hpctrain(
        "train", f"run.out_dir={tmp_path}", "data.n_train=100", "data.batch_size=128", cwd=tmp_path
    )
    assert done.code == 2, done.err
    # (the note naming the command line's batch over the preset's may come first)
    assert [line for line in done.err.strip().splitlines() if not line.startswith("note: ")] == [
        "error: the training set holds 100 samples, fewer than one global batch of 128 (data.batch_size=128 x 1 "
        "ranks): lower data.batch_size to at most 100 or use more data"
    ]


def test_batch_larger_than_the_data_per_rank() -> None:
    data = make_dataset(10, 2, 0.0, 0)
    text = one_line(lambda: IndexedStream(data, 4, 0, rank=0, world_size=3))
    assert "10 samples, fewer than one global batch of 12 (data.batch_size=4 x 3 ranks)" in text
    assert "at most 3" in text


@pytest.mark.parametrize("fmt", ["npy", "hdf5"])
def test_missing_or_truncated_shard(tmp_path: Path, fmt: str) -> None:
    folder = shards(tmp_path / "f", fmt=fmt)
    assert len(ShardFields(folder)) == 24
    victim = sorted(folder.glob("shard-00001*"))[-1]  # .npy: its params file; .h5: its one file
    with open(victim, "r+b") as fh:
        fh.truncate(100)
    assert f"{victim.name}" in one_line(lambda: ShardFields(folder)) and "cannot be read" in one_line(
        lambda: ShardFields(folder)
    )
    victim.unlink()
    assert f"{victim}: no such file, but {folder / 'meta.json'} lists it" in one_line(
        lambda: ShardFields(folder)
    )
    assert "has no meta.json" in one_line(lambda: ShardFields(tmp_path / "nothing"))


def test_changed_shards_stop_or_restart_the_epoch(tmp_path: Path) -> None:
    folder = shards(tmp_path / "f")
    stream = IndexedStream(ShardFields(folder), 4, 0, files=ShardFields(folder).file_list())
    state = stream.state_dict() | {"position": 8}
    shutil.rmtree(tmp_path / "f")
    folder = shards(tmp_path / "f", n=32)  # regenerated with more maps

    def resumed(allow: bool) -> IndexedStream:
        data = ShardFields(folder)
        stream = IndexedStream(data, 4, 0, files=data.file_list(), allow_changed_files=allow)
        stream.load_state_dict(state)
        return stream

    text = one_line(lambda: resumed(False))
    assert "2 added (shard-00003-maps.npy, shard-00003-params.npy)" in text
    assert resumed(True).position == 0
