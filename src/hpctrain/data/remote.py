"""Remote input URIs: which paths are remote, expanding globs, opening files, tokens, mirroring outputs.

Accepted inputs: local paths and globs, `pelican://<federation>/<namespace>/...`, `osdf:///<namespace>/...`
(the OSDF federation, or `data.pelican.federation_url`) and any other fsspec URL (https://, s3://, memory://).

pelicanfs 1.5 quirks handled here:
- `fs.glob()` on a full pelican://host:port/... URL returns []: we glob the bare namespace path instead.
- fsspec caches one PelicanFileSystem bound to the first federation it saw: we build our own instances
  (`skip_instance_cache=True`), one per federation.
- `pq.read_table(path, filesystem=pelicanfs)` fails (its mtime is a string): Arrow gets file objects
  (`pq.ParquetFile(fs.open(...))`, for footers) or staged copies (see `hpctrain.data.staging`).
"""

from __future__ import annotations

import asyncio
import errno
import functools
import glob as globlib
import hashlib
import json
import logging
import os
import re
import shutil
import socket
import ssl
import threading
import urllib.parse
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import fsspec

from hpctrain.config.remote import PelicanConfig
from hpctrain.errors import UserError

OSDF_DISCOVERY = "pelican://osg-htc.org/"
_SHARED: dict[tuple[Any, ...], Any] = {}
_SHARED_LOCK = threading.Lock()
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_MAGIC = re.compile(r"[*?\[]")


class MissingPathError(UserError, FileNotFoundError):
    """An input path or pattern that names no file; the message says which and what to check."""


class FolderError(UserError):
    """A remote URI that names a folder (a collection) where a file was expected."""

    def __init__(self, uri: str) -> None:
        base = uri.rstrip("/")
        super().__init__(
            f"{uri}: is a folder, not a file; name its files with a glob ({base}/*.parquet) or end the URI "
            f"with '/' to read every file under it (in data.paths)"
        )
        self.uri = uri


def is_folder(fs: Any, path: str) -> bool:
    """Whether `path` on the remote `fs` names a folder: a Pelican collection (WebDAV probe), or a HEAD
    answered with the XRootD/Pelican folder type. Cheap (one small request), so asked only after a failure;
    False when unsure (the probe failing too)."""
    if path.endswith("/"):
        return True
    try:
        if hasattr(fs, "_is_collection"):  # pelicanfs: asks the collections endpoint
            return bool(fs.isdir(path))
        info = fs.info(path)
    except Exception:  # a failing probe proves nothing: the caller goes on with its own error
        return False
    return info.get("type") == "directory" or str(info.get("mimetype", "")).startswith("httpd/unix-directory")


def is_remote(path: str | os.PathLike[str]) -> bool:
    """True for a URL other than file:// (pelican://, osdf://, https://, s3://, ...)."""
    match = _SCHEME.match(str(path))
    return match is not None and match.group(1).lower() != "file"


def has_magic(path: str) -> bool:
    return bool(_MAGIC.search(path))


def resolve_token(pelican: PelicanConfig | None, env: dict[str, str] | None = None) -> str | None:
    """The bearer token: data.pelican.token_file, else BEARER_TOKEN, BEARER_TOKEN_FILE, data.pelican.token."""
    env = dict(os.environ) if env is None else env
    if pelican is not None and pelican.token_file:
        return _read_token_file(pelican.token_file, "data.pelican.token_file")
    if env.get("BEARER_TOKEN", "").strip():
        return env["BEARER_TOKEN"].strip()
    if env.get("BEARER_TOKEN_FILE"):
        return _read_token_file(env["BEARER_TOKEN_FILE"], "BEARER_TOKEN_FILE")
    if pelican is not None and pelican.token is not None:
        return pelican.token.get_secret_value().strip() or None
    return None


def _read_token_file(path: str, source: str) -> str:
    try:
        text = Path(path).expanduser().read_text().strip()
    except OSError as err:
        raise ValueError(f"{source}: cannot read token file {path} ({err.strerror})") from None
    if text.startswith("{"):
        try:
            text = str(json.loads(text).get("access_token", "")).strip()
        except json.JSONDecodeError:
            raise ValueError(f"{source}: token file {path} is neither a token nor JSON") from None
    if not text:
        raise ValueError(f"{source}: token file {path} is empty")
    return text


def scrub(text: str, secret: str | None) -> str:
    """`text` with the secret replaced by ***, for messages that may quote a request."""
    return text.replace(secret, "***") if secret else text


