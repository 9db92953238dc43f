"""`hpctrain auth login [URI] [--config ...] [key=value ...]`: a Pelican token for the batch jobs (login node;
no torch).

Runs the OIDC device flow (hpctrain.remote.oidc) and caches the tokens in data.pelican.auth_cache_file (default
~/.config/hpctrain/pelican-tokens.json, mode 0600). Scopes: with a URI, storage.read and storage.modify on it
(storage.read only with --read-only); without one, what the configured run needs (its pelican:// inputs, its
checkpoint.dir and mirror destinations). `hpctrain auth show` lists the cached logins (never a token).
"""

from __future__ import annotations

import time
from typing import Any

from hpctrain.commands.common import ArgParser, add_config_arguments, config_from_args
from hpctrain.errors import EXIT_OK, UserError
from hpctrain.remote import oidc
from hpctrain.remote.uris import PELICAN_SCHEMES, is_remote, scheme
from hpctrain.train.remote_ckpt import pelican_uris


def main(argv: list[str]) -> int:
    parser = ArgParser(prog="hpctrain auth", description="Pelican/OSDF tokens: log in once, jobs refresh.")
    parser.add_argument("action", choices=["login", "show"], help="login: device flow; show: cached logins")
    add_config_arguments(parser)
    parser.add_argument("--read-only", action="store_true", help="ask for storage.read only")
    args = parser.parse_args(argv)
    uris = [o for o in args.overrides if is_remote(o)]
    args.overrides = [o for o in args.overrides if not is_remote(o)]
    for word in args.overrides:  # neither a URI nor key=value: most likely a URI without its scheme
        if "=" not in word:
            raise UserError(
                f"auth {args.action}: {word!r} is neither a pelican:// or osdf:// URI nor a key=value"
            )
    cfg = config_from_args(args, quiet=True)
    pelican = cfg.data.pelican
    if args.action == "show":
        return _show(pelican)
    if len(uris) > 1:
        raise UserError(f"auth login: one URI at most (got {len(uris)})")
    if uris:
        if scheme(uris[0]) not in PELICAN_SCHEMES:
            raise UserError(f"auth login: {uris[0]} is not a pelican:// or osdf:// URI")
        reads, writes = ([uris[0]], []) if args.read_only else ([], [uris[0]])
    else:
        reads, writes = pelican_uris(cfg)
    scopes = oidc.scopes_for(reads, writes, pelican)
    if not scopes:
        raise UserError(
            "auth login: no pelican:// or osdf:// URI to ask a token for: give one "
            "(`hpctrain auth login osdf:///<namespace>/<folder>`) or a config whose data or outputs use one"
        )
    uri = (writes or reads)[0]
    issuer = pelican.oidc_url.rstrip("/") if pelican.oidc_url else oidc.discover_issuer(uri, pelican)
    entry = oidc.login(pelican, issuer, scopes)
    print(
        f"logged in to {issuer} for {' '.join(scopes)}; cached in {oidc.cache_file(pelican)} (mode 0600); "
        f"access token valid {entry.expires_at - time.time():.0f} s, refreshed by the jobs"
    )
    return EXIT_OK


def _show(pelican: Any) -> int:
    path = oidc.cache_file(pelican)
    logins = oidc.load(pelican)
    if not logins:
        print(f"no cached Pelican login in {path}")
    for entry in logins:
        left = entry.expires_at - time.time()
        state = f"access token valid {left:.0f} s" if left > 0 else "access token expired (refreshed on use)"
        print(f"{entry.oidc_url}: {' '.join(entry.scopes)} ({state})")
    return EXIT_OK
