"""A small Pelican-protocol federation on 127.0.0.1 for tests and benchmarks.

One HTTPS server answers federation discovery (/.well-known/pelican-configuration) and acts as the director;
caches and an origin are further HTTPS servers that serve files from a local folder (HEAD, Range GETs with
206, WebDAV PROPFIND). The URL path maps straight onto the folder: /ns/a.bin is <root>/ns/a.bin.

Fault knobs (all on `Federation`, thread-safe): a dead first cache (a closed port listed first), per-path 503s
before success, 403s, transfers cut after K bytes, uploads that crawl or hang, namespaces that require a
bearer token. A namespace with an `issuer` (tests/integration/oidc_issuer.py) accepts that issuer's live
access tokens by their WLCG scopes (storage.read:<path>, storage.modify:<path>, paths minus the namespace's
`storage_prefix`) and takes writes on the origin (PUT, WebDAV MOVE and DELETE; 403 without a token that may
modify the path); the director names the issuer (X-Pelican-Authorization) and the origin
(/api/v1.0/director/origin/<path>). A PUT writes straight into the final file, slowly with `faults.put_delay`
(or hanging with `faults.stall_puts`), as an origin without temporaries would. Every request is logged
(`Federation.requests`) with the server name, method, path and whether an Authorization header came.

`StaticServer` is a plain http(s) file server with Range support (the same handler, no Pelican headers).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import email.utils
import ipaddress
import json
import os
import socket
import ssl
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

CHUNK = 1 << 20


def make_certificates(folder: Path) -> tuple[Path, Path, Path]:
    """A test CA and a certificate for 127.0.0.1 signed by it, made once per folder: (ca, cert, key) PEMs."""
    ca_path, cert_path, key_path = folder / "ca.pem", folder / "cert.pem", folder / "key.pem"
    if ca_path.exists() and cert_path.exists() and key_path.exists():
        return ca_path, cert_path, key_path  # servers sharing a folder share one CA
    folder.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "hpctrain test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=2))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    ca_path.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return ca_path, cert_path, key_path


def closed_port() -> int:
    """A loopback port nobody listens on (connections are refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Namespace:
    prefix: str
    require_token: bool = False
    token: str | None = None
    issuer: Any = None  # an oidc_issuer.Issuer whose tokens this namespace accepts (reads and writes)
    storage_prefix: str = ""  # what the issuer's scope paths leave out of the namespace path


@dataclass
class Request:
    server: str
    method: str
    path: str
    has_auth: bool
    range: str | None = None
    status: int = 0


@dataclass
class Faults:
    """Mutable fault knobs shared by every server of a federation (guard with `lock`)."""

    fail_503: dict[str, int] = field(default_factory=dict)  # path -> remaining 503 answers
    cut: dict[str, tuple[int, int]] = field(default_factory=dict)  # path -> (bytes sent, remaining times)
    forbid: set[str] = field(default_factory=set)  # paths answered 403
    put_delay: float = 0.0  # seconds of pause per 16 KiB an upload writes (a slow link, for kills mid-upload)
    # an upload to a path containing one of these writes its first 16 KiB, then hangs until the text is removed
    # (or the federation closes): a transfer a test can kill mid-way, however loaded the machine
    stall_puts: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, name: str, role: str, owner: _Base, ctx: ssl.SSLContext | None) -> None:
        self.name, self.role, self.owner, self.ctx = name, role, owner, ctx
        super().__init__(("127.0.0.1", 0), _Handler)

    def finish_request(self, request, client_address) -> None:  # type: ignore[no-untyped-def]
        # no Nagle: a reply's headers and its small body go out at once, as real servers send them (else each
        # small ranged GET waits for the client's delayed ACK, ~40 ms)
        request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # TLS handshake in the connection's own thread, so one slow client cannot stall accept()
        if self.ctx is not None:
            try:
                request = self.ctx.wrap_socket(request, server_side=True)
            except (ssl.SSLError, OSError):
                return
        super().finish_request(request, client_address)

    @property
    def url(self) -> str:
        return f"{'https' if self.ctx else 'http'}://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: object) -> None:
        pass  # the request log is Federation.requests

    # -- plumbing -------------------------------------------------------------------------------------------
    def _begin(self) -> tuple[str, Request]:
        length = int(self.headers.get("Content-Length") or 0)
        if length and self.command != "PUT":
            self.rfile.read(length)  # keep the connection in step (PROPFIND bodies)
        path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
        rec = Request(
            self.server.name, self.command, path, "Authorization" in self.headers, self.headers.get("Range")
        )
        self.server.owner.requests.append(rec)
        return path, rec

    def _reply(
        self, rec: Request, status: int, body: bytes = b"", headers: dict[str, str] | None = None
    ) -> None:
        rec.status = status
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD" and body:
            self.wfile.write(body)

    def do_GET(self) -> None:
        self.server.owner.handle(self, "GET")

    def do_HEAD(self) -> None:
        self.server.owner.handle(self, "HEAD")

    def do_PROPFIND(self) -> None:
        self.server.owner.handle(self, "PROPFIND")

    def do_POST(self) -> None:
        self.server.owner.handle(self, "POST")

    def do_PUT(self) -> None:
        self.server.owner.handle(self, "PUT")

    def do_MOVE(self) -> None:
        self.server.owner.handle(self, "MOVE")

    def do_DELETE(self) -> None:
        self.server.owner.handle(self, "DELETE")