def _ssl_context(ca_file: str | None) -> ssl.SSLContext | None:
    if ca_file is None:
        return None
    if not Path(ca_file).is_file():
        raise ValueError(f"data.pelican.ca_file: {ca_file} is not a file")
    return ssl.create_default_context(cafile=ca_file)


async def _make_client(
    ssl_ctx: ssl.SSLContext | None, timeout: float, **kwargs: Any
) -> aiohttp.ClientSession:
    """fsspec's get_client with our CA and a stall timeout (no total limit: big files take long)."""
    connector = aiohttp.TCPConnector(ssl=ssl_ctx if ssl_ctx is not None else True)
    kwargs.setdefault("timeout", aiohttp.ClientTimeout(total=None, sock_connect=timeout, sock_read=timeout))
    return aiohttp.ClientSession(connector=connector, **kwargs)


def _webdav_factory(ssl_ctx: ssl.SSLContext) -> Any:
    """pelicanfs get_webdav_client that trusts our CA (pelicanfs' own options never set verify_ssl)."""
    from pelicanfs.core import get_webdav_client

    @asynccontextmanager
    async def factory(options: dict[str, Any]) -> AsyncIterator[Any]:
        async with get_webdav_client({**options, "verify_ssl": ssl_ctx}) as client:
            yield client

    return factory


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
        self._ssl = _ssl_context(self._pelican.ca_file)
        self._storage_options = dict(storage_options or {})
        self._timeout = timeout
        self._fs: dict[str, Any] = {}

    def __repr__(self) -> str:
        return f"RemoteFiles(filesystems={sorted(self._fs)}, token={'set' if self._token else 'none'})"

    def scrub(self, text: str) -> str:
        return scrub(text, self._token)

    def federation(self, uri: str) -> tuple[str, str, str]:
        """(discovery URL, namespace path, canonical prefix) of a pelican:// or osdf:// URI."""
        parts = urllib.parse.urlsplit(uri)
        scheme = parts.scheme.lower()
        if scheme == "pelican" and parts.netloc:
            return f"pelican://{parts.netloc}/", parts.path, f"pelican://{parts.netloc}"
        if scheme == "osdf" and parts.netloc:
            # osdf://ns/file is a common typo of osdf:///ns/file; pelicanfs reads it the same way
            path = "/" + parts.netloc + parts.path
        else:
            path = parts.path
        discovery = self._pelican.federation_url or OSDF_DISCOVERY
        return discovery, path, f"{scheme}://"

    def resolve(self, uri: str) -> tuple[Any, str]:
        scheme = uri.split("://", 1)[0].lower()
        if scheme in ("pelican", "osdf"):
            discovery, path, _ = self.federation(uri)
            if not path or path == "/":
                raise ValueError(f"{uri}: no namespace path after the federation")
            return self._pelican_fs(discovery), path
        key = f"url:{scheme}"
        if key not in self._fs:
            options = dict(self._storage_options)
            if scheme in ("http", "https"):
                options.setdefault("get_client", functools.partial(_make_client, self._ssl, self._timeout))
            self._fs[key] = fsspec.filesystem(scheme, skip_instance_cache=True, **options)
        fs = self._fs[key]
        return fs, fs._strip_protocol(uri) if scheme not in ("http", "https") else uri

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

        options: dict[str, Any] = {"get_client": functools.partial(_make_client, self._ssl, self._timeout)}
        if self._ssl is not None:
            options["get_webdav_client"] = _webdav_factory(self._ssl)
        if self._token:
            options["headers"] = {"Authorization": f"Bearer {self._token}"}
        # our own instance per federation: fsspec's cached one stays bound to the first federation
        return PelicanFileSystem(discovery, skip_instance_cache=True, **options)

    def canonical(self, uri: str, fs: Any, path: str) -> str:
        """The URI for a path that `resolve(uri)`'s filesystem returned (globs, listings)."""
        scheme = uri.split("://", 1)[0].lower()
        if scheme in ("pelican", "osdf"):
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
        except Exception as err:  # a listing can fail in many ways; name the URI, keep the token out
            raise RuntimeError(
                f"listing {uri} failed: {type(err).__name__}: {self.scrub(str(err))}"
            ) from None
        files = [self.canonical(uri, fs, p) for p, info in found.items() if info.get("type") != "directory"]
        if not files:
            raise MissingPathError(f"{uri}: no remote file matches")
        return files


