"""A loopback Pelican federation with a small data set, as a context manager and a pytest fixture.

from tests.integration.pelican_fixtures import pelican_federation, federation  # noqa: F401

def test_x(federation):             # 4 files of 64 KiB under /ns/data, open namespace
    uris = [federation.uri(p) for p in federation.files]

with pelican_federation(tmp_path, namespaces=[Namespace("/secure", require_token=True, token="t")]) as fed:
    ...
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from hpctrain.config.remote import PelicanConfig, StagingConfig
from hpctrain.data.staging import Stager
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


class StagingLog:
    """Records what every Stager of the test does, to check what must hold on any machine, however loaded:

    - `dispatched`: (stager, index, highest index asked for so far) each time a download is handed to a
      download thread (in the stager's lock, so in the true order);
    - `gets`: (stager, index, complete) for each `get`, complete = the returned file is there in full.
    Install with `StagingLog(monkeypatch)`.
    """

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.dispatched: list[tuple[int, int, int]] = []
        self.gets: list[tuple[int, int, bool]] = []
        self.ahead: dict[int, int] = {}
        next_file, get = Stager._next, Stager.get
        log = self
        lock = threading.Lock()  # the dispatcher thread and the reader may meet a stager first at once

        def number(st: Stager) -> int:
            """A stager's number in this test (not id(st): a closed stager's id is reused by the next)."""
            with lock:
                if not hasattr(st, "_test_number"):
                    st._test_number = len(log.ahead)  # type: ignore[attr-defined]
                    log.ahead[st._test_number] = st.cfg.ahead  # type: ignore[attr-defined]
                return int(st._test_number)  # type: ignore[attr-defined]

        def _next(st: Stager, *args: Any) -> int | None:
            j = next_file(st, *args)
            if j is not None:
                log.dispatched.append((number(st), j, st._max_req))
            return j

        def _get(st: Stager, i: int) -> Path:
            path = get(st, i)
            expected = st._size[i]
            complete = path.is_file() and (expected is None or path.stat().st_size == expected)
            log.gets.append((number(st), i, complete))
            return path

        monkeypatch.setattr(Stager, "_next", _next)
        monkeypatch.setattr(Stager, "get", _get)

    def check(self) -> None:
        """Downloads start in reading order, at most `ahead` past the file being read (the first one before
        any is read); reads come in order and find their file complete."""
        first: dict[tuple[int, int], int] = {}
        for st, j, max_req in self.dispatched:
            first.setdefault((st, j), max(max_req, 0))
        for st in {s for s, _ in first}:
            order = [j for (s, j) in first if s == st]
            assert order == sorted(order), f"downloads out of reading order: {order}"
            over = [(j, m) for (s, j), m in first.items() if s == st and j > m + self.ahead[st]]
            assert not over, f"(file, file being read) beyond ahead={self.ahead[st]}: {over}"
        for st in {s for s, _, _ in self.gets}:
            asked = [i for s, i, _ in self.gets if s == st]
            assert asked == sorted(asked), f"files read out of order: {asked}"
        assert all(complete for _, _, complete in self.gets), "a file was read before it was staged in full"
