"""Pelican tokens from an OIDC issuer: the device flow (RFC 8628) once on a login node, refresh grants after.

    login(pelican, scopes)      register a client, print the verification URL and code once, poll within the
                                issuer's interval (slower after slow_down), cache the tokens
    access_token(pelican)       a live access token from the cache, refreshed before it expires (also during
                                a long run: every caller asks again before each use)

The cache (`data.pelican.auth_cache_file`, default `$XDG_CONFIG_HOME/hpctrain/pelican-tokens.json`) is one
JSON file, mode 0600 in a 0700 folder, never in a run folder; it holds one login per issuer and set of
scopes (client id and secret, refresh token, the current access token and its expiry). A login is reused when
its issuer matches and its storage scopes cover the ones asked for (`storage.read:/a` covers `/a/b`).

Scopes follow the WLCG token profile: `storage.read:<path>` for inputs, `storage.modify:<path>` for outputs,
the path being the namespace path minus `data.pelican.storage_prefix` (or `data.pelican.scope_path`).

Inside a batch job (SLURM_JOB_ID set, or no terminal) nobody can type a code: a missing or unrefreshable
login is one line (UserError, exit 2) asking to run `hpctrain auth login` on a login node. Tokens never reach
a message: errors quote the issuer's error code, never a request or a response body.

Size (~420 lines): the device flow, the refresh grant and the token cache share one lock-protected file format.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hpctrain.config.remote import PelicanConfig
from hpctrain.errors import UserError
from hpctrain.fsutil import atomic_path
from hpctrain.remote.auth import pin_verify
from hpctrain.remote.uris import PELICAN_SCHEMES, has_magic, magic_prefix, scheme, split_federation

DEVICE_GRANT = "urn:ietf:params:oauth:grant-type:device_code"
CACHE_NAME = "pelican-tokens.json"
_LOGIN_HINT = "run `hpctrain auth login {uri}` on a login node (it caches a token for the batch jobs)"
_LOCK = threading.Lock()  # one refresh at a time per process (uploads, staging threads)


@dataclass
class Login:
    """One cached login: the client the issuer registered, the refresh token and the current access token."""

    oidc_url: str
    client_id: str
    client_secret: str
    scopes: list[str]
    refresh_token: str
    access_token: str = ""
    expires_at: float = 0.0
    issued_at: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def __repr__(self) -> str:  # never the secrets
        return f"Login(oidc_url={self.oidc_url!r}, scopes={self.scopes!r})"

    def fresh(self, now: float) -> bool:
        """Whether the access token lives long enough to use: refreshed when less than a third of its life
        (at most 60 s) is left, so an upload never starts with a token about to expire."""
        margin = min(60.0, (self.expires_at - self.issued_at) / 3)
        return bool(self.access_token) and now < self.expires_at - margin


def cache_file(pelican: PelicanConfig, env: dict[str, str] | None = None) -> Path:
    """data.pelican.auth_cache_file, else $XDG_CONFIG_HOME (or ~/.config)/hpctrain/pelican-tokens.json."""
    env = dict(os.environ) if env is None else env
    if pelican.auth_cache_file:
        return Path(pelican.auth_cache_file).expanduser()
    base = env.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "hpctrain" / CACHE_NAME


def interactive(env: dict[str, str] | None = None) -> bool:
    """Whether someone can type a code: a terminal, and not inside a batch job."""
    env = dict(os.environ) if env is None else env
    return sys.stdin is not None and sys.stdin.isatty() and not env.get("SLURM_JOB_ID")


# ---- scopes -----------------------------------------------------------------------------------------------


def scope_path(uri: str, pelican: PelicanConfig, folder: bool) -> str:
    """The path a scope names for `uri`: data.pelican.scope_path, else the URI's namespace path (its folder for
    a file or a glob) minus data.pelican.storage_prefix."""
    if pelican.scope_path:
        return "/" + pelican.scope_path.strip("/")
    path = split_federation(uri, pelican.federation_url)[1]
    if has_magic(path):
        path = magic_prefix(path).rsplit("/", 1)[0]
    elif not folder and not path.endswith("/"):
        path = path.rsplit("/", 1)[0]
    path = "/" + path.strip("/")
    prefix = "/" + (pelican.storage_prefix or "").strip("/")
    if prefix != "/" and (path == prefix or path.startswith(prefix + "/")):
        path = path[len(prefix) :] or "/"
    return path


def scopes_for(reads: list[str], writes: list[str], pelican: PelicanConfig) -> list[str]:
    """storage.read for the first Pelican input's folder, storage.read + storage.modify for the first Pelican
    output folder (a resumed hop reads back what earlier hops wrote)."""
    out: list[str] = []
    first_read = next((u for u in reads if scheme(u) in PELICAN_SCHEMES), None)
    first_write = next((u for u in writes if scheme(u) in PELICAN_SCHEMES), None)
    if first_read:
        out.append(f"storage.read:{scope_path(first_read, pelican, folder=False)}")
    if first_write:
        path = scope_path(first_write, pelican, folder=True)
        out += [f"storage.read:{path}", f"storage.modify:{path}"]
    return list(dict.fromkeys(out))


def covers(have: list[str], want: list[str]) -> bool:
    """Whether every storage scope in `want` is covered by one in `have` (same kind, same or parent path)."""

    def one(scope: str) -> bool:
        kind, _, path = scope.partition(":")
        for mine in have:
            k, _, base = mine.partition(":")
            base = base.rstrip("/")
            if k == kind and (path == base or path.startswith(base + "/") or base == ""):
                return True
        return False

    return all(one(s) for s in want if s.startswith("storage."))


# ---- the issuer -------------------------------------------------------------------------------------------


def discover_issuer(uri: str, pelican: PelicanConfig) -> str:
    """data.pelican.oidc_url, else the issuer the federation's director names for `uri`'s namespace."""
    if pelican.oidc_url:
        return pelican.oidc_url.rstrip("/")
    import requests

    discovery, path, _ = split_federation(uri, pelican.federation_url)
    base = "https://" + discovery.split("://", 1)[1].rstrip("/")
    verify: Any = pelican.ca_file or True
    try:
        meta = requests.get(f"{base}/.well-known/pelican-configuration", verify=verify, timeout=30).json()
        director = str(meta["director_endpoint"]).rstrip("/")
        resp = requests.get(f"{director}{path}", verify=verify, timeout=30, allow_redirects=False)
    except (requests.RequestException, ValueError, KeyError) as exc:
        raise UserError(
            f"cannot ask the federation {discovery} for the token issuer of {uri} ({type(exc).__name__}); set "
            "data.pelican.oidc_url"
        ) from None
    for part in resp.headers.get("X-Pelican-Authorization", "").split(","):
        key, _, value = part.strip().partition("=")
        if key == "issuer" and value:
            return value.rstrip("/")
    raise UserError(f"the federation names no token issuer for {uri}; set data.pelican.oidc_url")


def _session(pelican: PelicanConfig, login: Login | None = None, scope: str | None = None) -> Any:
    from authlib.integrations.requests_client import OAuth2Session

    session = OAuth2Session(
        login.client_id if login else None,
        login.client_secret if login else None,
        scope=scope,
        token_endpoint_auth_method="client_secret_post",
    )
    return pin_verify(session, pelican.ca_file)


def _metadata(session: Any, issuer: str) -> dict[str, Any]:
    try:
        resp = session.get(f"{issuer}/.well-known/openid-configuration", timeout=30, withhold_token=True)
    except OSError as exc:  # requests' errors are OSErrors: refused, TLS, timeout
        raise UserError(f"cannot reach the token issuer {issuer} ({type(exc).__name__})") from None
    if resp.status_code != 200:
        raise UserError(f"the token issuer {issuer} has no OIDC discovery document (HTTP {resp.status_code})")
    meta: dict[str, Any] = resp.json()
    if "device_authorization_endpoint" not in meta:
        raise UserError(f"the token issuer {issuer} offers no device flow (no device_authorization_endpoint)")
    return meta


def login(
    pelican: PelicanConfig,
    issuer: str,
    scopes: list[str],
    say: Callable[[str], None] = print,
    clock: Callable[[], float] = time.monotonic,
) -> Login:
    """The device flow: register a client, show the URL and code once, poll until approved; cache the result."""
    try:
        session = _session(pelican)
        meta = _metadata(session, issuer)
        entry = _register(session, meta, issuer, scopes)
        wanted = " ".join([*scopes, "offline_access"])
        session = _session(pelican, entry, wanted)
        dev = session.post(
            meta["device_authorization_endpoint"],
            data={"client_id": entry.client_id, "scope": wanted},
            timeout=30,
            withhold_token=True,
        )
        if dev.status_code != 200:
            raise UserError(f"the token issuer {issuer} refused the device login (HTTP {dev.status_code})")
        grant = dev.json()
        url = grant.get("verification_uri_complete") or grant["verification_uri"]
        say(
            f"To allow hpctrain to use {' '.join(scopes)}, open {url} and enter the code {grant['user_code']}"
        )
        token = _poll(session, meta["token_endpoint"], grant, issuer, clock)
    except UserError:  # already one line naming the issuer's answer
        raise
    except (OSError, ValueError, KeyError) as exc:  # unreachable, or answers that are not what RFC 8628 says
        raise UserError(f"the device login with {issuer} failed ({type(exc).__name__})") from None
    _take(entry, token)
    save(pelican, entry)
    return entry


def _register(session: Any, meta: dict[str, Any], issuer: str, scopes: list[str]) -> Login:
    """Dynamic client registration (RFC 7591): the client id and secret this login's tokens belong to."""
    if "registration_endpoint" not in meta:
        raise UserError(f"the token issuer {issuer} offers no client registration (no registration_endpoint)")
    reg = session.post(
        meta["registration_endpoint"],
        json={
            "client_name": "hpctrain",
            "grant_types": [DEVICE_GRANT, "refresh_token"],
            "scope": " ".join(scopes),
        },
        timeout=30,
        withhold_token=True,
    )
    if reg.status_code not in (200, 201):
        raise UserError(f"the token issuer {issuer} refused to register a client (HTTP {reg.status_code})")
    client = reg.json()
    return Login(issuer, client["client_id"], client.get("client_secret", ""), list(scopes), "")