def _missing_local(path: str) -> MissingPathError:
    parent = Path(path).absolute()
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    return MissingPathError(
        f"{path}: no such file or directory (nearest existing folder: {parent}); if the data lives on a "
        f"shared or scratch volume, check that it is mounted on this node"
    )


def _expand_local(path: str) -> list[str]:
    path = os.path.expanduser(path.removeprefix("file://"))
    if has_magic(path):
        found = [p for p in globlib.glob(path, recursive=True) if os.path.isfile(p)]
        if not found:
            base = re.split(r"[*?\[]", path, maxsplit=1)[0]
            if not os.path.exists(os.path.dirname(base) or "."):
                raise _missing_local(path)
            raise MissingPathError(f"{path}: no file matches this pattern (check the folder and the pattern)")
        return [os.path.abspath(p) for p in found]
    if os.path.isdir(path):
        found = [
            os.path.join(root, name)
            for root, dirs, names in os.walk(path)
            for name in names
            if not name.startswith(".")
        ]
        if not found:
            raise MissingPathError(f"{path}: the folder is empty (hidden files are ignored)")
        return [os.path.abspath(p) for p in found]
    if not os.path.exists(path):
        raise _missing_local(path)
    return [os.path.abspath(path)]


def expand_paths(
    paths: list[str],
    pelican: PelicanConfig | None = None,
    storage_options: dict[str, Any] | None = None,
) -> list[str]:
    """Sorted, de-duplicated files named by local paths/globs/folders and remote URIs/globs.

    Remote URIs without a wildcard are kept as given (checked when staged); a remote URI ending in "/" means
    every file under it. Raises MissingPathError naming a path that matches nothing.
    """
    if isinstance(paths, str):
        raise ValueError("data.paths must be a list of paths, not a string")
    remote = None
    out: set[str] = set()
    for path in paths:
        path = str(path)
        if is_remote(path):
            remote = remote or RemoteFiles(pelican, storage_options)
            out.update(remote.expand(path))
        else:
            out.update(_expand_local(path))
    return sorted(out)


def mirror(
    local_path: str | os.PathLike[str], dest: str, storage_options: dict[str, Any] | None = None
) -> str:
    """Copy a file or folder to `dest/<name>` (a local folder or an fsspec URL); returns the copy's path.

    A local copy appears atomically: it is written under a temporary name and renamed, so a reader of the
    mirror never sees half a checkpoint. A folder copy replaces an older copy of the same name.
    """
    src = Path(local_path)
    if not src.exists():
        raise MissingPathError(f"mirror: {src} does not exist")
    name = src.name
    if is_remote(dest):
        target = dest.rstrip("/") + "/" + name
        fs, path = fsspec.core.url_to_fs(target, **(storage_options or {}))
        if src.is_dir():
            fs.put(str(src), path, recursive=True)
        else:
            fs.put_file(str(src), path)
        return target
    dest_dir = Path(dest.removeprefix("file://")).expanduser()
    dest_dir.mkdir(parents=True, exist_ok=True)
    final = dest_dir / name
    tmp = dest_dir / f".{name}.tmp-{os.getpid()}"
    if tmp.is_dir():
        shutil.rmtree(tmp)
    if src.is_dir():
        shutil.copytree(src, tmp, copy_function=_copy_synced)
        old = dest_dir / f".{name}.old-{os.getpid()}"
        if final.exists():
            os.replace(final, old)
        os.replace(tmp, final)
        if old.exists():
            shutil.rmtree(old) if old.is_dir() else old.unlink()
    else:
        _copy_synced(str(src), str(tmp))
        if final.is_dir():
            shutil.rmtree(final)
        os.replace(tmp, final)
    return str(final)


def _copy_synced(src: str, dst: str) -> str:
    shutil.copy2(src, dst)
    with open(dst, "rb+") as fh:
        os.fsync(fh.fileno())
    return dst


