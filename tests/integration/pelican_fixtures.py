"""A loopback Pelican federation with a small data set, as a context manager and a pytest fixture.

from tests.integration.pelican_fixtures import pelican_federation, federation  # noqa: F401

def test_x(federation):             # 4 files of 64 KiB under /ns/data, open namespace
    uris = [federation.uri(p) for p in federation.files]

with pelican_federation(tmp_path, namespaces=[Namespace("/secure", require_token=True, token="t")]) as fed:
    ...
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from hpctrain.config.remote import PelicanConfig, StagingConfig
from tests.integration.pelican_server import Federation, Namespace, write_random_files


@dataclass
class FederationSetup:
    fed: Federation
    root: Path  # the served folder: URL path /ns/x is root/ns/x
    files: dict[str, bytes]  # URL path -> content
    scratch: Path  # a staging dir for the test

    @property
    def pelican(self) -> PelicanConfig:
        """Access config that trusts the test CA."""
        return PelicanConfig(ca_file=str(self.fed.ca_file))

    def uri(self, path: str) -> str:
        return f"{self.fed.url}{path}"

    def staging(self, **kwargs: object) -> StagingConfig:
        """Staging config into this test's scratch, with fast retries."""
        base: dict[str, object] = {"dir": str(self.scratch), "backoff_base": 0.01, "backoff_cap": 0.05}
        return StagingConfig(**{**base, **kwargs})  # type: ignore[arg-type]


@contextmanager
def pelican_federation(
    tmp_path: Path,
    *,
    n_files: int = 4,
    size: int = 64 << 10,
    namespaces: list[Namespace] | None = None,
    n_caches: int = 1,
    dead_first_cache: bool = False,
    certs: Path | None = None,
) -> Iterator[FederationSetup]:
    """Start a federation serving `n_files` random files /<first namespace>/data/f<i>.bin; stop it on exit.

    Federations given the same `certs` folder share one CA (default: a fresh CA in tmp_path/certs).
    """
    namespaces = namespaces or [Namespace("/ns")]
    root = tmp_path / "served"
    prefix = namespaces[0].prefix.rstrip("/")
    data = write_random_files(root, [f"{prefix.lstrip('/')}/data/f{i}.bin" for i in range(n_files)], size)
    files = {"/" + name: content for name, content in data.items()}
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    fed = Federation(
        root, certs or tmp_path / "certs", namespaces, n_caches=n_caches, dead_first_cache=dead_first_cache
    )
    try:
        yield FederationSetup(fed, root, files, scratch)
    finally:
        fed.close()


@pytest.fixture(name="federation")
def federation_fixture(tmp_path: Path) -> Iterator[FederationSetup]:
    """A default federation (4 files of 64 KiB under /ns/data, open namespace) for one test."""
    with pelican_federation(tmp_path) as setup:
        yield setup
