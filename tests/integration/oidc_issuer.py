"""A loopback OIDC token issuer for tests: discovery, dynamic client registration, the device grant (RFC 8628)
with authorization_pending / slow_down answers, refresh-token grants, and expiry of both token kinds.

Approval is scripted: `approve_after_polls` approves a device code after that many polls of the token
endpoint (the user typing the code in a browser meanwhile); `approve(user_code)` approves at once. Access
tokens expire after `access_ttl` seconds, refresh tokens after `refresh_ttl` (or at once with
`expire_refresh_tokens()`). `check(token, action, path)` is what a Pelican origin or cache asks: is this a
live access token whose storage.<action> scope covers `path` (the path as the issuer sees it)?
"""

from __future__ import annotations

import json
import secrets
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

from tests.integration.pelican_server import _Base, _Handler, make_certificates


@dataclass
class Grant:
    scopes: list[str]
    expires: float


@dataclass
class Device:
    client_id: str
    scopes: list[str]
    user_code: str
    polls: int = 0
    last_poll: float = 0.0
    approved: bool = False
    done: bool = False


@dataclass
class IssuerLog:
    grants: list[str] = field(default_factory=list)  # grant type of each token request that succeeded
    answers: list[str] = field(default_factory=list)  # error codes answered (authorization_pending, ...)