class FolderMirror:
    """Keeps `dest/<folder name>/` a copy of a local folder that is whole at every moment (checkpoint.mirror_to).

    Each `sync` copies only what changed (local: size and mtime differ, or the bytes of a small file; a URL: what
    this object has not sent yet), each file under a temporary name then renamed; a file whose `.json` companion
    (its hash) changes too loses that companion first, as in the local commit protocol. Then the `last` files
    (the `latest` pointer), so the pointer never names a file the mirror lacks. Only then are files the folder
    no longer has removed. Hidden files (temporaries) are never copied. One sync at a time per destination.
    """

    _SMALL = 1 << 16  # files up to this size are compared by content

    def __init__(self, dest: str, storage_options: dict[str, Any] | None = None) -> None:
        self.dest = dest
        self._storage_options = dict(storage_options or {})
        self._sent: dict[str, tuple[int, int]] = {}  # URL destinations: name -> (size, mtime_ns) sent

    def sync(self, folder: str | os.PathLike[str], last: tuple[str, ...] = ()) -> str:
        """Bring the mirror of `folder` up to date; returns its location."""
        src = Path(folder)
        if not src.is_dir():
            raise MissingPathError(f"mirror: {src} is not a folder")
        files = {
            entry.name: entry.stat()
            for entry in os.scandir(src)
            if entry.is_file() and not entry.name.startswith(".")
        }
        if is_remote(self.dest):
            target = self.dest.rstrip("/") + "/" + src.name
            ops: _MirrorOps = _RemoteMirror(target, self._storage_options, self._sent)
        else:
            target = str(Path(self.dest.removeprefix("file://")).expanduser() / src.name)
            ops = _LocalMirror(Path(target))
        present = ops.names()
        changed = [
            name
            for name in files
            if name not in last and (name not in present or not ops.same(src / name, files[name]))
        ]
        for name in changed:
            companion = str(Path(name).with_suffix(".json"))
            if companion != name and companion in changed and companion in present:
                ops.remove(companion)  # never new data beside its old hash, even for a moment
        for name in sorted(changed, key=lambda n: n.endswith(".json")):  # data, then the hashes
            ops.put(src / name, files[name])
        for name in last:
            if name in files:
                ops.put(src / name, files[name])
        for name in sorted(present - files.keys()):
            ops.remove(name)
        ops.done()
        return target


class _MirrorOps:
    def names(self) -> set[str]:
        raise NotImplementedError

    def same(self, path: Path, stat: os.stat_result) -> bool:
        raise NotImplementedError

    def put(self, path: Path, stat: os.stat_result) -> None:
        raise NotImplementedError

    def remove(self, name: str) -> None:
        raise NotImplementedError

    def done(self) -> None:
        pass


