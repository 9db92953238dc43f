"""Pelican access: where the bearer token comes from, keeping it out of messages, the CA to trust, and the HTTP
client factories fsspec and pelicanfs build their sessions with."""

from __future__ import annotations

import functools
import json
import os
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpctrain.config.remote import PelicanConfig
from hpctrain.config.secrets import is_masked

if TYPE_CHECKING:
    import aiohttp


def resolve_token(pelican: PelicanConfig | None, env: dict[str, str] | None = None) -> str | None:
    """The bearer token: data.pelican.token_file, else BEARER_TOKEN, BEARER_TOKEN_FILE, data.pelican.token."""
    env = dict(os.environ) if env is None else env
    if pelican is not None and pelican.token_file:
        return _read_token_file(pelican.token_file, "data.pelican.token_file")
    if env.get("BEARER_TOKEN", "").strip() and not is_masked(env["BEARER_TOKEN"]):
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
        except (json.JSONDecodeError, RecursionError):
            raise ValueError(f"{source}: token file {path} is neither a token nor JSON") from None
    if not text:
        raise ValueError(f"{source}: token file {path} is empty")
    if is_masked(text):
        raise ValueError(f"{source}: token file {path} holds a mask ({text[:10]}), not a token")
    return text


def scrub(text: str, secret: str | None) -> str:
    """`text` with the secret replaced by ***, for messages that may quote a request."""
    return text.replace(secret, "***") if secret else text


def pin_verify(session: Any, ca_file: str | None) -> Any:
    """A requests session that checks certificates against data.pelican.ca_file on every request: requests lets
    REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE from the environment beat `session.verify`, so it goes per request."""
    if ca_file is not None:
        session.request = functools.partial(session.request, verify=ca_file)
    return session


def ssl_context(ca_file: str | None) -> ssl.SSLContext | None:
    """A context trusting `ca_file` (data.pelican.ca_file); None: the system's CAs."""
    if ca_file is None:
        return None
    if not Path(ca_file).is_file():
        raise ValueError(f"data.pelican.ca_file: {ca_file} is not a file")
    return ssl.create_default_context(cafile=ca_file)


async def make_client(ssl_ctx: ssl.SSLContext | None, timeout: float, **kwargs: Any) -> aiohttp.ClientSession:
    """fsspec's get_client with our CA and a stall timeout (no total limit: big files take long)."""
    import aiohttp  # here: ~0.1 s that a run without remote files (and every token check) need not pay

    connector = aiohttp.TCPConnector(ssl=ssl_ctx if ssl_ctx is not None else True)
    kwargs.setdefault("timeout", aiohttp.ClientTimeout(total=None, sock_connect=timeout, sock_read=timeout))
    return aiohttp.ClientSession(connector=connector, **kwargs)


def webdav_factory(ssl_ctx: ssl.SSLContext) -> Any:
    """pelicanfs get_webdav_client that trusts our CA (pelicanfs' own options never set verify_ssl)."""
    from pelicanfs.core import get_webdav_client

    @asynccontextmanager
    async def factory(options: dict[str, Any]) -> AsyncIterator[Any]:
        async with get_webdav_client({**options, "verify_ssl": ssl_ctx}) as client:
            yield client

    return factory
