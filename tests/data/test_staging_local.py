"""Remote-data logic that needs no server: paths, names, tokens, scratch folders, mirroring, config."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import fsspec
import pytest
from pydantic import ValidationError

from hpctrain.config.remote import PelicanConfig, StagingConfig
from hpctrain.data.staging import BadFileError, Stager, StagingError, local_name, staging_root
from hpctrain.remote.auth import resolve_token
from hpctrain.remote.expand import expand_paths
from hpctrain.remote.mirror import mirror
from hpctrain.remote.uris import MissingPathError, is_remote


def test_is_remote() -> None:
    assert is_remote("pelican://fed/ns/x") and is_remote("osdf:///ns/x") and is_remote("https://h/x")
    assert not is_remote("/data/x.parquet") and not is_remote("file:///data/x") and not is_remote("rel/x")


def test_expand_local_paths_sorted_unique(tmp_path: Path) -> None:
    for name in ["b.parquet", "a.parquet", "sub/c.parquet", ".hidden"]:
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_bytes(b"x")
    got = expand_paths([str(tmp_path / "*.parquet"), str(tmp_path / "a.parquet"), str(tmp_path / "sub")])
    assert got == [str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet"), str(tmp_path / "sub/c.parquet")]
    assert expand_paths([str(tmp_path)]) == got  # a folder: its files, hidden ones left out
    with pytest.raises(ValueError, match="list"):
        expand_paths(str(tmp_path))  # type: ignore[arg-type]


def test_missing_local_path_names_it_and_hints_at_mounts(tmp_path: Path) -> None:
    missing = tmp_path / "not_mounted" / "data" / "*.parquet"
    with pytest.raises(MissingPathError, match=r"not_mounted.*nearest existing folder.*mounted") as info:
        expand_paths([str(missing)])
    assert str(tmp_path) in str(info.value)
    with pytest.raises(MissingPathError, match=r"no file matches"):
        expand_paths([str(tmp_path / "*.h5")])


def test_token_resolution_order(tmp_path: Path) -> None:
    token_file = tmp_path / "tok"
    token_file.write_text("from-file\n")
    json_file = tmp_path / "tok.json"
    json_file.write_text('{"access_token": "from-json"}')
    env = {"BEARER_TOKEN": "from-env", "BEARER_TOKEN_FILE": str(json_file)}
    cfg = PelicanConfig(token_file=str(token_file), token="from-config")  # type: ignore[arg-type]
    assert resolve_token(cfg, env) == "from-file"
    assert resolve_token(PelicanConfig(token="from-config"), env) == "from-env"  # type: ignore[arg-type]
    assert resolve_token(None, {"BEARER_TOKEN_FILE": str(json_file)}) == "from-json"
    assert resolve_token(PelicanConfig(token="from-config"), {}) == "from-config"  # type: ignore[arg-type]
    assert resolve_token(None, {}) is None
    with pytest.raises(ValueError, match=r"token_file.*cannot read"):
        resolve_token(PelicanConfig(token_file=str(tmp_path / "nope")), {})
    assert "from-config" not in repr(PelicanConfig(token="from-config"))  # type: ignore[arg-type]


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
    with pytest.raises(StagingError, match="does not exist"):
        staging_root(StagingConfig(dir=str(tmp_path / "nope")), "1", env={})


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


def test_mirror_file_and_folder_atomically(tmp_path: Path) -> None:
    src = tmp_path / "ckpt"
    (src / "sub").mkdir(parents=True)
    (src / "model.pt").write_bytes(b"v1")
    (src / "sub" / "opt.pt").write_bytes(b"o1")
    dest = tmp_path / "mirror"
    assert mirror(src, str(dest)) == str(dest / "ckpt")
    (src / "model.pt").write_bytes(b"v2")
    (src / "sub" / "opt.pt").unlink()
    mirror(src, str(dest))  # replaces the older copy, no stale files
    assert (dest / "ckpt" / "model.pt").read_bytes() == b"v2" and not (
        dest / "ckpt" / "sub" / "opt.pt"
    ).exists()
    mirror(src / "model.pt", f"file://{dest}")
    assert (dest / "model.pt").read_bytes() == b"v2"
    assert sorted(os.listdir(dest)) == ["ckpt", "model.pt"]  # no temporary names left
    mirror(src, "memory:///mirror-test")
    assert fsspec.filesystem("memory").cat("/mirror-test/ckpt/model.pt") == b"v2"
    with pytest.raises(MissingPathError):
        mirror(tmp_path / "nope", str(dest))


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
