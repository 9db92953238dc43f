"""A remote data file rewritten between two hops at the same size is refused on resume (or, with
data.allow_changed_files, its epoch restarts); an unchanged remote file costs no read at all on resume (one
listing per folder), and a file whose listing shows a new time but whose bytes are the same resumes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hpctrain.config.remote import PelicanConfig, StagingConfig
from hpctrain.data.stream.staged import StagingSpec
from hpctrain.errors import UserError
from hpctrain.workloads.muons.events.stream import EventStream
from tests.data.test_fingerprint import rewrite_same_size
from tests.integration.pelican_fixtures import FederationSetup, pelican_federation
from tests.integration.pelican_server import StaticServer
from tests.workloads.muons.conftest import event_stream, write_set

pytestmark = pytest.mark.integration
NAMES = ("f0.parquet", "f1.parquet", "f2.parquet")


@pytest.fixture
def served(tmp_path: Path) -> Iterator[FederationSetup]:
    """Three muon files under /ns/changing/ of a loopback federation."""
    with pelican_federation(tmp_path, n_files=0) as fed:
        write_set(fed.root / "ns" / "changing", files=len(NAMES), events=300, seed=5)
        yield fed


def stream(fed: FederationSetup, run_dir: Path, allow: bool = False) -> EventStream:
    spec = StagingSpec(fed.staging(), fed.pelican)
    uris = [fed.uri(f"/ns/changing/{n}") for n in NAMES]
    return event_stream(uris, 50, 0, run_dir=run_dir, staging=spec, num_workers=0, allow_changed_files=allow)


def resume(fed: FederationSetup, run_dir: Path, state: dict[str, Any], allow: bool = False) -> int:
    s = stream(fed, run_dir, allow)
    try:
        s.load_state_dict(state)
        return s.position
    finally:
        s.close()


def data_reads(fed: FederationSetup, since: int) -> list[str]:
    """Requests for the files' bytes or headers (GET/HEAD) since request number `since`."""
    return [f"{r.method} {r.path}" for r in fed.fed.requests[since:] if r.method in ("GET", "HEAD")]


def test_a_remote_file_rewritten_at_the_same_size_is_refused_unless_allowed(
    served: FederationSetup, tmp_path: Path
) -> None:
    fed, run_dir = served, tmp_path / "run"
    first = stream(fed, run_dir)
    state = first.state_dict() | {"position": 100}
    first.close()
    assert len(state["files"]["samples"]) == 3 and all(state["files"]["samples"])
    assert all(m > 0 for m in state["files"]["mtimes"])  # the listing's times

    # unchanged: the index comes from the run folder's cache, checked against one listing of the folder
    before = len(fed.fed.requests)
    assert resume(fed, run_dir, state) == 100
    assert data_reads(fed, before) == []
    assert [r.path for r in fed.fed.requests[before:] if r.method == "PROPFIND"].count("/ns/changing/") == 1

    # a new time, the same bytes (uploaded again): sampled again, the same hash, resumed
    victim = fed.root / "ns" / "changing" / "f1.parquet"
    later = victim.stat().st_mtime_ns + 5 * 10**9
    os.utime(victim, ns=(later, later))
    before = len(fed.fed.requests)
    assert resume(fed, run_dir, state) == 100
    assert {p.rsplit("/", 1)[1] for p in data_reads(fed, before) if p.startswith("GET /ns")} == {"f1.parquet"}

    # other events at the same size: refused in one line naming the file, or the epoch restarts if allowed
    donor = write_set(tmp_path / "other", files=2, events=300, seed=9)[1]
    size = victim.stat().st_size
    rewrite_same_size(victim, Path(donor))
    assert victim.stat().st_size == size
    with pytest.raises(UserError) as info:
        resume(fed, run_dir, state)
    text = str(info.value)
    assert "\n" not in text and "f1.parquet rewritten (same size, other bytes)" in text, text
    assert "data.allow_changed_files=true" in text
    assert resume(fed, run_dir, state, allow=True) == 0


def test_the_train_command_refuses_a_changed_remote_file_with_exit_2(
    served: FederationSetup, tmp_path: Path
) -> None:
    fed = served
    args = [
        sys.executable, "-m", "hpctrain", "train", "model.type=muon_multiplicity",
        f"data.paths=[{fed.uri('/ns/changing/*.parquet')}]", f"data.pelican.ca_file={fed.fed.ca_file}",
        f"data.staging.dir={fed.scratch}", "data.batch_size=64", "train.eval_every=0", "checkpoint.every=2",
        f"run.out_dir={tmp_path / 'runs'}", "run.name=remote",
    ]  # fmt: skip
    env = {**os.environ, "SLURM_JOB_ID": ""}
    first = subprocess.run(
        [*args, "train.total_updates=2"], capture_output=True, text=True, env=env, timeout=300
    )
    assert first.returncode == 0, first.stderr
    victim = fed.root / "ns" / "changing" / "f2.parquet"
    donor = write_set(tmp_path / "other", files=3, events=300, seed=9)[2]
    rewrite_same_size(victim, Path(donor))
    again = subprocess.run(
        [*args, "train.total_updates=4"], capture_output=True, text=True, env=env, timeout=300
    )
    assert again.returncode == 2, again.stderr
    errors = [line for line in again.stderr.splitlines() if line.startswith("error")]
    assert len(errors) == 1 and "f2.parquet rewritten (same size, other bytes)" in errors[0], again.stderr
    assert "Traceback" not in again.stderr
    shutil.rmtree(fed.scratch, ignore_errors=True)


def test_https_files_without_a_listing_are_sampled_at_every_start(tmp_path: Path) -> None:
    """A plain https:// server gives no listing with times: each start reads every file's footer and samples
    again (the fallback), and a rewrite at the same size is refused the same way."""
    root = tmp_path / "www"
    write_set(root / "d", files=2, events=300, seed=5)
    with StaticServer(root, certs=tmp_path / "certs") as srv:
        spec = StagingSpec(
            StagingConfig(dir=str(tmp_path / "scratch")), PelicanConfig(ca_file=str(srv.ca_file))
        )
        uris = [f"{srv.url}/d/f0.parquet", f"{srv.url}/d/f1.parquet"]

        def resume(state: dict[str, Any]) -> int:
            s = event_stream(uris, 50, 0, run_dir=tmp_path / "run", staging=spec, num_workers=0)
            try:
                s.load_state_dict(state)
                return s.position
            finally:
                s.close()

        first = event_stream(uris, 50, 0, run_dir=tmp_path / "run", staging=spec, num_workers=0)
        state = first.state_dict() | {"position": 100}
        first.close()
        assert state["files"]["mtimes"] == [-1, -1] and all(state["files"]["samples"])
        before = len(srv.requests)
        assert resume(state) == 100
        assert {r.path for r in srv.requests[before:] if r.method == "GET"} == {
            "/d/f0.parquet",
            "/d/f1.parquet",
        }
        rewrite_same_size(root / "d" / "f0.parquet", Path(write_set(tmp_path / "o", files=1, seed=9)[0]))
        with pytest.raises(UserError, match=r"f0\.parquet rewritten \(same size, other bytes\)"):
            resume(state)