def _poll(
    session: Any, endpoint: str, grant: dict[str, Any], issuer: str, clock: Callable[[], float]
) -> dict[str, Any]:
    """Ask the token endpoint every `interval` seconds until the user approved (RFC 8628, 3.4-3.5)."""
    from authlib.integrations.base_client.errors import OAuthError

    interval = float(grant.get("interval", 5))
    deadline = clock() + float(grant.get("expires_in", 600))
    while True:
        time.sleep(interval)
        if clock() > deadline:
            raise UserError("the login code expired before it was approved; run `hpctrain auth login` again")
        try:
            token: dict[str, Any] = session.fetch_token(
                endpoint, grant_type=DEVICE_GRANT, device_code=grant["device_code"]
            )
            return token
        except OAuthError as exc:
            if exc.error == "authorization_pending":
                continue
            if exc.error == "slow_down":
                interval += 5 if interval >= 5 else interval  # RFC 8628: +5 s (scaled for short intervals)
                continue
            raise UserError(f"the token issuer {issuer} refused the login ({exc.error})") from None


def _take(entry: Login, token: dict[str, Any]) -> None:
    now = time.time()
    entry.access_token = str(token["access_token"])
    entry.refresh_token = str(token.get("refresh_token") or entry.refresh_token)
    entry.issued_at = now
    entry.expires_at = now + float(token.get("expires_in") or 600)