class Issuer(_Base):
    """The issuer at `url` (HTTPS, trusting `ca_file`)."""

    def __init__(
        self,
        certs: Path,
        *,
        interval: int = 1,
        approve_after_polls: int | None = 2,
        access_ttl: float = 600.0,
        refresh_ttl: float = 3600.0,
        slow_down: int = 0,
    ) -> None:
        self.ca_file, cert, key = make_certificates(Path(certs))
        super().__init__(Path(certs), (cert, key))
        self.interval = interval
        self.approve_after_polls = approve_after_polls
        self.access_ttl = access_ttl
        self.refresh_ttl = refresh_ttl
        self.slow_down = slow_down  # the first polls answered slow_down (a client polling too fast)
        self.clients: dict[str, str] = {}
        self.devices: dict[str, Device] = {}
        self.access: dict[str, Grant] = {}
        self.refresh: dict[str, Grant] = {}
        self.log = IssuerLog()
        self.lock = threading.Lock()
        self.server = self._start("issuer", "issuer")

    @property
    def url(self) -> str:
        return self.server.url

    # -- test controls ---------------------------------------------------------------------------------------
    def approve(self, user_code: str) -> None:
        with self.lock:
            for dev in self.devices.values():
                if dev.user_code == user_code:
                    dev.approved = True

    def expire_refresh_tokens(self) -> None:
        with self.lock:
            for grant in self.refresh.values():
                grant.expires = 0.0

    def check(self, token: str | None, action: str, path: str) -> bool:
        """Whether `token` is a live access token with storage.<action> covering `path`."""
        with self.lock:
            grant = self.access.get(token or "")
            if grant is None or grant.expires < time.time():
                return False
            scopes = list(grant.scopes)
        for scope in scopes:
            kind, _, base = scope.partition(":")
            if kind != f"storage.{action}" or not base:
                continue
            base = base.rstrip("/")
            if path == base or path.startswith(base + "/") or base == "":
                return True
        return False

    # -- HTTP ------------------------------------------------------------------------------------------------
    def handle(self, h: _Handler, method: str) -> None:
        length = int(h.headers.get("Content-Length") or 0)
        body = h.rfile.read(length) if length else b""
        path = urllib.parse.urlsplit(h.path).path
        rec = self._record(h, method, path)
        if method == "GET" and path == "/.well-known/openid-configuration":
            self._json(h, rec, 200, self._metadata())
        elif method == "POST" and path == "/register":
            client_id, secret = "client-" + secrets.token_hex(4), secrets.token_hex(16)
            with self.lock:
                self.clients[client_id] = secret
            self._json(h, rec, 201, {"client_id": client_id, "client_secret": secret})
        elif method == "POST" and path == "/device":
            self._device(h, rec, _form(body))
        elif method == "POST" and path == "/token":
            self._token(h, rec, _form(body))
        else:
            h._reply(rec, 404, b"not found\n")

    def _record(self, h: _Handler, method: str, path: str):  # type: ignore[no-untyped-def]
        from tests.integration.pelican_server import Request

        rec = Request(self.server.name, method, path, "Authorization" in h.headers)
        self.requests.append(rec)
        return rec

    def _metadata(self) -> dict[str, object]:
        return {
            "issuer": self.url,
            "token_endpoint": f"{self.url}/token",
            "device_authorization_endpoint": f"{self.url}/device",
            "registration_endpoint": f"{self.url}/register",
            "grant_types_supported": ["refresh_token", "urn:ietf:params:oauth:grant-type:device_code"],
        }

    def _json(self, h: _Handler, rec: object, status: int, data: dict[str, object]) -> None:
        h._reply(rec, status, json.dumps(data).encode(), {"Content-Type": "application/json"})  # type: ignore[arg-type]

    def _client(self, form: dict[str, str], h: _Handler) -> str | None:
        client_id, secret = form.get("client_id", ""), form.get("client_secret", "")
        auth = h.headers.get("Authorization", "")
        if auth.startswith("Basic "):
            import base64

            user, _, password = base64.b64decode(auth[6:]).decode().partition(":")
            client_id, secret = urllib.parse.unquote(user), urllib.parse.unquote(password)
        with self.lock:
            ok = client_id in self.clients and self.clients[client_id] == secret
        return client_id if ok else None

    def _device(self, h: _Handler, rec: object, form: dict[str, str]) -> None:
        client_id = form.get("client_id", "")
        with self.lock:
            known = client_id in self.clients
        if not known:
            self._json(h, rec, 401, {"error": "invalid_client"})
            return
        code, user_code = secrets.token_hex(16), secrets.token_hex(3).upper()
        with self.lock:
            self.devices[code] = Device(client_id, form.get("scope", "").split(), user_code)
        self._json(
            h,
            rec,
            200,
            {
                "device_code": code,
                "user_code": user_code,
                "verification_uri": f"{self.url}/device-login",
                "verification_uri_complete": f"{self.url}/device-login?user_code={user_code}",
                "expires_in": 600,
                "interval": self.interval,
            },
        )

    def _error(self, h: _Handler, rec: object, code: str) -> None:
        with self.lock:
            self.log.answers.append(code)
        self._json(h, rec, 400, {"error": code})

    def _token(self, h: _Handler, rec: object, form: dict[str, str]) -> None:
        client_id = self._client(form, h)
        if client_id is None:
            self._json(h, rec, 401, {"error": "invalid_client"})
            return
        kind = form.get("grant_type", "")
        now = time.time()
        if kind == "urn:ietf:params:oauth:grant-type:device_code":
            with self.lock:
                dev = self.devices.get(form.get("device_code", ""))
                if dev is None or dev.done or dev.client_id != client_id:
                    error = "invalid_grant"
                elif self.slow_down > 0 or (dev.last_poll and now - dev.last_poll < self.interval * 0.9):
                    self.slow_down = max(0, self.slow_down - 1)
                    error = "slow_down"
                else:
                    dev.polls += 1
                    if self.approve_after_polls is not None and dev.polls > self.approve_after_polls:
                        dev.approved = True
                    error = "" if dev.approved else "authorization_pending"
                if dev is not None:
                    dev.last_poll = now
            if error:
                self._error(h, rec, error)
                return
            assert dev is not None
            dev.done = True
            scopes = dev.scopes
        elif kind == "refresh_token":
            with self.lock:
                grant = self.refresh.get(form.get("refresh_token", ""))
                live = grant is not None and grant.expires > now
            if not live or grant is None:
                self._error(h, rec, "invalid_grant")
                return
            wanted = form.get("scope", "").split()
            scopes = [s for s in wanted if s in grant.scopes] if wanted else grant.scopes
        else:
            self._error(h, rec, "unsupported_grant_type")
            return
        access, refresh = "at-" + secrets.token_hex(16), "rt-" + secrets.token_hex(16)
        with self.lock:
            self.access[access] = Grant(scopes, now + self.access_ttl)
            self.refresh[refresh] = Grant(scopes, now + self.refresh_ttl)
            self.log.grants.append(kind)
        self._json(
            h,
            rec,
            200,
            {
                "access_token": access,
                "refresh_token": refresh,
                "token_type": "Bearer",
                "expires_in": int(self.access_ttl),
                "scope": " ".join(scopes),
            },
        )


def _form(body: bytes) -> dict[str, str]:
    return {k: v[0] for k, v in urllib.parse.parse_qs(body.decode()).items()}
