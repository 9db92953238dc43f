"""`hpctrain sample` streams: primaries, generation and the Parquet writer hold one batch at a time, so the
peak memory of a request 20x larger stays where the small one's is (the 10M-event bound, scaled down)."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from hpctrain.errors import UserError
from hpctrain.workloads.muons.events.decoded import Events
from hpctrain.workloads.muons.events.layouts import concat_events, open_reader
from hpctrain.workloads.muons.models import sampling
from hpctrain.workloads.muons.models.sampling import write_stream
from tests.conftest import clean_env
from tests.workloads.muons.test_model_run import data, reference  # noqa: F401 (fixtures)

PEAK = """
import resource, sys
from hpctrain.cli import main
code = main(sys.argv[1:])
print("PEAK_KB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
sys.exit(code)
"""


def sample_peak(model: Path, n: int, out: Path, batch: int) -> int:
    """Peak resident memory (kB) of one `hpctrain sample` process."""
    args = ["sample", str(model), "--n-events", str(n), "--batch-size", str(batch), "--out", str(out)]
    args += ["--device", "cpu", "--seed", "3"]
    proc = subprocess.run(
        [sys.executable, "-c", PEAK, *args], capture_output=True, text=True, env=clean_env(), timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    return int(proc.stdout.split("PEAK_KB")[1].split()[0])


def test_sampling_memory_stays_bounded_as_the_request_grows(reference: Path, tmp_path: Path) -> None:  # noqa: F811
    small = sample_peak(reference, 2_000, tmp_path / "small.parquet", 500)
    large = sample_peak(reference, 40_000, tmp_path / "large.parquet", 500)
    meta = pq.ParquetFile(tmp_path / "large.parquet").metadata
    assert (
        meta.num_rows == 40_000 and meta.num_row_groups == 80
    )  # one row group per batch: written as it came
    muons = pq.read_table(tmp_path / "large.parquet", columns=["muons"]).column("muons")
    held = sum(len(v) for v in muons.combine_chunks().flatten().to_pylist()) * 3 * 4 // 1024  # kB of float32
    # holding the request would add the muons (several copies: torch, NumPy, Arrow) and 40k primaries
    assert large - small < max(20 * 1024, held // 2), (small, large, held)


def test_the_samplers_counts_and_numbers_are_one_line_each() -> None:
    """`hpctrain.load(RUN).sampler`: a float or string count or seed was a TypeError from deep inside, a seed past
    int64 torch's overflow, and wrong fixed counts were said as 'got shape (n,)', the shape asked for."""
    from hpctrain.errors import UserError
    from hpctrain.workloads.muons.models.sampling import _check, _fixed_counts

    for args, said in (
        ((2.5, 0, 8), "n_events: an integer, not 2.5"),
        ((2, "1", 8), "seed: an integer, not '1'"),
        ((2, 0, True), "batch_size: an integer, not True"),
        ((2, 2**63, 8), "seed in 0 .. 2**63-1"),
    ):
        with pytest.raises(UserError, match=re.escape(said)):
            _check(*args)
    for counts, said in (([1.5, 2], "got float64 values"), ([3, -1], "row 1 is -1"), ([1], "got shape (1,)")):
        with pytest.raises(UserError, match=re.escape(said)):
            _fixed_counts(counts, 2)
    assert _fixed_counts([3, 0], 2).tolist() == [3, 0]


def _chunks(n_chunks: int, fail_after: int | None = None) -> Iterator[Events]:
    """Small synthetic chunks (ragged multiplicities, zeros included); raises after `fail_after` chunks."""
    rng = np.random.default_rng(5)
    for k in range(n_chunks):
        if fail_after is not None and k == fail_after:
            raise UserError("the generation failed here")
        counts = rng.integers(0, 6, 7)
        yield Events(
            rng.random((7, 4), dtype=np.float32),
            rng.random((int(counts.sum()), 3), dtype=np.float32),
            counts.astype(np.int64),
            np.stack([np.zeros(7, np.int64), np.arange(7 * k, 7 * k + 7, dtype=np.int64)], 1),
        )


def test_the_stream_writer_keeps_every_chunk_in_order_and_a_failure_leaves_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The chunks are written by a thread while the next one is made: the file still holds every chunk, in order,
    one row group each; a generation or a write that fails mid-stream raises its own error and leaves no file,
    not even a temporary one."""
    out = tmp_path / "gen.parquet"
    assert write_stream(str(out), _chunks(5)) == (35, int(sum(c.counts.sum() for c in _chunks(5))))
    reader = open_reader(str(out))
    got = concat_events([reader.read_unit(u) for u in range(len(reader.unit_rows))])
    want = concat_events(list(_chunks(5)))
    assert reader.unit_rows == [7] * 5
    for name in ("primaries", "muons", "counts", "ids"):
        np.testing.assert_array_equal(getattr(got, name), getattr(want, name), err_msg=name)

    with pytest.raises(UserError, match="the generation failed here"):
        write_stream(str(tmp_path / "failed.parquet"), _chunks(5, fail_after=3))
    calls = []

    def full_disk(self: object, part: Events) -> None:
        calls.append(len(part))
        if len(calls) == 2:
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(sampling._ChunkWriter, "write", full_disk)
    with pytest.raises(OSError, match="No space left"):
        write_stream(str(tmp_path / "full.parquet"), _chunks(5))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gen.parquet"]
