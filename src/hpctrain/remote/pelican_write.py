"""Writing to a Pelican/OSDF namespace with the token: uploads that a reader never sees half-done.

A Pelican origin takes HTTP PUT (and WebDAV MOVE/DELETE) at the URL the director names for
`/api/v1.0/director/origin/<path>`; pelicanfs 1.5 can PUT but neither rename nor delete, so this module
speaks those few requests itself (requests, the token as a bearer header, only to the federation's hosts).
Every file goes up under a hidden temporary name in the same folder and is then moved to its name, so a
transfer cut by a kill leaves only a temporary. `sync_checkpoints` sends what the local `latest` names, its
sidecar, then `best`, and the pointer last (from the bytes read at its start): the remote `latest` always
names a complete, hashed checkpoint.
"""

from __future__ import annotations

import os
import re
import socket
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

from hpctrain.config.remote import PelicanConfig
from hpctrain.fsutil import make_folders
from hpctrain.remote.auth import pin_verify, resolve_token, scrub
from hpctrain.remote.uris import PELICAN_SCHEMES, scheme, split_federation


class RemoteWriteError(OSError):
    """An upload, move or delete the federation refused or that did not go through (message: no token).
    `permanent`: a refusal (4xx) that the same request would meet again."""

    permanent = False


def is_pelican(uri: str | None) -> bool:
    return bool(uri) and scheme(str(uri)) in PELICAN_SCHEMES


def token_for(pelican: PelicanConfig, uri: str = "") -> str | None:
    """The token to send: the one the user gave (token_file, BEARER_TOKEN...), else the OIDC login's."""
    token = resolve_token(pelican)
    if token is None and pelican.auto_token:
        from hpctrain.remote.oidc import access_token

        token = access_token(pelican, uri_hint=uri)
    return token