def refresh(pelican: PelicanConfig, entry: Login, uri_hint: str = "") -> Login:
    """A new access token from the refresh token (the cache updated); UserError with the login hint when the
    issuer refuses (an expired or revoked refresh token)."""
    from authlib.integrations.base_client.errors import OAuthError

    session = _session(pelican, entry)
    try:
        meta = _metadata(session, entry.oidc_url)
        token = session.refresh_token(
            meta["token_endpoint"], refresh_token=entry.refresh_token, scope=" ".join(entry.scopes)
        )
    except OAuthError as exc:
        raise UserError(
            f"the Pelican token cannot be refreshed ({exc.error}: the login expired); "
            + _LOGIN_HINT.format(uri=uri_hint or "<URI>")
        ) from None
    except OSError as exc:
        raise UserError(
            f"the token issuer {entry.oidc_url} cannot be reached to refresh the Pelican token "
            f"({type(exc).__name__})"
        ) from None
    _take(entry, token)
    save(pelican, entry)
    return entry


# ---- the cache --------------------------------------------------------------------------------------------


def load(pelican: PelicanConfig) -> list[Login]:
    """Every login in the cache (none when it is missing); a cache others may read is refused."""
    path = cache_file(pelican)
    try:
        mode = path.stat().st_mode
        text = path.read_text()
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise UserError(f"data.pelican.auth_cache_file: cannot read {path} ({exc.strerror})") from None
    if mode & 0o077:
        raise UserError(
            f"data.pelican.auth_cache_file: {path} is readable by others (mode {mode & 0o777:o}); "
            f"`chmod 600 {path}` or delete it and log in again"
        )
    try:
        entries = json.loads(text).get("logins", [])
        return [Login(**entry) for entry in entries]
    except (ValueError, TypeError, AttributeError, RecursionError):
        raise UserError(
            f"data.pelican.auth_cache_file: {path} is not a token cache; delete it and log in again"
        ) from None


