"""RemoteFiles: opens remote URIs with one filesystem per federation/protocol and lists remote globs."""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import threading
from typing import Any

import fsspec

from hpctrain.config.remote import PelicanConfig
from hpctrain.errors import RunError
from hpctrain.remote.auth import make_client, resolve_token, scrub, ssl_context, webdav_factory
from hpctrain.remote.uris import PELICAN_SCHEMES, MissingPathError, has_magic, scheme, split_federation

# Pelican filesystems shared by every RemoteFiles of this process with the same access (see _pelican_fs)
_SHARED: dict[tuple[Any, ...], Any] = {}
_SHARED_LOCK = threading.Lock()


class RemoteFiles:
    """Opens remote URIs with one filesystem per federation/protocol; holds the token privately.

    `resolve(uri)` gives (filesystem, path for that filesystem). The token goes only to Pelican/OSDF endpoints
    (as `Authorization: Bearer ...`), never to other hosts, and is kept out of repr and messages.
    """

    def __init__(
        self,
        pelican: PelicanConfig | None = None,
        storage_options: dict[str, Any] | None = None,
        timeout: float = 60.0,
    ) -> None:
        self._pelican = pelican or PelicanConfig()
        self._token = resolve_token(self._pelican)
        if self._token is None and self._pelican.auto_token:
            from hpctrain.remote.oidc import access_token

            self._token = access_token(self._pelican)  # the OIDC login's, refreshed in resolve()
        self._ssl = ssl_context(self._pelican.ca_file)
        self._storage_options = dict(storage_options or {})
        self._timeout = timeout
        self._fs: dict[str, Any] = {}

    def __repr__(self) -> str:
        return f"RemoteFiles(filesystems={sorted(self._fs)}, token={'set' if self._token else 'none'})"

    def scrub(self, text: str) -> str:
        return scrub(text, self._token)

    def federation(self, uri: str) -> tuple[str, str, str]:
        """(discovery URL, namespace path, canonical prefix) of a pelican:// or osdf:// URI."""
        return split_federation(uri, self._pelican.federation_url)

    def resolve(self, uri: str) -> tuple[Any, str]:
        name = scheme(uri)
        if name in PELICAN_SCHEMES:
            discovery, path, _ = self.federation(uri)
            if not path or path == "/":
                raise ValueError(f"{uri}: no namespace path after the federation")
            self._refresh_token()
            return self._pelican_fs(discovery), path
        key = f"url:{name}"
        if key not in self._fs:
            options = dict(self._storage_options)
            if name in ("http", "https"):
                options.setdefault("get_client", functools.partial(make_client, self._ssl, self._timeout))
            self._fs[key] = fsspec.filesystem(name, skip_instance_cache=True, **options)
        fs = self._fs[key]
        return fs, fs._strip_protocol(uri) if name not in ("http", "https") else uri

    def _refresh_token(self) -> None:
        """With data.pelican.auto_token the access token is refreshed before it expires (a long run): the
        filesystems built with the old one are dropped, the next use builds one with the new token."""
        if not self._pelican.auto_token or resolve_token(self._pelican) is not None:
            return
        from hpctrain.remote.oidc import access_token

        token = access_token(self._pelican)
        if token != self._token:
            self._token = token
            self._fs = {k: v for k, v in self._fs.items() if k.startswith("url:")}

    def _pelican_fs(self, discovery: str) -> Any:
        if discovery not in self._fs:
            # shared by every RemoteFiles of this process with the same access: the stager then starts with
            # the discovery, director answers and open connections that expand_paths already paid for
            secret = hashlib.sha256((self._token or "").encode()).hexdigest()
            key = (os.getpid(), discovery, secret, self._pelican.ca_file, self._timeout)
            with _SHARED_LOCK:
                if key not in _SHARED:
                    _SHARED[key] = self._new_pelican_fs(discovery)
                self._fs[discovery] = _SHARED[key]
        return self._fs[discovery]

    def _new_pelican_fs(self, discovery: str) -> Any:
        from pelicanfs import PelicanFileSystem

        # pelicanfs logs ERROR lines ("No working cache found") for failures we classify, retry and report
        # ourselves in one line: keep them off the user's stderr unless someone set that logger's level
        pelican_log = logging.getLogger("fsspec.pelican")
        if pelican_log.level == logging.NOTSET:
            pelican_log.setLevel(logging.CRITICAL)

        options: dict[str, Any] = {"get_client": functools.partial(make_client, self._ssl, self._timeout)}
        if self._ssl is not None:
            options["get_webdav_client"] = webdav_factory(self._ssl)
        if self._token:
            options["headers"] = {"Authorization": f"Bearer {self._token}"}
        # our own instance per federation: fsspec's cached one stays bound to the first federation
        fs = PelicanFileSystem(discovery, skip_instance_cache=True, **options)
        _uncache(fs.http_file_system)
        return fs

    def canonical(self, uri: str, fs: Any, path: str) -> str:
        """The URI for a path that `resolve(uri)`'s filesystem returned (globs, listings)."""
        if scheme(uri) in PELICAN_SCHEMES:
            return self.federation(uri)[2] + "/" + path.lstrip("/")
        return path if "://" in path else str(fs.unstrip_protocol(path))

    def expand(self, uri: str) -> list[str]:
        """Files a remote URI names: a glob's matches, a folder's files (URI ending in /), else the URI."""
        fs, path = self.resolve(uri)
        if not has_magic(path) and not uri.endswith("/"):
            return [uri]
        try:
            if has_magic(path):
                found = fs.glob(path, detail=True)
            else:
                found = fs.find(path, detail=True)
        except FileNotFoundError:
            raise MissingPathError(f"{uri}: no such remote folder") from None
        except (
            Exception
        ) as err:  # a listing can fail in many ways; name the URI, keep the token out (one line)
            raise RunError(f"listing {uri} failed: {type(err).__name__}: {self.scrub(str(err))}") from None
        files = [self.canonical(uri, fs, p) for p, info in found.items() if info.get("type") != "directory"]
        if not files:
            raise MissingPathError(f"{uri}: no remote file matches")
        return files


def _uncache(inner: Any) -> None:
    """Drop `inner` from fsspec's instance cache of its class. pelicanfs builds its HTTP filesystem through that
    cache (our skip_instance_cache stops at the outer one), which would hold it, its session and open
    connections for the life of the process: one more each time a refreshed token (or another federation)
    builds a Pelican filesystem."""
    cls = type(inner)
    if not hasattr(cls, "_cache") or not hasattr(cls, "_instantiation_lock"):
        return  # another fsspec: its cache is not ours to mend (a leak at worst, never an error)
    with cls._instantiation_lock:
        for token in [t for t, fs in cls._cache.items() if fs is inner]:
            del cls._cache[token]