class _Base:
    """Shared file serving: checks faults and tokens, then HEAD / Range GET / PROPFIND from `root`."""

    def __init__(self, root: Path, cert: tuple[Path, Path] | None) -> None:
        self.root = Path(root)
        self.requests: list[Request] = []
        self.faults = Faults()
        self.namespaces: list[Namespace] = []
        self._servers: list[_Server] = []
        self._ctx: ssl.SSLContext | None = None
        if cert is not None:
            self._ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self._ctx.load_cert_chain(str(cert[0]), str(cert[1]))

    def _start(self, name: str, role: str) -> _Server:
        srv = _Server(name, role, self, self._ctx)
        threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        self._servers.append(srv)
        return srv

    def close(self) -> None:
        for srv in self._servers:
            srv.shutdown()
            srv.server_close()
        self._servers.clear()

    def __enter__(self):  # type: ignore[no-untyped-def]
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def requests_for(self, path: str, method: str | None = None, server: str | None = None) -> list[Request]:
        return [
            r
            for r in list(self.requests)
            if r.path == path
            and (method is None or r.method == method)
            and (server is None or r.server == server)
        ]

    def namespace_of(self, path: str) -> Namespace | None:
        best = None
        for ns in self.namespaces:
            if (path == ns.prefix or path.startswith(ns.prefix.rstrip("/") + "/")) and (
                best is None or len(ns.prefix) > len(best.prefix)
            ):
                best = ns
        return best

    def handle(self, h: _Handler, method: str) -> None:
        path, rec = h._begin()
        try:
            self.serve_file(h, method, path, rec)
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError):
            h.close_connection = True

    def _fault(self, path: str, h: _Handler, rec: Request) -> bool:
        """Answers an injected or token failure; True when it did."""
        with self.faults.lock:
            if self.faults.fail_503.get(path, 0) > 0:
                self.faults.fail_503[path] -= 1
                h._reply(rec, 503, b"busy\n")
                return True
            forbidden = path in self.faults.forbid
        ns = self.namespace_of(path)
        if ns is not None and ns.token is not None and h.headers.get("Authorization") != f"Bearer {ns.token}":
            forbidden = True
        writing = h.command in ("PUT", "MOVE", "DELETE")
        if writing and (ns is None or ns.issuer is None):
            forbidden = True  # only namespaces with an issuer take writes
        if ns is not None and ns.issuer is not None and (writing or ns.require_token):
            token = h.headers.get("Authorization", "").removeprefix("Bearer ")
            scope_path = path.removeprefix(ns.storage_prefix.rstrip("/")) or "/"
            if not ns.issuer.check(token, "modify" if writing else "read", scope_path):
                forbidden = True
        if forbidden:
            if h.command == "PUT":
                h.rfile.read(int(h.headers.get("Content-Length") or 0))  # keep the connection in step
            h._reply(rec, 403, b"forbidden\n")
        return forbidden

    def serve_file(self, h: _Handler, method: str, path: str, rec: Request) -> None:
        if self._fault(path, h, rec):
            return
        target = (self.root / path.lstrip("/")).resolve()
        if not target.is_relative_to(self.root.resolve()):
            h._reply(rec, 403, b"outside\n")
            return
        if method in ("PUT", "MOVE", "DELETE"):
            self._write(h, method, target, rec)
            return
        if not target.exists():
            h._reply(rec, 404, b"not found\n")
            return
        if method == "PROPFIND":
            self._propfind(h, rec, path, target)
            return
        if target.is_dir():
            h._reply(rec, 200 if method == "HEAD" else 403, b"", {"Content-Type": "httpd/unix-directory"})
            return
        self._send_file(h, method, path, target, rec)

    def _send_file(self, h: _Handler, method: str, path: str, target: Path, rec: Request) -> None:
        size = target.stat().st_size
        start, end = 0, size - 1
        status = 200
        rng = h.headers.get("Range")
        if rng and rng.startswith("bytes="):
            first, _, last = rng[6:].split(",")[0].partition("-")
            if first == "":
                start = max(0, size - int(last))
            else:
                start = int(first)
                end = min(size - 1, int(last)) if last else size - 1
            if start >= size:
                h._reply(rec, 416, b"", {"Content-Range": f"bytes */{size}"})
                return
            status = 206
        length = end - start + 1
        rec.status = status
        h.send_response(status)
        h.send_header("Content-Length", str(length))
        h.send_header("Accept-Ranges", "bytes")
        h.send_header("Content-Type", "application/octet-stream")
        h.send_header("Last-Modified", email.utils.formatdate(target.stat().st_mtime, usegmt=True))
        if status == 206:
            h.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        h.end_headers()
        if method == "HEAD":
            return
        limit = length
        with self.faults.lock:
            cut = self.faults.cut.get(path)
            if cut is not None and cut[1] > 0:
                self.faults.cut[path] = (cut[0], cut[1] - 1)
                limit = min(length, cut[0])
        with target.open("rb") as fh:
            fh.seek(start)
            left = limit
            while left > 0:
                buf = fh.read(min(CHUNK, left))
                if not buf:
                    break
                h.wfile.write(buf)
                left -= len(buf)
        if limit < length:
            # the transfer dies mid-file: the client got fewer bytes than Content-Length announced
            h.wfile.flush()
            h.close_connection = True
            with contextlib.suppress(OSError):
                h.connection.shutdown(socket.SHUT_RDWR)

    def _write(self, h: _Handler, method: str, target: Path, rec: Request) -> None:
        if method == "DELETE":
            if not target.is_file():
                h._reply(rec, 404, b"not found\n")
                return
            target.unlink()
            h._reply(rec, 204)
            return
        if method == "MOVE":
            dest = urllib.parse.unquote(urllib.parse.urlsplit(h.headers.get("Destination", "")).path)
            final = (self.root / dest.lstrip("/")).resolve()
            if not dest or not final.is_relative_to(self.root.resolve()) or not target.is_file():
                h._reply(rec, 404 if dest else 400, b"cannot move\n")
                return
            os.replace(target, final)
            h._reply(rec, 201)
            return
        target.parent.mkdir(parents=True, exist_ok=True)
        left = int(h.headers.get("Content-Length") or 0)
        with target.open("wb") as fh:  # straight into the final name: a cut upload leaves a short file
            while left > 0:
                slow = self.faults.put_delay or self._stalled(rec.path)
                buf = h.rfile.read(min(16 << 10 if slow else 1 << 20, left))
                if not buf:
                    break
                fh.write(buf)
                fh.flush()
                left -= len(buf)
                if self.faults.put_delay:
                    time.sleep(self.faults.put_delay)
                while self._stalled(rec.path) and self._servers:
                    time.sleep(0.02)
        h._reply(rec, 201 if left == 0 else 400)

    def _stalled(self, path: str) -> bool:
        with self.faults.lock:
            return any(part in path for part in self.faults.stall_puts)

    def _propfind(self, h: _Handler, rec: Request, path: str, target: Path) -> None:
        if target.is_file() and path.endswith("/"):
            # Pelican origins reject an object's trailing-slash form with a 500 (pelicanfs relies on it)
            h._reply(rec, 500, b"not a collection\n")
            return
        entries = [(path, target)]
        if target.is_dir() and h.headers.get("Depth", "1") != "0":
            base = path.rstrip("/")
            entries += [(f"{base}/{child.name}", child) for child in sorted(target.iterdir())]
        h._reply(rec, 207, _multistatus(entries), {"Content-Type": 'application/xml; charset="utf-8"'})