class PelicanWriter:
    """PUT / MOVE / DELETE / list under one pelican:// or osdf:// folder URI, with a fresh token per request."""

    def __init__(self, folder_uri: str, pelican: PelicanConfig | None = None, timeout: float = 60.0) -> None:
        import requests

        self.pelican = pelican or PelicanConfig()
        self.uri = folder_uri.rstrip("/")
        discovery, path, self.prefix = split_federation(self.uri, self.pelican.federation_url)
        self.root = "/" + path.strip("/")
        self.discovery = "https://" + discovery.split("://", 1)[1].rstrip("/")
        self.timeout = timeout
        self.http = pin_verify(requests.Session(), self.pelican.ca_file)
        self._director: str | None = None
        self._token: str | None = None

    def __repr__(self) -> str:
        return f"PelicanWriter({self.uri!r})"

    # -- plumbing --------------------------------------------------------------------------------------------
    def _headers(self, force: bool = False) -> dict[str, str]:
        if force:
            from hpctrain.remote.oidc import access_token

            self._token = access_token(self.pelican, uri_hint=self.uri, force=True)
        else:
            self._token = token_for(self.pelican, self.uri)
        return {"Authorization": f"Bearer {self._token}"} if self._token else {}

    def _fail(
        self, what: str, status: int | None = None, err: BaseException | None = None
    ) -> RemoteWriteError:
        if status in (401, 403):
            why = f"access denied (HTTP {status}): the token may not modify {self.uri} (check the scopes: "
            why += "`hpctrain auth login`, data.pelican.token_file / BEARER_TOKEN)"
        elif status is not None:
            why = f"HTTP {status}"
        else:
            why = scrub(f"{type(err).__name__}: {err}", self._token).splitlines()[0][:200]
        err_out = RemoteWriteError(f"{what}: {why}")
        err_out.permanent = status is not None and 400 <= status < 500 and status not in (408, 429)
        return err_out

    def _request(
        self, method: str, url: str, what: str, ok: tuple[int, ...], anonymous: bool = False, **kwargs: Any
    ) -> Any:
        """One request; the token goes only to the origin (`anonymous`: discovery and director)."""
        import requests

        extra = kwargs.pop("headers", {})
        oidc = not anonymous and self.pelican.auto_token and resolve_token(self.pelican) is None
        for attempt in (0, 1):
            try:
                headers = {**({} if anonymous else self._headers(force=attempt == 1)), **extra}
                resp = self.http.request(method, url, headers=headers, timeout=self.timeout, **kwargs)
            except requests.RequestException as exc:
                raise self._fail(what, err=exc) from None
            # an OIDC token refused although it looked alive (revoked, clocks apart): refresh it once
            if not (oidc and attempt == 0 and resp.status_code in (401, 403)):
                break
            if hasattr(kwargs.get("data"), "seek"):
                kwargs["data"].seek(0)  # the file body is sent again
        if resp.status_code not in ok:
            raise self._fail(what, resp.status_code)
        return resp

    def _origin(self, path: str) -> str:
        """The origin URL of a namespace path (the director's redirect)."""
        if self._director is None:
            meta = self._request(
                "GET",
                f"{self.discovery}/.well-known/pelican-configuration",
                "discovery",
                (200,),
                anonymous=True,
            )
            self._director = str(meta.json()["director_endpoint"]).rstrip("/")
        quoted = urllib.parse.quote(path)
        resp = self._request(
            "GET",
            f"{self._director}/api/v1.0/director/origin{quoted}",
            f"no origin for {path}",
            (301, 302, 303, 307, 308),
            anonymous=True,
            allow_redirects=False,
        )
        return str(resp.headers["Location"])

    def path(self, name: str) -> str:
        return f"{self.root}/{name}" if name else self.root

    # -- operations ------------------------------------------------------------------------------------------
    def put(self, local: Path | None, name: str, data: bytes | None = None) -> None:
        """`local`'s bytes (or `data`) to `<folder>/<name>`: a hidden temporary first, then a move."""
        tmp = f".{name}.upload-{os.getpid()}-{socket.gethostname()}"
        target = self._origin(self.path(tmp))
        what = f"uploading {name} to {self.uri}"
        if data is not None:
            self._request("PUT", target, what, (200, 201, 204), data=data)
        else:
            assert local is not None
            with open(local, "rb") as fh:
                self._request("PUT", target, what, (200, 201, 204), data=fh)
        final = self._origin(self.path(name))
        self._request(
            "MOVE",
            target,
            f"renaming {name} on {self.uri}",
            (200, 201, 204),
            headers={"Destination": final, "Overwrite": "T"},
        )

    def delete(self, name: str) -> None:
        self._request(
            "DELETE", self._origin(self.path(name)), f"deleting {name} on {self.uri}", (200, 204, 404)
        )

    def get(self, name: str, dest: Path) -> None:
        """Download `<folder>/<name>` to `dest` (written whole or not at all)."""
        from hpctrain.fsutil import atomic_path

        resp = self._request(
            "GET", self._origin(self.path(name)), f"reading {name} from {self.uri}", (200,), stream=True
        )
        with atomic_path(dest) as tmp, open(tmp, "wb") as fh:
            for chunk in resp.iter_content(1 << 20):
                fh.write(chunk)

    def read(self, name: str) -> bytes | None:
        """A small file's bytes; None when it is missing."""
        resp = self._request(
            "GET", self._origin(self.path(name)), f"reading {name} from {self.uri}", (200, 404)
        )
        return None if resp.status_code == 404 else bytes(resp.content)

    def names(self, hidden: bool = False) -> set[str]:
        """Files in the folder (temporaries too with `hidden`); empty when it does not exist yet."""
        resp = self._request(
            "PROPFIND",
            self._origin(self.root + "/"),
            f"listing {self.uri}",
            (207, 404),
            headers={"Depth": "1"},
        )
        if resp.status_code == 404:
            return set()
        out = set()
        for node in ElementTree.fromstring(resp.content).iter("{DAV:}response"):
            href = urllib.parse.unquote(node.findtext("{DAV:}href") or "")
            if href.endswith("/") or node.find(".//{DAV:}collection") is not None:
                continue
            name = href.rstrip("/").rsplit("/", 1)[-1]
            if name and (hidden or not name.startswith(".")):
                out.add(name)
        return out


