"""The remote-filesystem layer without a server: which paths are remote, expansion, tokens, mirroring."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import fsspec
import pytest

from hpctrain.config.remote import PelicanConfig
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


def test_a_remote_listing_that_fails_is_one_line_naming_the_uri(tmp_path: Path) -> None:
    """A glob on a federation that does not answer (nothing listens on 127.0.0.1:9): one line, exit 1."""
    uri = "pelican://127.0.0.1:9/ns/*.parquet"
    sample = tmp_path / "s.parquet"
    sample.write_bytes(b"")
    done = subprocess.run(
        [sys.executable, "-m", "hpctrain", "evaluate", "--sample", uri, "--data", str(sample)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: listing {uri} failed"), done.stderr[-2000:]