def save(pelican: PelicanConfig, entry: Login) -> Path:
    """Store `entry` (replacing the login of the same issuer and scopes), mode 0600 in a 0700 folder."""
    path = cache_file(pelican)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with _LOCK:
        others = [
            e
            for e in load(pelican)
            if not (e.oidc_url == entry.oidc_url and sorted(e.scopes) == sorted(entry.scopes))
        ]
        text = json.dumps({"version": 1, "logins": [asdict(e) for e in [entry, *others]]}, indent=1)
        with atomic_path(path) as tmp:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as fh:
                os.fchmod(fh.fileno(), 0o600)
                fh.write(text)
    return path


def find(pelican: PelicanConfig, scopes: list[str], issuer: str | None = None) -> Login | None:
    """The newest cached login of `issuer` (any, when None) whose scopes cover `scopes`."""
    for entry in load(pelican):
        if (issuer is None or entry.oidc_url == issuer) and covers(entry.scopes, scopes):
            return entry
    return None


# ---- what the rest of hpctrain asks -----------------------------------------------------------------------

_ACTIVE: dict[str, Login] = {}  # cache file -> the login this process uses (set by ensure_login)


def ensure_login(pelican: PelicanConfig, reads: list[str], writes: list[str]) -> Login | None:
    """Make sure the run's Pelican URIs have a token (data.pelican.auto_token): the cached login, refreshed
    when needed; a device login when someone is at a terminal; else UserError with the login hint."""
    scopes = scopes_for(reads, writes, pelican)
    if not pelican.auto_token or not scopes:
        return None
    uri = next(u for u in [*writes, *reads] if scheme(u) in PELICAN_SCHEMES)
    issuer = pelican.oidc_url.rstrip("/") if pelican.oidc_url else None
    entry = find(pelican, scopes, issuer)
    if entry is None:
        if not interactive():
            raise UserError(
                f"no cached Pelican login covers {' '.join(scopes)}; " + _LOGIN_HINT.format(uri=uri)
            )
        entry = login(pelican, issuer or discover_issuer(uri, pelican), scopes, say=_stderr)
    with _LOCK:
        _ACTIVE[str(cache_file(pelican))] = entry
    try:
        access_token(pelican, uri_hint=uri)
    except UserError:
        if not interactive():
            raise
        # the login expired and someone is at the terminal: a new device login instead of the hint
        entry = login(pelican, entry.oidc_url, scopes, say=_stderr)
        with _LOCK:
            _ACTIVE[str(cache_file(pelican))] = entry
    return entry


def access_token(pelican: PelicanConfig, uri_hint: str = "", force: bool = False) -> str:
    """The live access token of this process's login (ensure_login), else of the newest cached login.
    `force`: refresh even if it looks alive (a server refused it: revoked, or clocks apart)."""
    key = str(cache_file(pelican))
    with _LOCK:
        entry = _ACTIVE.get(key)
    if entry is None:
        logins = [
            e for e in load(pelican) if not pelican.oidc_url or e.oidc_url == pelican.oidc_url.rstrip("/")
        ]
        if not logins:
            raise UserError("no cached Pelican login; " + _LOGIN_HINT.format(uri=uri_hint or "<URI>"))
        entry = logins[0]
        with _LOCK:
            _ACTIVE[key] = entry
    with _REFRESH:
        if force or not entry.fresh(time.time()):
            refresh(pelican, entry, uri_hint)
        return entry.access_token


_REFRESH = threading.Lock()


def _stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)
