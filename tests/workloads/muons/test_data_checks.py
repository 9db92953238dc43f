"""data.memory_cache_mb (a bounded LRU of Parquet bytes that hits) and logging.tensorboard.hist_max_muons."""

from __future__ import annotations

from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from hpctrain.workloads.muons.events import file_cache, layouts
from tests.conftest import hpctrain
from tests.workloads.muons.conftest import write_set
from tests.workloads.muons.test_model_run import wgan_overrides


def test_memory_cache_hits_and_stays_bounded(tmp_path: Path) -> None:
    files = write_set(tmp_path / "data", files=3, events=400, row_group=100)
    sizes = [Path(f).stat().st_size for f in files]
    cache = file_cache.configure(1)  # 1 MB: room for a few of these files
    try:
        first = layouts.open_reader(files[0]).read_unit(1)
        again = layouts.open_reader(files[0]).read_unit(1)
        assert (cache.hits, cache.misses) == (1, 1)
        assert (first.counts == again.counts).all() and (first.muons == again.muons).all()
        # a bound below the three files: the least recently used one goes
        small = file_cache.configure(0)
        small.max_bytes = sum(sizes) - 1
        for path in (files[0], files[1], files[2], files[0]):
            layouts.open_reader(path).close()
        assert small.hits == 0 and small.misses == 4 and small.held_bytes <= small.max_bytes
        layouts.open_reader(files[0]).close()  # read again just now: the newest
        assert small.hits == 1
        # a file changed on disk is read again, not served stale
        layouts.write_events(files[0], layouts.read_all(files[1])[1], "parquet", 100)
        assert (
            layouts.open_reader(files[0]).read_unit(0).counts == layouts.read_all(files[1])[1].counts[:100]
        ).all()
    finally:
        file_cache.configure(0)


def test_cache_and_histogram_cap_through_the_cli(tmp_path: Path) -> None:
    data = tmp_path / "data"
    write_set(data / "train", files=1, events=64, row_group=32, seed=3)
    write_set(data / "val", files=1, events=32, row_group=32, seed=4)
    args = [
        *wgan_overrides(data, tmp_path / "out"),
        "train.total_updates=2",
        "logging.gpu_every_seconds=0",
        "data.memory_cache_mb=8",
        f"logging.tensorboard.dir={tmp_path / 'tb'}",
        "logging.tensorboard.run_name=r",
        "logging.tensorboard.hist_every=1",
        "logging.tensorboard.hist_max_muons=5",
    ]
    done = hpctrain("train", *args, cwd=tmp_path)
    assert done.code == 0, done.err
    acc = EventAccumulator(str(tmp_path / "tb" / "r"), size_guidance={"histograms": 0})
    acc.Reload()
    tags = acc.Tags()["histograms"]
    assert tags, "no histogram written"
    assert all(h.histogram_value.num <= 5 for tag in tags for h in acc.Histograms(tag))
    assert any(h.histogram_value.num == 5 for tag in tags for h in acc.Histograms(tag))


def test_first_batch_report_names_each_file_once_and_differs(tmp_path: Path) -> None:
    data = tmp_path / "data"
    write_set(data / "train", files=2, events=64, row_group=32, seed=3)
    write_set(data / "val", files=1, events=32, row_group=32, seed=4)
    args = [*wgan_overrides(data, tmp_path / "out"), "train.total_updates=6", "logging.gpu_every_seconds=0"]
    done = hpctrain("train", *args, "data.report_first_batch=true", cwd=tmp_path)
    assert done.code == 0, done.err
    lines = [
        line.split("first batch of ", 1)[1]
        for line in (done.out + done.err).splitlines()
        if "first batch of" in line
    ]
    paths = sorted(line.split(" (pid")[0] for line in lines)
    expected = [
        str(data / "train" / "f0.parquet"),
        str(data / "train" / "f1.parquet"),
        str(data / "val" / "f0.parquet"),
    ]
    assert paths == sorted(expected), lines  # each file once (one process: num_workers=0)
    figures = {line.split("): ", 1)[1] for line in lines}
    assert len(figures) == 3, lines  # the files' figures differ
    quiet = hpctrain("train", *args, "run.name=quiet", cwd=tmp_path)
    assert quiet.code == 0 and "first batch of" not in quiet.out + quiet.err
