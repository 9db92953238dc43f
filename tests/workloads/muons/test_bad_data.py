"""Bad muon data: every mistake is ONE line naming the thing and what to do (exit 2), or a listed skip with a
warning; and a resume never continues at the same position in another file list.

The CLI tests run `python -m hpctrain train` as a user would, on tiny files; the rest check the same errors on
the loader directly (cheaper), and a property test feeds corrupted bytes to the layout detection and readers.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import h5py
import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hpctrain.errors import UserError
from hpctrain.remote.expand import expand_paths
from hpctrain.workloads.muons.data_verbs import synthetic_events
from hpctrain.workloads.muons.events import layouts
from hpctrain.workloads.muons.events.event_index import build_index
from hpctrain.workloads.muons.events.stream import EventStream
from tests.conftest import ROOT, Done, hpctrain
from tests.workloads.muons.conftest import event_stream, write_set


def train(tmp_path: Path, *overrides: str, name: str = "t") -> Done:
    """A tiny `hpctrain train` of the multiplicity model (fast) on the given data."""
    return hpctrain(
        "train",
        "--config",
        str(ROOT / "configs" / "muons_multiplicity.yaml"),
        f"run.out_dir={tmp_path / 'runs'}",
        f"run.name={name}",
        "data.val_paths=[]",
        "data.batch_size=50",
        "data.shuffle_window=1",
        "model.multiplicity.hidden=[8]",
        "train.total_updates=2",
        "train.eval_every=0",
        "checkpoint.every=1",
        "logging.log_every=1",
        *overrides,
        cwd=tmp_path,
    )


def error_line(done: Done) -> str:
    """The one line a user mistake leaves on stderr (asserts exit 2, no traceback, nothing else)."""
    assert done.code == 2, done.err
    # Notes, warnings and the start's log lines may come first; the error is one line, and no traceback.
    lines = [line for line in done.err.strip().splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and "Traceback" not in done.err, done.err
    return lines[0]


def user_error(call: Callable[[], object]) -> str:
    """The message of the UserError `call` raises (asserted to be one line)."""
    with pytest.raises(UserError) as info:
        call()
    text = str(info.value)
    assert "\n" not in text, text
    return text


def truncate(path: str | Path, keep: float = 0.5) -> None:
    with open(path, "r+b") as fh:
        fh.truncate(int(os.path.getsize(path) * keep))


def corrupt_row_group(path: str | Path, group: int) -> None:
    """Garble the pages of one row group's muons (the footer stays valid: found only when that group is read). The
    column chunk starts at its dictionary page where it has one (its size counts from there: from the data page
    the garbling ran into the next row group)."""
    col = pq.ParquetFile(path).metadata.row_group(group).column(3)
    start = col.dictionary_page_offset if col.has_dictionary_page else col.data_page_offset
    data = bytearray(Path(path).read_bytes())
    for i in range(start + 40, start + col.total_compressed_size - 40, 7):
        data[i] ^= 0xFF
    Path(path).write_bytes(bytes(data))


# ---- the real command line ----------------------------------------------------------------------------------


def test_missing_path_and_truncated_file_are_one_line(tmp_path: Path) -> None:
    line = error_line(train(tmp_path, f"data.paths=[{tmp_path / 'nope'}]"))
    # (found by the pre-flight check, before anything is built)
    assert "nope: no such file or folder" in line and "mounted" in line
    files = write_set(tmp_path / "d", files=2, events=100, row_group=50)
    truncate(files[1])
    line = error_line(train(tmp_path, f"data.paths=[{tmp_path / 'd'}]"))
    assert line.startswith(f"error: {files[1]}: cannot be read, truncated or corrupt (") and line.endswith(
        "set data.on_bad_file=skip to go on without it"
    )


def test_bad_and_empty_files_skipped_with_a_warning(tmp_path: Path) -> None:
    """on_bad_file=skip: truncated and 0-byte Parquet and HDF5 files are listed in bad_files.txt; valid files
    without events (every layout) are skipped with a warning; training goes on."""
    data = tmp_path / "d"
    write_set(data, files=2, events=100, row_group=50)
    h5 = write_set(tmp_path / "h5", layout="hdf5", files=1, events=100)[0]
    shutil.copy(h5, data / "cut.h5")
    truncate(data / "cut.h5", 0.3)
    shutil.copy(data / "f1.parquet", data / "cut.parquet")
    truncate(data / "cut.parquet")
    (data / "zero.parquet").write_bytes(b"")
    (data / "zero.h5").write_bytes(b"")
    for layout in layouts.LAYOUTS:
        name = f"none-{layout}" + (".h5" if layout == "hdf5" else ".parquet")
        layouts.write_events(str(data / name), layouts.concat_events([]), layout)
    done = train(tmp_path, f"data.paths=[{data}]", "data.on_bad_file=skip")
    assert done.code == 0, done.err
    assert "Traceback" not in done.err and "finished at update 2/2" in done.out
    listed = dict(line.split("\t") for line in (tmp_path / "runs/t/bad_files.txt").read_text().splitlines())
    assert sorted(Path(p).name for p in listed) == ["cut.h5", "cut.parquet", "zero.h5", "zero.parquet"]
    assert all("0 bytes" in listed[str(data / n)] for n in ("zero.h5", "zero.parquet"))
    assert "skipping 4 file(s) without events" in done.err
    assert done.err.count("skipping bad file") == 4


def test_corrupt_row_group_met_in_a_worker_is_one_line(tmp_path: Path) -> None:
    files = write_set(tmp_path / "d", files=1, events=200, row_group=50)
    corrupt_row_group(files[0], 1)
    common = (f"data.paths=[{tmp_path / 'd'}]", "data.num_workers=1", "train.total_updates=4")
    line = error_line(train(tmp_path, *common))
    assert re.match(
        rf"error: {re.escape(files[0])}: row group \d cannot be read, truncated or corrupt \(", line
    )
    done = train(tmp_path, *common, "data.on_bad_file=skip", name="skip")
    assert done.code == 0, done.err
    assert re.match(
        rf"{re.escape(files[0])}\trow group \d cannot", (tmp_path / "runs/skip/bad_files.txt").read_text()
    )


def test_batch_larger_than_the_data_says_the_sizes(tmp_path: Path) -> None:
    write_set(tmp_path / "d", files=2, events=100, row_group=50)
    line = error_line(train(tmp_path, f"data.paths=[{tmp_path / 'd'}]", "data.batch_size=5000"))
    assert line == (
        "error: the training files hold 200 events, fewer than one global batch of 5000 (data.batch_size=5000 "
        "x 1 ranks): lower data.batch_size to at most 200 or add files"
    )


def test_files_changed_between_hops_stop_or_restart_the_epoch(tmp_path: Path) -> None:
    data = tmp_path / "d"
    files = write_set(data, files=2, events=100, row_group=50)
    assert train(tmp_path, f"data.paths=[{data}]").code == 0
    shutil.copy(files[1], data / "f2.parquet")  # a file added to the folder between two hops
    # the longer run is accepted (its cosine restarts: tests/train/test_extend.py): what is judged is the data
    more = (
        f"data.paths=[{data}]",
        "train.total_updates=4",
        "checkpoint.accept_changes=[train.total_updates]",
    )
    line = error_line(train(tmp_path, *more))
    assert line == (
        "error: the data files changed since the checkpoint was written: 1 added (f2.parquet); the saved "
        "position would fall on other samples. Restore the files, or set data.allow_changed_files=true to "
        "restart epoch 0 from its start with the new list"
    )
    done = train(tmp_path, *more, "data.allow_changed_files=true")
    assert done.code == 0, done.err
    assert "1 added (f2.parquet); data.allow_changed_files=true: epoch 0 restarts from its start" in done.err
    assert "finished at update 4/4" in done.out


# ---- the same errors on the loader --------------------------------------------------------------------------


def test_path_mistakes(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / ".hidden.parquet").write_bytes(b"x")
    assert "empty: the folder is empty" in user_error(lambda: expand_paths([str(tmp_path / "empty")]))
    pattern = str(tmp_path / "*.h5")
    assert user_error(lambda: expand_paths([pattern])).endswith(
        "no file matches this pattern (check the folder and the pattern)"
    )
    folder = tmp_path / "data.parquet"  # a folder named like a file, given as the file
    folder.mkdir()
    assert "is a folder, not a file" in user_error(lambda: layouts.open_reader(str(folder)))


def test_valid_files_without_events_in_every_layout(tmp_path: Path) -> None:
    empty = []
    for layout in layouts.LAYOUTS:
        path = tmp_path / (f"{layout}.h5" if layout == "hdf5" else f"{layout}.parquet")
        layouts.write_events(str(path), layouts.concat_events([]), layout)
        empty.append(str(path))
        assert len(layouts.read_all(str(path))[1]) == 0  # read as empty, not as an unknown layout
    assert "no events in the 4 data file(s) (0 readable, 4 empty)" in user_error(lambda: build_index(empty))
    full = write_set(tmp_path / "d", files=1, events=100)
    assert build_index(empty + full).files == full


def test_hdf5_mistakes(tmp_path: Path) -> None:
    path = tmp_path / "x.h5"
    with h5py.File(path, "w") as fh:
        fh.create_dataset("primaries", data=np.zeros((3, 7), np.float32))
        fh.create_dataset("counts", data=np.zeros(3, np.int32))
    assert "unknown HDF5 layout (missing ['muons'])" in user_error(lambda: build_index([str(path)]))
    with h5py.File(path, "a") as fh:
        fh.create_dataset("muons", data=np.zeros((5, 6), np.float32))  # 5 muons, counts sum to 0
    assert "counts do not match" in user_error(lambda: layouts.open_reader(str(path)))
    assert build_index([str(path), *write_set(tmp_path / "d", files=1)], on_bad_file="skip").total == 400


def test_unreadable_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    files = write_set(tmp_path / "d", files=2, events=100)
    real = pq.ParquetFile

    def no_permission(path: str, *args: object, **kwargs: object) -> object:
        if str(path) == files[1]:  # as a file without read permission (the tests may run as root)
            raise PermissionError(13, "Permission denied", path)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(pq, "ParquetFile", no_permission)
    text = user_error(lambda: build_index(files))
    assert text == (
        f"{files[1]}: cannot be read: permission denied; check the file's permissions; set data.on_bad_file=skip "
        "to go on without it"
    )


@pytest.mark.parametrize("workers", [0, 1])
def test_file_gone_between_index_and_read(tmp_path: Path, workers: int) -> None:
    files = write_set(tmp_path / "d", files=2, events=100, row_group=50)
    stream = event_stream(files, 50, seed=0, shuffle=False, num_workers=workers)
    os.unlink(files[0])
    try:
        text = user_error(lambda: next(iter(stream)))
    finally:
        stream.close()
    assert text.startswith(f"{files[0]}: no such file") and "on_bad_file=skip" in text


def test_file_changed_between_index_and_read(tmp_path: Path) -> None:
    files = write_set(tmp_path / "d", files=1, events=100, row_group=50)
    stream = event_stream(files, 50, seed=0, shuffle=False)
    write_set(tmp_path / "d", files=1, events=100, row_group=25)  # rewritten with other row groups
    try:
        text = user_error(lambda: next(iter(stream)))
    finally:
        stream.close()
    assert "changed since the run indexed it (units of [25, 25, 25, 25] events, the index [50, 50])" in text


def test_bad_event_is_one_line(tmp_path: Path) -> None:
    data = synthetic_events(60, 0, 0)
    data.primaries[5, 0] = 0.0
    layouts.write_events(str(tmp_path / "bad.parquet"), data, "parquet")
    stream = event_stream([str(tmp_path / "bad.parquet")], 60, seed=0, shuffle=False, num_workers=1)
    try:
        assert "event at row 5 has a zero" in user_error(lambda: next(iter(stream)))
    finally:
        stream.close()


def test_resume_checks_the_file_list(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    files = write_set(tmp_path / "d", files=3, events=100, row_group=50)
    saved = event_stream(files, 50, seed=0).state_dict()
    saved["position"] = 100

    def resumed(paths: list[str], state: dict, allow: bool = False) -> EventStream:
        stream = event_stream(paths, 50, seed=0, allow_changed_files=allow)
        stream.load_state_dict(state)
        return stream

    assert resumed(files, saved).position == 100
    text = user_error(lambda: resumed(files[:2], saved))
    assert "1 removed (f2.parquet)" in text and "data.allow_changed_files=true" in text
    write_set(tmp_path / "d", files=3, events=120, row_group=50)  # same names, other sizes
    text = user_error(lambda: resumed(files, saved))
    assert "3 changed (f0.parquet " in text and " bytes" in text
    assert resumed(files, saved, allow=True).position == 0  # the epoch restarts with the new list
    # the data moved to another folder: same names, sizes and events, so the same order
    moved = shutil.copytree(tmp_path / "d", tmp_path / "elsewhere")
    state = event_stream(files, 50, seed=0).state_dict() | {"position": 100}
    assert resumed(sorted(str(p) for p in Path(moved).iterdir()), state).position == 100
    # a checkpoint from before the check: accepted, with a warning
    old = {k: v for k, v in state.items() if k != "files"}
    assert resumed(files, old).position == 100
    assert "holds no list of its data files" in caplog.text


# ---- corrupted bytes never escape as anything but a one-line UserError ---------------------------------------


def _valid_files(folder: Path) -> dict[str, bytes]:
    events = synthetic_events(30, 7, 0)
    out = {}
    for layout in layouts.LAYOUTS:
        path = folder / (f"{layout}.h5" if layout == "hdf5" else f"{layout}.parquet")
        layouts.write_events(str(path), events, layout, row_group_size=10)
        out[path.name] = path.read_bytes()
    return out


@pytest.fixture(scope="module")
def valid_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    return _valid_files(tmp_path_factory.mktemp("valid"))


@st.composite
def corrupted(draw: st.DrawFn, originals: dict[str, bytes]) -> tuple[str, bytes]:
    name = draw(st.sampled_from(sorted(originals)))
    data = bytearray(originals[name])
    how = draw(st.sampled_from(["truncate", "flip", "splice", "random"]))
    if how == "truncate":
        data = data[: draw(st.integers(0, len(data) - 1))]
    elif how == "flip":
        for _ in range(draw(st.integers(1, 20))):
            data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
    elif how == "splice":
        a = draw(st.integers(0, len(data)))
        data[a:a] = draw(st.binary(min_size=1, max_size=64))
    else:
        head = draw(st.sampled_from([b"PAR1", layouts.HDF5_MAGIC, b""]))
        data = bytearray(head + draw(st.binary(max_size=2048)))
    return name, bytes(data)


def _check_events(events: layouts.Events) -> None:
    n = len(events.counts)
    assert events.primaries.shape == (n, 4) and events.ids.shape == (n, 2)
    assert events.muons.ndim == 2 and events.muons.shape[1] == 3
    assert (events.counts >= 0).all() and int(events.counts.sum()) == len(events.muons)


def test_corrupted_bytes_give_a_valid_read_or_one_line(tmp_path: Path, valid_files: dict[str, bytes]) -> None:
    @settings(
        max_examples=300,
        deadline=None,
        derandomize=True,  # reproducible: the same examples on every run
        database=None,
        print_blob=False,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(corrupted(valid_files))
    def check(case: tuple[str, bytes]) -> None:
        name, data = case
        path = tmp_path / name
        path.write_bytes(data)
        try:
            reader = layouts.open_reader(str(path), hdf5_unit_events=10)
            try:
                for unit in range(len(reader.unit_rows)):
                    events = reader.read_unit(unit)
                    _check_events(events)
                    assert len(events) == reader.unit_rows[unit]
            finally:
                reader.close()
        except UserError as err:
            assert "\n" not in str(err) and str(path) in str(err), str(err)

    check()


def test_a_bad_file_met_mid_run_saves_the_updates_before_it(tmp_path: Path) -> None:
    """Nothing lost: a corrupt row group found at update 2 ends the run with one line (exit 2) after the update
    before it was saved, and once the file is skipped the same command continues from that save."""
    files = write_set(tmp_path / "d", files=1, events=200, row_group=50)
    corrupt_row_group(files[0], 1)
    common = (
        f"data.paths=[{tmp_path / 'd'}]",
        "data.shuffle=false",  # the bad group is the second batch
        "train.total_updates=4",
        "checkpoint.every=100",  # no periodic save: the one before the error is the run's own
    )
    line = error_line(train(tmp_path, *common))
    assert "row group 1 cannot be read" in line, line
    assert "the 1 updates done so far are saved" in line, line
    run = tmp_path / "runs" / "t"
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_00000001.pt"
    summary = json.loads((run / "summary.json").read_text())
    assert (summary["status"], summary["reason"], summary["step"]) == ("stopped", "data_error", 1)
    done = train(tmp_path, *common, "data.on_bad_file=skip")
    assert done.code == 0, done.err
    assert "resumed from" in done.out and "at update 1" in done.out


def _bundles_of_two_or_more(path: Path, events: int, seed: int) -> None:
    data = synthetic_events(events, seed, 0)
    many = np.flatnonzero(data.counts >= 2)
    rows = np.concatenate([np.arange(data.offsets[i], data.offsets[i + 1]) for i in many])
    path.parent.mkdir(parents=True, exist_ok=True)
    kept = layouts.Events(data.primaries[many], data.muons[rows], data.counts[many], data.ids[many])
    layouts.write_events(str(path), kept, "parquet", 100)


def test_data_whose_every_event_is_removed_is_one_line_or_no_figure(tmp_path: Path) -> None:
    """Issue 45 U1: a training set whose every event is above data.max_muons_per_event spun at 100 % CPU for ever;
    now one line, exit 2, and no checkpoint (nothing trained: a fixed config starts afresh). A validation set
    emptied the same way gives no figure (it gave val_loss 0, which would win best.pt)."""
    _bundles_of_two_or_more(tmp_path / "big" / "f0.parquet", 400, 5)
    done = train(
        tmp_path, f"data.paths=[{tmp_path / 'big'}]", "data.max_muons_per_event=1", "data.batch_size=16"
    )
    line = error_line(done)
    assert (
        line.startswith("error: muon data, train split: no event of the ") and "is left to train on" in line
    )
    assert (
        "max_muons_per_event=1" in line and not (tmp_path / "runs" / "t" / "checkpoints" / "latest").exists()
    )
    assert (
        "of its" in done.err and "100.00 % of them, with 100.00 % of their" in done.err
    )  # said once, before
    files = write_set(tmp_path / "some", files=1, events=300)
    done = train(
        tmp_path,
        f"data.paths=[{files[0]}]",
        f"data.val_paths=[{tmp_path / 'big'}]",
        "data.max_muons_per_event=1",
        "data.batch_size=16",
        "train.eval_every=1",
        name="v",
    )
    assert done.code == 0, done.err
    assert "eval at update 2: the validation data gave no sample to judge" in done.out
    records = [
        json.loads(line) for line in (tmp_path / "runs" / "v" / "metrics.jsonl").read_text().splitlines()
    ]
    assert not any("val_loss" in r for r in records)
