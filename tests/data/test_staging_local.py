"""Staging logic that needs no server: scratch folders, file names, local and fsspec sources, config."""

from __future__ import annotations

import stat
from pathlib import Path

import fsspec
import pytest
from pydantic import ValidationError

from hpctrain.config.remote import StagingConfig
from hpctrain.data.staging import BadFileError, Stager, local_name, staging_root
from hpctrain.errors import UserError
from hpctrain.remote.expand import expand_paths


def test_local_names_are_flat_unique_and_safe() -> None:
    uris = [
        "https://h/a/../../etc/passwd",
        "pelican://f/ns/..",
        "pelican://f/ns/x/",
        "osdf:///a/b?x=/../y",
        "s3://b/",
    ]
    names = [local_name(u) for u in uris]
    assert len(set(names)) == len(names)
    for name in names:
        assert "/" not in name and name not in ("", ".", "..") and not name.startswith(".")
    assert local_name("pelican://f/ns/run1/data.parquet").endswith("-data.parquet")
    assert local_name("pelican://f/ns/run1/data.parquet") != local_name("pelican://f/ns/run2/data.parquet")


def test_staging_root_is_private_per_user_job_node(tmp_path: Path) -> None:
    cfg = StagingConfig()
    root = staging_root(cfg, "42", env={"SLURM_TMPDIR": str(tmp_path), "TMPDIR": "/nonexistent"})
    assert root.parent.name == "job-42" and root.parent.parent.name.startswith("hpctrain-")
    assert root.is_relative_to(tmp_path)
    for level in (root, root.parent, root.parent.parent):
        assert stat.S_IMODE(level.stat().st_mode) == 0o700
    assert staging_root(StagingConfig(dir=str(tmp_path)), env={}).parent.name == "job-local"
    with pytest.raises(UserError, match=f"does not exist .*nearest existing folder: {tmp_path}$"):
        staging_root(StagingConfig(dir=str(tmp_path / "nope" / "deeper")), "1", env={})


def test_local_inputs_pass_through(tmp_path: Path) -> None:
    data = tmp_path / "x.bin"
    data.write_bytes(b"abc")
    with Stager([str(data), f"file://{tmp_path}/gone.bin"], StagingConfig(dir=str(tmp_path))) as st:
        assert st.get(0) == data  # no copy
        st.release(0)
        assert data.exists()
        with pytest.raises(BadFileError, match=r"gone\.bin"):
            st.get(1)
    assert not (tmp_path / "hpctrain-root").exists() and not list(tmp_path.glob("hpctrain-*"))


def test_fsspec_memory_source_is_staged(tmp_path: Path) -> None:
    mem = fsspec.filesystem("memory")
    mem.pipe("/stage-test/a.bin", b"a" * 1000)
    mem.pipe("/stage-test/b.bin", b"b" * 10)
    uris = expand_paths(["memory:///stage-test/*.bin"])
    assert uris == ["memory:///stage-test/a.bin", "memory:///stage-test/b.bin"]
    with Stager(uris, StagingConfig(dir=str(tmp_path)), job_id="m") as st:
        assert st.get(0).read_bytes() == b"a" * 1000 and st.get(0).parent == st.root
        assert st.get(1).read_bytes() == b"b" * 10


def test_staging_config_validation() -> None:
    assert StagingConfig(max_bytes="2GiB").max_bytes == 2 * 2**30  # type: ignore[arg-type]
    assert StagingConfig(max_bytes="500MB").max_bytes == 500 * 10**6  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="max_bytes"):
        StagingConfig(max_bytes="lots")  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="ahead"):
        StagingConfig(ahead=-1)
    with pytest.raises(ValidationError, match="extra"):
        StagingConfig(ahaed=2)  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="local_rank"):
        Stager([], local_rank=2, local_world_size=2)


def test_a_missing_staging_folder_is_one_line_before_anything_runs(tmp_path: Path) -> None:
    from tests.conftest import ROOT, hpctrain

    done = hpctrain(
        "train",
        "--config",
        str(ROOT / "configs" / "muons.yaml"),
        "data.paths=[pelican://127.0.0.1:9/ns/f.parquet]",
        "data.val_paths=[]",
        f"data.staging.dir={tmp_path / 'nope' / 'x'}",
        cwd=tmp_path,
    )
    assert done.code == 2 and "Traceback" not in done.err
    line = [x for x in done.err.splitlines() if x.startswith("error:")]
    assert len(line) == 1 and f"data.staging.dir={tmp_path / 'nope' / 'x'}: no such folder" in line[0]
    assert f"(nearest existing folder: {tmp_path})" in line[0]
