"""Config sections for remote data: Pelican/OSDF access (`data.pelican`) and staging (`data.staging`)."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, field_validator

from hpctrain.config.secret_type import Secret

_UNITS = {
    "": 1,
    "k": 10**3,
    "m": 10**6,
    "g": 10**9,
    "t": 10**12,
    "ki": 2**10,
    "mi": 2**20,
    "gi": 2**30,
    "ti": 2**40,
}


def parse_bytes(value: int | str) -> int:
    """Bytes in an int or a string such as "500MB", "20 GiB", "1.5T" (decimal or binary units)."""
    if isinstance(value, int):
        return value
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]i?)?b?\s*", str(value).lower())
    if not match:
        raise ValueError(f"{value!r} is not a size; use a number of bytes or e.g. '500MB', '20GiB'")
    return int(float(match.group(1)) * _UNITS[match.group(2) or ""])


class PelicanConfig(BaseModel):
    """How to reach a Pelican federation (OSDF by default) and authenticate to it."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    token_file: str | None = Field(
        default=None,
        description="File holding the bearer token (raw, or JSON with 'access_token'). Takes precedence over "
        "BEARER_TOKEN, BEARER_TOKEN_FILE and `token`.",
    )
    token: Secret = Field(
        default=None,
        description="Bearer token itself: from BEARER_TOKEN in .env (or the environment), never from the command "
        "line or an HPCTRAIN_ variable (refused: prefer token_file). Never printed or saved; sent only to "
        "Pelican/OSDF endpoints as an Authorization header.",
    )
    federation_url: str | None = Field(
        default=None,
        description="Discovery URL of the federation for osdf:/// and host-less pelican:/// URIs "
        "(default: pelican://osg-htc.org, the OSDF). pelican://host/... URIs name their own federation.",
    )
    ca_file: str | None = Field(
        default=None,
        description="PEM bundle of certificate authorities to trust for HTTPS (federation, caches and "
        "https:// sources) instead of the system store; e.g. a site or test CA.",
    )
    auto_token: bool = Field(
        default=False,
        description="Get the token from an OIDC issuer (device flow, `hpctrain auth login`) and refresh it, "
        "also during the run; used when no token_file, BEARER_TOKEN or BEARER_TOKEN_FILE is given. A batch job "
        "uses the cached login (it cannot show a code) and stops with exit 2 when there is none.",
    )
    oidc_url: str | None = Field(
        default=None,
        description="The token issuer (e.g. https://token-issuer.icecube.aq); default: the issuer the "
        "federation's director names for the namespace.",
    )
    scope_path: str | None = Field(
        default=None,
        description="The path the storage.read / storage.modify scopes name (default: the folder of the first "
        "pelican:// input, and the first pelican:// output folder, minus storage_prefix).",
    )
    storage_prefix: str | None = Field(
        default=None,
        description="The part of the namespace path the issuer's scope paths leave out (e.g. /icecube/wipac).",
    )
    auth_cache_file: str | None = Field(
        default=None,
        description="Token cache of auto_token/`hpctrain auth login` (mode 0600; default "
        "$XDG_CONFIG_HOME/hpctrain/pelican-tokens.json, i.e. ~/.config/...). Never in a run folder: it holds "
        "a refresh token.",
    )


class StagingConfig(BaseModel):
    """Copy remote input files to node-local scratch just ahead of use (local files are read in place)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    dir: str | None = Field(
        default=None,
        description="Scratch folder; default SLURM_TMPDIR, else TMPDIR, else /tmp. Files go to a per-user, "
        "per-job, per-node subfolder created 0700.",
    )
    ahead: int = Field(
        default=2, ge=0, description="Files fetched ahead of the one being read, by a background thread."
    )
    parallel: int = Field(
        default=2,
        ge=1,
        description="Files local rank 0 downloads at the same time (overlaps network and disk).",
    )
    max_files: int | None = Field(
        default=None,
        ge=1,
        description="At most this many staged files on the node's scratch (None: no limit).",
    )
    max_bytes: int | None = Field(
        default=None,
        ge=1,
        description="Scratch budget in bytes (or '20GB', '500MiB'); prefetching waits for room. A file a "
        "reader is waiting for is fetched even over budget (with a warning).",
    )
    delete_after_use: bool = Field(
        default=True,
        description="Delete a staged file as soon as every local rank released it (else keep it for reuse).",
    )
    retries: int = Field(
        default=5, ge=0, description="Retries of a transient failure (refused, reset, timeout, 5xx)."
    )
    backoff_base: float = Field(
        default=1.0, gt=0, description="First retry delay in seconds; doubles each retry."
    )
    backoff_cap: float = Field(
        default=30.0, gt=0, description="Longest delay between two retries, in seconds."
    )
    timeout: float = Field(
        default=60.0,
        gt=0,
        description="Seconds to connect, or without receiving data, before a transfer counts as failed.",
    )
    wait_timeout: float = Field(
        default=3600.0,
        gt=0,
        description="Seconds a local rank other than 0 waits for local rank 0 to stage a file, then fails.",
    )

    @field_validator("max_bytes", mode="before")
    @classmethod
    def _sizes(cls, value: int | str | None) -> int | None:
        return None if value is None else parse_bytes(value)