def _multistatus(entries: list[tuple[str, Path]]) -> bytes:
    parts = ['<?xml version="1.0" encoding="utf-8"?>\n<D:multistatus xmlns:D="DAV:">']
    for href, target in entries:
        st = target.stat()
        is_dir = target.is_dir()
        if is_dir and not href.endswith("/"):
            href += "/"
        kind = "<D:collection/>" if is_dir else ""
        parts.append(
            f"<D:response><D:href>{escape(urllib.parse.quote(href))}</D:href><D:propstat><D:prop>"
            f"<D:displayname>{escape(target.name)}</D:displayname>"
            f"<D:getcontentlength>{0 if is_dir else st.st_size}</D:getcontentlength>"
            f"<D:getlastmodified>{email.utils.formatdate(st.st_mtime, usegmt=True)}</D:getlastmodified>"
            f"<D:resourcetype>{kind}</D:resourcetype>"
            "</D:prop><D:status>HTTP/1.1 200 OK</D:status></D:propstat></D:response>"
        )
    parts.append("</D:multistatus>")
    return "".join(parts).encode()


class Federation(_Base):
    """Discovery + director on one HTTPS port, `n_caches` caches and an origin serving `root`.

    With `dead_first_cache` the director lists a closed port first (pri=1). `url` is the pelican:// base of
    the federation; `ca_file` the CA to trust.
    """

    def __init__(
        self,
        root: Path,
        certs: Path,
        namespaces: list[Namespace],
        n_caches: int = 1,
        dead_first_cache: bool = False,
    ) -> None:
        self.ca_file, cert, key = make_certificates(Path(certs))
        super().__init__(root, (cert, key))
        self.namespaces = list(namespaces)
        self.director = self._start("director", "director")
        self.origin = self._start("origin", "origin")
        self.caches = [self._start(f"cache{i}", "cache") for i in range(n_caches)]
        self.dead_cache_url = f"https://127.0.0.1:{closed_port()}" if dead_first_cache else None

    @property
    def url(self) -> str:
        return f"pelican://127.0.0.1:{self.director.server_address[1]}"

    @property
    def discovery_url(self) -> str:
        return f"https://127.0.0.1:{self.director.server_address[1]}"

    def cache_urls(self) -> list[str]:
        urls = [c.url for c in self.caches]
        return ([self.dead_cache_url] if self.dead_cache_url else []) + urls

    def handle(self, h: _Handler, method: str) -> None:
        if h.server.role != "director":
            super().handle(h, method)
            return
        path, rec = h._begin()
        if path == "/.well-known/pelican-configuration":
            body = json.dumps(
                {
                    "director_endpoint": self.discovery_url,
                    "namespace_registration_endpoint": self.discovery_url,
                    "jwks_uri": f"{self.discovery_url}/.well-known/issuer.jwks",
                }
            ).encode()
            h._reply(rec, 200, body, {"Content-Type": "application/json"})
            return
        origin_api = "/api/v1.0/director/origin"
        to_origin = path.startswith(origin_api + "/")
        path = path.removeprefix(origin_api) if to_origin else path
        ns = self.namespace_of(path)
        if ns is None:
            h._reply(rec, 404, b"no namespace\n")
            return
        links = ", ".join(
            f'<{url}{urllib.parse.quote(path)}>; rel="duplicate"; pri={i + 1}; depth={ns.prefix.count("/")}'
            for i, url in enumerate(self.cache_urls())
        )
        headers = {
            "Link": links,
            "X-Pelican-Namespace": f"namespace={ns.prefix}, require-token={str(ns.require_token).lower()}, "
            f"collections-url={self.origin.url}",
        }
        if ns.issuer is not None:
            headers["X-Pelican-Authorization"] = f"issuer={ns.issuer.url}"
        if method == "PROPFIND" or to_origin:
            headers["Location"] = f"{self.origin.url}{urllib.parse.quote(path)}"
        else:
            headers["Location"] = f"{self.cache_urls()[0]}{urllib.parse.quote(path)}"
        h._reply(rec, 307, b"", headers)


class StaticServer(_Base):
    """Plain http(s) file server with Range support; `tls` needs `certs` (a folder for a fresh CA)."""

    def __init__(self, root: Path, certs: Path | None = None) -> None:
        self.ca_file: Path | None = None
        cert = None
        if certs is not None:
            self.ca_file, cert_path, key_path = make_certificates(Path(certs))
            cert = (cert_path, key_path)
        super().__init__(root, cert)
        self.server = self._start("static", "static")

    @property
    def url(self) -> str:
        return self.server.url


def write_random_files(folder: Path, names: list[str], size: int, seed: int = 0) -> dict[str, bytes]:
    """Files of `size` pseudo-random bytes under `folder`; returns name -> content."""
    import random

    rnd = random.Random(seed)
    out = {}
    for name in names:
        data = rnd.randbytes(size)
        target = folder / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        out[name] = data
    return out