class _LocalMirror(_MirrorOps):
    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        mine = f".mirror-{os.getpid()}@"
        for entry in os.scandir(root):  # a temporary of an earlier, failed sync of this process
            if entry.name.startswith(".") and mine in entry.name:
                Path(entry.path).unlink(missing_ok=True)

    def names(self) -> set[str]:
        return {e.name for e in os.scandir(self.root) if e.is_file() and not e.name.startswith(".")}

    def same(self, path: Path, stat: os.stat_result) -> bool:
        copy = self.root / path.name
        try:
            theirs = copy.stat()
        except FileNotFoundError:
            return False
        if theirs.st_size != stat.st_size:
            return False
        if stat.st_size <= FolderMirror._SMALL:
            return copy.read_bytes() == path.read_bytes()
        return theirs.st_mtime_ns == stat.st_mtime_ns  # copy2 keeps it; a rewrite changes it

    def put(self, path: Path, stat: os.stat_result) -> None:
        tmp = self.root / f".{path.name}.mirror-{os.getpid()}@{socket.gethostname()}"
        _copy_synced(str(path), str(tmp))
        os.replace(tmp, self.root / path.name)

    def remove(self, name: str) -> None:
        (self.root / name).unlink(missing_ok=True)

    def done(self) -> None:
        fd = os.open(self.root, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class _RemoteMirror(_MirrorOps):
    def __init__(
        self, target: str, storage_options: dict[str, Any], sent: dict[str, tuple[int, int]]
    ) -> None:
        self.fs, self.root = fsspec.core.url_to_fs(target, **storage_options)
        self.root = self.root.rstrip("/")
        self.fs.makedirs(self.root, exist_ok=True)
        self.sent = sent

    def names(self) -> set[str]:
        found = self.fs.ls(self.root, detail=True)
        names = {str(info["name"]).rstrip("/").rsplit("/", 1)[-1] for info in found if info["type"] == "file"}
        return {n for n in names if not n.startswith(".")}

    def same(self, path: Path, stat: os.stat_result) -> bool:
        return self.sent.get(path.name) == (stat.st_size, stat.st_mtime_ns)

    def put(self, path: Path, stat: os.stat_result) -> None:
        tmp = f"{self.root}/.{path.name}.mirror-{os.getpid()}"
        self.fs.put_file(str(path), tmp)
        self.fs.mv(tmp, f"{self.root}/{path.name}")
        self.sent[path.name] = (stat.st_size, stat.st_mtime_ns)

    def remove(self, name: str) -> None:
        self.fs.rm_file(f"{self.root}/{name}")
        self.sent.pop(name, None)


class TransferError(Exception):
    """A transfer that ended short or with the wrong size (transient)."""


def classify_failure(err: BaseException, fs: Any, path: str, scrub: Callable[[str], str]) -> tuple[str, str]:
    """("transient" | "bad" | "fatal", reason passed through `scrub`) of a failed read of `path` on `fs`.

    transient: retry (refused, reset, timeout, 5xx, cut transfer); bad: this file (404, 403); fatal: the
    setup (certificate, scratch full) - every file would fail the same way.
    """
    from aiowebdav2 import exceptions as dav
    from pelicanfs.exceptions import InvalidMetadata, NoAvailableSource

    if isinstance(err, FileNotFoundError) and isinstance(err.__cause__, Exception):
        # fsspec's HTTP info turns ANY failure of its HEAD and GET (a 503, a reset) into FileNotFoundError
        return classify_failure(err.__cause__, fs, path, scrub)
    status = getattr(err, "status", None) or getattr(err, "code", None)
    status = status if isinstance(status, int) else None
    if isinstance(err, (FileNotFoundError, dav.RemoteResourceNotFoundError)) or status in (404, 410):
        return "bad", "not found (HTTP 404)"
    if isinstance(err, (dav.AccessDeniedError, dav.UnauthorizedError)) or status in (401, 403):
        return (
            "bad",
            f"access denied (HTTP {status or 403}): check data.pelican.token_file / BEARER_TOKEN",
        )
    if isinstance(err, NoAvailableSource):
        return _probe(fs, path)
    if status is not None and (status >= 500 or status in (408, 429)):
        return "transient", f"HTTP {status}"
    if status is not None and status >= 400:
        return "bad", f"HTTP {status}"
    lines = scrub(str(err)).strip().splitlines()  # one line: it ends up in an error line and bad_files.txt
    reason = f"{type(err).__name__}: {lines[0] if lines else ''}"[:300]
    if isinstance(err, (aiohttp.ClientConnectorCertificateError, ssl.SSLCertVerificationError)):
        # every file would fail the same way: not a bad file, a setup to fix
        return "fatal", f"{reason}; trust the server's CA with data.pelican.ca_file"
    local = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM)
    if isinstance(err, OSError) and not isinstance(err, aiohttp.ClientError) and err.errno in local:
        return "fatal", f"cannot write to scratch ({err.strerror}); check data.staging.dir and its free space"
    transient = (
        aiohttp.ClientConnectionError,
        aiohttp.ClientPayloadError,
        asyncio.TimeoutError,
        TimeoutError,
        ConnectionError,
        TransferError,
        dav.NoConnectionError,
        dav.ConnectionExceptionError,
        InvalidMetadata,  # discovery answered, but not 200
    )
    if isinstance(err, transient):
        return "transient", reason
    if isinstance(err, OSError) and err.errno in (errno.ECONNREFUSED, errno.ECONNRESET, errno.ETIMEDOUT):
        return "transient", reason
    return "bad", reason


def _probe(fs: Any, path: str) -> tuple[str, str]:
    """Why no cache serves `path`: ask the director and the caches it names (pelicanfs hides the status)."""
    from fsspec.asyn import sync
    from pelicanfs.dir_header_parser import parse_director_response

    async def statuses() -> tuple[list[str], list[int | None]]:
        servers = parse_director_response(await fs.get_director_headers(path)).object_servers
        session = await fs.http_file_system.set_session()
        headers = fs.http_file_system.kwargs.get("headers", {})
        out: list[int | None] = []
        for url in servers:
            try:
                async with session.head(url, headers=headers, timeout=aiohttp.ClientTimeout(total=5)) as resp:
                    out.append(resp.status)
            except (aiohttp.ClientError, asyncio.TimeoutError):
                out.append(None)
        return servers, out

    try:
        servers, codes = sync(fs.loop, statuses)
    except Exception as err:  # the director itself is unreachable: try again later
        return "transient", f"no cache available and the director did not answer ({type(err).__name__})"
    if not servers:
        return "bad", "no namespace of the federation serves this path (the director lists no cache)"
    usable = [c for c in codes if c is not None and (c < 400 or c == 404)]
    if not usable and any(c in (401, 403) for c in codes):
        return "bad", "access denied (HTTP 403) by every cache: check data.pelican.token_file / BEARER_TOKEN"
    return "transient", f"no cache available (cache answers: {codes})"
