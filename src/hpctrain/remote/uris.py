"""Remote input URIs: which paths are remote, how a federation URI splits, the errors a wrong path gives.

Accepted inputs: local paths and globs, `pelican://<federation>/<namespace>/...`, `osdf:///<namespace>/...`
(the OSDF federation, or `data.pelican.federation_url`) and any other fsspec URL (https://, s3://, memory://).
"""

from __future__ import annotations

import os
import re
import urllib.parse

from hpctrain.errors import UserError

OSDF_DISCOVERY = "pelican://osg-htc.org/"
PELICAN_SCHEMES = ("pelican", "osdf")
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


def is_remote(path: str | os.PathLike[str]) -> bool:
    """True for a URL other than file:// (pelican://, osdf://, https://, s3://, ...)."""
    match = _SCHEME.match(str(path))
    return match is not None and match.group(1).lower() != "file"


def has_magic(path: str) -> bool:
    """Whether `path` is a glob pattern (*, ? or [)."""
    return bool(_MAGIC.search(path))


def magic_prefix(path: str) -> str:
    """The part of a glob pattern before its first wildcard."""
    return _MAGIC.split(path, maxsplit=1)[0]


def scheme(uri: str) -> str:
    return uri.split("://", 1)[0].lower()


def split_federation(uri: str, federation_url: str | None) -> tuple[str, str, str]:
    """(discovery URL, namespace path, canonical prefix) of a pelican:// or osdf:// URI; osdf:// goes to
    `federation_url` when set (data.pelican.federation_url), else to the OSDF."""
    parts = urllib.parse.urlsplit(uri)
    name = parts.scheme.lower()
    if name == "pelican" and parts.netloc:
        return f"pelican://{parts.netloc}/", parts.path, f"pelican://{parts.netloc}"
    if name == "osdf" and parts.netloc:
        # osdf://ns/file is a common typo of osdf:///ns/file; pelicanfs reads it the same way
        path = "/" + parts.netloc + parts.path
    else:
        path = parts.path
    return federation_url or OSDF_DISCOVERY, path, f"{name}://"