def sync_checkpoints(folder: Path, writer: PelicanWriter, sent: dict[str, tuple[int, int]]) -> str | None:
    """Bring the remote checkpoint folder up to what the local `latest` names; returns that name.

    Order: the step file and its sidecar, best.pt (its old best.json removed first) and best.json, then
    `latest` with the bytes read at the start (a save meanwhile is the next sync's business), then the
    remote step files the local folder no longer holds. `sent` remembers (size, mtime_ns) already sent.
    """
    try:
        pointer = (folder / "latest").read_bytes()
    except FileNotFoundError:
        return None
    name = pointer.decode().strip()
    step = folder / name
    files = [step, step.with_suffix(".json")]
    best = [folder / "best.pt", folder / "best.json"]
    if all(p.exists() for p in best):
        files += best
    stats = {p.name: p.stat() for p in files}  # FileNotFoundError: pruned meanwhile, the next sync goes on
    if not sent and writer.read("latest") == pointer:
        # a new process (a later start) and the remote `latest` is ours: everything it names is there already
        sent.update({p.name: (stats[p.name].st_size, stats[p.name].st_mtime_ns) for p in files})
    changed = [p for p in files if sent.get(p.name) != (stats[p.name].st_size, stats[p.name].st_mtime_ns)]
    if any(p.name == "best.pt" for p in changed):
        writer.delete("best.json")  # never a new best.pt beside the old hash, even for a moment
    for path in changed:
        writer.put(path, path.name)
        sent[path.name] = (stats[path.name].st_size, stats[path.name].st_mtime_ns)
    writer.put(None, "latest", data=pointer)
    local = {p.name for p in folder.iterdir() if not p.name.startswith(".")}
    for old in sorted(writer.names(hidden=True) - local - {"latest"}):
        if old.startswith("step_") or _dead_temporary(old):
            writer.delete(old)
            sent.pop(old, None)
    return name


def _dead_temporary(name: str) -> bool:
    """An upload temporary of a process of this host that is gone (a kill mid-upload)."""
    from hpctrain.fsutil import pid_alive

    match = re.fullmatch(r"\..+\.upload-(\d+)-(.+)", name)
    if match is None:
        return False
    return match.group(2) == socket.gethostname() and not pid_alive(int(match.group(1)))


def sync_folder(folder: Path, writer: PelicanWriter, sent: dict[str, tuple[int, int]]) -> None:
    """Send the files of `folder` (TensorBoard event files) that changed since the last sync."""
    for entry in sorted(os.scandir(folder), key=lambda e: e.name):
        if not entry.is_file() or entry.name.startswith("."):
            continue
        st = entry.stat()
        if sent.get(entry.name) != (st.st_size, st.st_mtime_ns):
            writer.put(Path(entry.path), entry.name)
            sent[entry.name] = (st.st_size, st.st_mtime_ns)


class RemoteFolder:
    """A local folder kept copied to `<dest>/<folder name>/` on a federation, by a background Uploader."""

    _CLOSE_WAIT = 30.0  # seconds a close waits for the last copy (event files are small)

    def __init__(self, dest: str, pelican: PelicanConfig | None) -> None:
        self.dest, self.pelican = dest.rstrip("/"), pelican
        self._sent: dict[str, tuple[int, int]] = {}
        self._uploader: Any = None

    def submit(self, folder: Path) -> None:
        from hpctrain.remote.upload import Uploader

        if self._uploader is None:
            self._uploader = Uploader(f"{folder} to {self.dest}")
        writer = PelicanWriter(f"{self.dest}/{folder.name}", self.pelican)
        self._uploader.submit(lambda: sync_folder(folder, writer, self._sent))

    def close(self) -> None:
        if self._uploader is not None:
            self._uploader.close(self._CLOSE_WAIT)
            self._uploader = None


def fetch_checkpoint(uri: str, dest: Path, pelican: PelicanConfig, say: Callable[[str], None]) -> Path | None:
    """Download the checkpoint `uri` names into `dest`: a file (with its sidecar), or a run folder / checkpoint
    folder (what its `latest` names). Returns the local file; None when the remote folder holds none."""
    base = uri.rstrip("/")
    name = base.rsplit("/", 1)[-1]
    if name.endswith(".pt"):
        writer = PelicanWriter(base.rsplit("/", 1)[0], pelican)
    else:
        writer = PelicanWriter(base, pelican)
        pointer = writer.read("latest")
        if pointer is None:
            writer = PelicanWriter(base + "/checkpoints", pelican)
            pointer = writer.read("latest")
        if pointer is None:
            return None
        name = pointer.decode().strip()
    make_folders(dest)
    say(f"downloading {writer.uri}/{name} to {dest}")
    sidecar = Path(name).with_suffix(".json").name
    writer.get(sidecar, dest / sidecar)
    writer.get(name, dest / name)
    return dest / name
