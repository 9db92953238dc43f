"""Training from pelican:// inputs: the muon loader stages files just ahead of use through the real pelicanfs
client and a loopback federation; checkpoints mirrored after each commit."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from hpctrain.data.fingerprint import SAMPLE_BYTES
from hpctrain.data.staging import staging_root
from hpctrain.data.stream.staged import StagingSpec
from hpctrain.errors import UserError
from hpctrain.remote.expand import expand_paths
from tests.integration.pelican_fixtures import FederationSetup, StagingLog, pelican_federation
from tests.integration.pelican_server import Namespace
from tests.workloads.muons.conftest import event_stream

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
N_FILES, EVENTS, ROW_GROUP = 4, 300, 100


def hpctrain(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> str:
    """Run the real command line; returns stdout + stderr (asserts success)."""
    proc = subprocess.run(
        [sys.executable, "-m", "hpctrain", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        cwd=cwd,
        timeout=300,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    return out


@pytest.fixture(scope="module")
def muon_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny muon data set made by `hpctrain data generate` (4 files x 300 events, row groups of 100)."""
    out = tmp_path_factory.mktemp("muons")
    hpctrain(
        "data", "generate", "--kind", "muons", "--out", str(out), "--files", str(N_FILES),
        "--events-per-file", str(EVENTS), "--row-group-size", str(ROW_GROUP), "--seed", "3",
    )  # fmt: skip
    return out


@pytest.fixture
def served(tmp_path: Path, muon_data: Path) -> Iterator[FederationSetup]:
    """The muon files served by a loopback federation under /ns/muons/."""
    with pelican_federation(tmp_path, n_files=0) as fed:
        shutil.copytree(muon_data, fed.root / "ns" / "muons")
        yield fed


def local_files(muon_data: Path) -> list[str]:
    return sorted(str(p) for p in muon_data.glob("*.parquet"))


def staged_files(fed: FederationSetup, job: str) -> list[Path]:
    root = staging_root(fed.staging(), job)
    return [p for p in root.iterdir() if p.is_file() and p.suffix == ".parquet"]


class ScratchWatch:
    """Polls the staging folder in the background: the most data files (and bytes) seen there at once."""

    def __init__(self, fed: FederationSetup, job: str) -> None:
        self.fed, self.job, self.most, self.most_bytes = fed, job, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            files = staged_files(self.fed, self.job)
            self.most = max(self.most, len(files))
            with contextlib.suppress(FileNotFoundError):  # deleted while we look
                self.most_bytes = max(self.most_bytes, sum(p.stat().st_size for p in files))
            self._stop.wait(0.002)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.most


def _length(byte_range: str) -> int:
    first, _, last = byte_range.removeprefix("bytes=").partition("-")
    return int(last) - int(first) + 1


def ids(batch: object) -> np.ndarray:
    return batch.ids.numpy()  # type: ignore[attr-defined]


