"""The OIDC helpers without a server: scopes from URIs, covering, the cache file's place and mode, and the
batch-job refusal (the device flow and refresh run against the loopback issuer in test_pelican_auth.py)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from hpctrain.config.remote import PelicanConfig
from hpctrain.errors import UserError
from hpctrain.remote import oidc


def test_scopes_name_the_input_folder_and_the_output_folder_minus_the_prefix() -> None:
    pelican = PelicanConfig(storage_prefix="/icecube/wipac")
    scopes = oidc.scopes_for(
        ["/local/x.parquet", "osdf:///icecube/wipac/sim/2026/*.parquet"],
        ["pelican://osg-htc.org/icecube/wipac/users/me/runs/a"],
        pelican,
    )
    assert scopes == [
        "storage.read:/sim/2026",
        "storage.read:/users/me/runs/a",
        "storage.modify:/users/me/runs/a",
    ]
    # a single input file: its folder; a path outside the prefix keeps its full path
    assert oidc.scopes_for(["osdf:///other/ns/f.h5"], [], pelican) == ["storage.read:/other/ns"]
    assert oidc.scopes_for(["/local/only"], [], pelican) == []
    given = PelicanConfig(scope_path="users/me/")
    assert oidc.scopes_for(["osdf:///a/b.h5"], [], given) == ["storage.read:/users/me"]


def test_a_login_covers_scopes_under_its_paths_only() -> None:
    have = ["storage.read:/users/me", "storage.modify:/users/me", "offline_access"]
    assert oidc.covers(have, ["storage.read:/users/me/runs/a", "storage.modify:/users/me"])
    assert not oidc.covers(have, ["storage.modify:/users/meow"])  # a sibling, not a child
    assert not oidc.covers(["storage.read:/users/me"], ["storage.modify:/users/me/x"])


def test_cache_lives_in_the_config_folder_private(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    pelican = PelicanConfig()
    assert oidc.cache_file(pelican) == tmp_path / "cfg" / "hpctrain" / "pelican-tokens.json"
    entry = oidc.Login(
        "https://issuer", "cid", "csecret", ["storage.read:/a"], "rt-secret", "at-secret", 1e12, 0
    )
    path = oidc.save(pelican, entry)
    assert path.stat().st_mode & 0o777 == 0o600 and path.parent.stat().st_mode & 0o777 == 0o700
    assert "secret" not in repr(entry)
    assert oidc.find(pelican, ["storage.read:/a/b"]) is not None
    assert oidc.find(pelican, ["storage.read:/b"]) is None
    assert oidc.find(pelican, ["storage.read:/a"], issuer="https://other") is None
    # a second login of the same issuer and scopes replaces the first
    oidc.save(pelican, oidc.Login("https://issuer", "c2", "s2", ["storage.read:/a"], "rt2"))
    assert [e.client_id for e in oidc.load(pelican)] == ["c2"]
    path.chmod(0o644)
    with pytest.raises(UserError, match="readable by others"):
        oidc.load(pelican)
    path.chmod(0o600)
    path.write_text("not json")
    with pytest.raises(UserError, match="not a token cache"):
        oidc.load(pelican)


def test_batch_job_without_a_login_is_one_line_with_the_hint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    monkeypatch.setenv("SLURM_JOB_ID", "123")
    pelican = PelicanConfig(auto_token=True)
    with pytest.raises(UserError) as err:
        oidc.ensure_login(pelican, ["osdf:///ns/data/*.h5"], [])
    text = str(err.value)
    assert "\n" not in text and "run `hpctrain auth login osdf:///ns/data/*.h5` on a login node" in text
    assert oidc.ensure_login(PelicanConfig(), ["osdf:///ns/x"], []) is None  # auto_token off: nothing asked


def test_a_token_is_refreshed_when_a_third_of_its_life_is_left() -> None:
    now = time.time()
    entry = oidc.Login("i", "c", "s", [], "r", "a", expires_at=now + 90, issued_at=now - 0)
    assert entry.fresh(now) and entry.fresh(now + 59) and not entry.fresh(now + 61)
    long = oidc.Login("i", "c", "s", [], "r", "a", expires_at=now + 3600, issued_at=now)
    assert long.fresh(now + 3539) and not long.fresh(now + 3541)  # at most 60 s of margin
    assert not oidc.Login("i", "c", "s", [], "r").fresh(now)  # no access token yet


def test_an_issuer_that_cannot_be_reached_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import socket

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed once the block ends: connections are refused
    with pytest.raises(
        UserError, match=r"cannot reach the token issuer https://127.0.0.1:\d+ \(ConnectionError\)"
    ):
        oidc.login(PelicanConfig(), f"https://127.0.0.1:{port}", ["storage.read:/a"], say=print)
    assert not oidc.cache_file(PelicanConfig()).exists()


def test_a_login_target_that_is_no_uri_is_one_line(tmp_path: Path) -> None:
    from tests.conftest import hpctrain

    done = hpctrain("auth", "login", "notaurl", cwd=tmp_path)
    assert done.code == 2 and done.err.strip().splitlines() == [
        "error: auth login: 'notaurl' is neither a pelican:// or osdf:// URI nor a key=value"
    ]
