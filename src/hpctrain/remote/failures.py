"""Why a remote read failed: a failure to retry, a bad file, or a setup every file would fail on; and the cheap
probes (is it a folder? what do the caches answer?) asked only after a failure."""

from __future__ import annotations

import asyncio
import errno
import ssl
from collections.abc import Callable
from typing import Any, Literal

Kind = Literal["transient", "bad", "fatal"]


class TransferError(Exception):
    """A transfer that ended short or with the wrong size (transient)."""


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


def classify_failure(err: BaseException, fs: Any, path: str, scrub: Callable[[str], str]) -> tuple[Kind, str]:
    """("transient" | "bad" | "fatal", reason passed through `scrub`) of a failed read of `path` on `fs`.

    transient: retry (refused, reset, timeout, 5xx, cut transfer); bad: this file (404, 403); fatal: the
    setup (certificate, scratch full) - every file would fail the same way.
    """
    import aiohttp  # here, like the clients below: a run that never fails a remote read never loads them
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
        return probe_caches(fs, path)
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


def probe_caches(fs: Any, path: str) -> tuple[Kind, str]:
    """Why no cache serves `path`: ask the director and the caches it names (pelicanfs hides the status)."""
    import aiohttp
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