@pytest.mark.parametrize("workers", [0, 1])
def test_stream_stages_ahead_in_reading_order(
    served: FederationSetup,
    muon_data: Path,
    workers: int,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """What must hold however loaded the machine: the same batches as from local files; downloads start in
    reading order, at most `ahead` files past the one being read, within the byte budget; every file is
    complete before it is read; what the budget or delete_after_use removed is fetched again."""
    fed = served
    uris = expand_paths([fed.uri("/ns/muons/*.parquet")], fed.pelican)
    size = max(p.stat().st_size for p in muon_data.glob("*.parquet"))
    # ahead 3 but room for 3 files: the budget bounds the prefetch (a chunk may need two files at once; a
    # worker's items in flight need more: there `ahead` alone)
    ahead, room = (3, 3) if workers == 0 else (1, N_FILES)
    cfg = fed.staging(ahead=3, max_bytes=3 * size) if workers == 0 else fed.staging(ahead=1)
    job = f"w{workers}"
    spec = StagingSpec(staging=cfg, pelican=fed.pelican, job_id=job)
    stream = event_stream(uris, 100, seed=4, shuffle_window=150, num_workers=workers, staging=spec)
    # the index came from the footers (a Range GET near the end of each file) and the content evidence (five
    # small sampled ranges: data/fingerprint.py), nothing was staged
    data_gets = [r for r in fed.fed.requests if r.method == "GET" and r.server.startswith("cache")]
    samples = [r for r in data_gets if r.range and _length(r.range) <= SAMPLE_BYTES]
    footers = [r for r in data_gets if r not in samples]
    assert len(footers) == N_FILES and all(r.range and not r.range.startswith("bytes=0-") for r in footers)
    assert len(samples) <= N_FILES * 5
    assert staged_files(fed, job) == []
    ref = event_stream(local_files(muon_data), 100, seed=4, shuffle_window=150)
    log = StagingLog(monkeypatch)
    watch = ScratchWatch(fed, job)
    try:
        steps = 2 * ref.samples_per_epoch // 100 + 2  # into the third epoch
        for got, want in zip(iter(stream), iter(ref)):
            assert np.array_equal(ids(got), ids(want))  # the same batches as from the local files
            steps -= 1
            if steps == 0:
                break
    finally:
        most = watch.stop()
        stream.close()
        ref.close()
    log.check()
    if workers == 0:
        # The budget bounds what is fetched ahead, in reading order: no file kept or fetched for later takes
        # the room of one read sooner, so the reader never waits for a file that only fits over the budget (the
        # stager would say so). The watch is sampled: it may miss a peak, never invents one.
        over = [r.getMessage() for r in caplog.records if "fetching a needed file over it" in r.getMessage()]
        assert not over, over
        assert most <= 3 and watch.most_bytes <= 3 * size, f"{most} files, {watch.most_bytes} bytes at once"
    stats = stream.staging_stats
    # every file read was downloaded or found complete on scratch first
    reads = len({(st, i) for st, i, _ in log.gets})
    assert stats["downloaded"] + stats["reused"] >= reads, (stats, reads)
    # deleted after use: at an epoch's end at most `ahead` files (and the budget) stay for the next one, so
    # the second epoch fetched the others again
    assert stats["downloaded"] >= N_FILES + N_FILES - min(ahead, room), stats
    assert stream.stage_wait_seconds > 0  # the very first file cannot have been there


def test_bad_files_skipped_and_listed(served: FederationSetup, tmp_path: Path) -> None:
    fed = served
    uris = expand_paths([fed.uri("/ns/muons/*.parquet"), fed.uri("/ns/muons/gone.parquet")], fed.pelican)
    spec = StagingSpec(staging=fed.staging(ahead=1), pelican=fed.pelican, job_id="bad")
    run = tmp_path / "run"
    kw = dict(staging=spec, run_dir=run, split="val")
    # gone.parquet: 404 when its footer is read; muons-00002: removed after the index, 404 when staged
    stream = event_stream(uris, 100, 0, on_bad_file="skip", **kw)  # type: ignore[arg-type]
    failing = event_stream([u for u in uris if "gone" not in u], 100, 0, **kw)  # type: ignore[arg-type]
    (fed.root / "ns" / "muons" / "muons-00002.parquet").unlink()
    try:
        seen = np.concatenate([ids(b) for b, _ in stream.epoch_batches(0, 0)])
        skipped = (
            stream.stats
        )  # this hop's counts (a stream with counts of its own says and clears them at close)
        with pytest.raises(UserError, match=r"muons-00002\.parquet.*404.*on_bad_file=skip"):
            list(failing.epoch_batches(0, 0))
    finally:
        stream.close()
        failing.close()
    assert sorted(set(seen[:, 0].tolist())) == [0, 1, 3] and len(seen) == 3 * EVENTS
    assert skipped["bad_file_events"] == EVENTS
    lines = dict(line.split("\t") for line in (run / "bad_files.txt").read_text().splitlines())
    assert set(lines) == {fed.uri("/ns/muons/gone.parquet"), fed.uri("/ns/muons/muons-00002.parquet")}
    assert all("404" in reason for reason in lines.values())


def test_train_from_pelican_end_to_end_without_leaking_the_token(tmp_path: Path, muon_data: Path) -> None:
    secret = "s3cr3t-muon-token-0123456789"
    with pelican_federation(
        tmp_path, n_files=0, namespaces=[Namespace("/secure", require_token=True, token=secret)]
    ) as fed:
        shutil.copytree(muon_data, fed.root / "secure" / "muons")
        out_dir = tmp_path / "runs"
        out = hpctrain(
            "train",
            "model.type=muon_multiplicity",
            f"data.paths=[{fed.uri('/secure/muons/*.parquet')}, {fed.uri('/secure/muons/gone.parquet')}]",
            "data.on_bad_file=skip",
            f"data.pelican.ca_file={fed.fed.ca_file}",
            f"data.staging.dir={fed.scratch}",
            "data.staging.ahead=1",
            "data.batch_size=64",
            "train.total_updates=6",
            "train.eval_every=0",
            "checkpoint.every=3",
            "logging.log_every=2",
            f"run.out_dir={out_dir}",
            "run.name=remote",
            env={"BEARER_TOKEN": secret, "SLURM_JOB_ID": "", "PYTHONPATH": str(REPO)},
        )
        # every data request carried the token; the data came through the federation's cache
        gets = [r for r in fed.fed.requests if r.method == "GET" and r.server.startswith("cache")]
        assert gets and all(r.has_auth for r in gets)
    assert "finished at update 6/6" in out
    run = out_dir / "remote"
    assert (run / "checkpoints" / "step_00000006.pt").exists()
    assert (run / "bad_files.txt").read_text().startswith(fed.uri("/secure/muons/gone.parquet") + "\t")
    assert list((run / "data_index").glob("remote-*.json"))  # a resumed run reads no footer again
    # staged files were deleted after use (only the next epoch's first file may be left)
    assert len([p for p in fed.scratch.rglob("*.parquet")]) <= 1
    assert secret not in out
    for path in [*run.rglob("*"), *fed.scratch.rglob("*")]:
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path


def test_a_folder_named_as_a_file_is_one_line(served: FederationSetup, tmp_path: Path) -> None:
    """A pelican:// URI naming a folder fails at once (no retries, nothing left on scratch), as one line."""
    fed = served
    fed.fed.faults.fail_503["/ns/muons"] = 100  # as a server whose answers for a folder look transient
    proc = subprocess.run(
        [
            sys.executable, "-m", "hpctrain", "train", "model.type=muon_multiplicity",
            f"data.paths=[{fed.uri('/ns/muons')}]", f"data.pelican.ca_file={fed.fed.ca_file}",
            f"data.staging.dir={fed.scratch}", "data.staging.retries=5", "data.staging.backoff_base=1",
            f"run.out_dir={tmp_path / 'runs'}",
        ],
        capture_output=True, text=True, env={**os.environ, "SLURM_JOB_ID": ""}, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"error: {fed.uri('/ns/muons')}: is a folder, not a file; name its files with a glob "
        f"({fed.uri('/ns/muons')}/*.parquet) or end the URI with '/' to read every file under it (in data.paths)"
    ]
    assert len(fed.fed.requests_for("/ns/muons", "GET", server="cache0")) <= 1  # not retried
    assert not list(fed.scratch.rglob(".*.tmp-*"))


def test_checkpoints_mirrored_after_each_commit(tmp_path: Path) -> None:
    mirror = tmp_path / "mirror"
    hpctrain(
        "train",
        f"run.out_dir={tmp_path / 'runs'}",
        f"checkpoint.mirror_to={mirror}",
        "train.total_updates=4",
        "checkpoint.every=2",
        "train.eval_every=0",
    )
    run = tmp_path / "runs" / "debug" / "checkpoints"
    copied = mirror / "debug" / "checkpoints"  # the run's own folder under mirror_to
    names = {p.name for p in run.iterdir()}
    assert {"step_00000002.pt", "step_00000004.pt"} <= names
    assert {p.name for p in copied.iterdir()} == names
    for name in names:
        assert (copied / name).read_bytes() == (run / name).read_bytes()
    assert not [p for p in copied.iterdir() if p.name.startswith(".")]  # no temporary copies left


def test_evaluate_judges_remote_files_as_it_judges_local_ones(tmp_path: Path, muon_data: Path) -> None:
    """`hpctrain evaluate --sample FILES --data pelican://...`: the true files come through the federation with
    the token (staged, then deleted) and the tables are those of the same files read locally; a token file that
    cannot be read is one line, exit 2."""
    secret = "s3cr3t-judge-token-0123456789"
    sample = tmp_path / "sample"
    shutil.copytree(muon_data, sample)  # a perfect generator: the true bundles themselves
    judge = ["evaluate", "--sample", str(sample), "--events", "600", "--folds", "2", "--null-replicates", "2"]
    local = hpctrain(*judge, "--data", str(muon_data))
    with pelican_federation(
        tmp_path, n_files=0, namespaces=[Namespace("/secure", require_token=True, token=secret)]
    ) as fed:
        shutil.copytree(muon_data, fed.root / "secure" / "muons")
        access = ["--ca-file", str(fed.fed.ca_file), "--staging-dir", str(fed.scratch)]
        remote = hpctrain(
            *judge, "--data", fed.uri("/secure/muons/*.parquet"), *access, env={"BEARER_TOKEN": secret}
        )
        gets = [r for r in fed.fed.requests if r.method == "GET" and r.server.startswith("cache")]
        assert len(gets) >= N_FILES and all(r.has_auth for r in gets)
        bad = subprocess.run(
            [sys.executable, "-m", "hpctrain", *judge, "--data", fed.uri("/secure/muons/*.parquet"), *access,
             "--token-file", str(tmp_path / "no-token")],
            capture_output=True, text=True, env={**os.environ, "BEARER_TOKEN": ""}, timeout=120,
        )  # fmt: skip
    assert bad.returncode == 2 and bad.stdout == "", bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1 and "--token-file" in bad.stderr, bad.stderr
    assert "no-token" in bad.stderr and "cannot read" in bad.stderr, bad.stderr
    assert "judged 600 sample events" in remote and "parquet" in remote
    # the same figures: everything after the first line (which names the files) is equal
    assert remote.split("\n", 1)[1] == local.split("\n", 1)[1]
    assert not list(fed.scratch.rglob("*.parquet"))  # each staged file deleted once read
    assert secret not in remote
