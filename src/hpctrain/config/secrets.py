"""Secrets: which keys are secret, refusing them where others can read them, masking them in any text.

A secret (the Pelican token, the W&B key) may come from `.env`, its own variable or a file only the user can
read; never from the command line or an `HPCTRAIN_` variable, which process lists, shell history and job records
keep. Whatever text leaves the program (sys.argv in W&B, every error line) goes through `mask_secrets`, which
masks by the look of the text, so a misspelt key or a token inside a URI (`?authz=...`) is masked too.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from typing import Any

from hpctrain.errors import UserError

# Where each secret may come from instead of the command line (said in the refusal).
SECRET_HINTS = {
    "data.pelican.token": "put the token in a file only you can read and set data.pelican.token_file=PATH, "
    "or put BEARER_TOKEN=... in .env",
    "logging.wandb.api_key": "put WANDB_API_KEY=... in .env (or in the environment as WANDB_API_KEY)",
}
# Names that look secret: their values are masked in messages and in sys.argv even when misspelt. `authz` is the
# query parameter that carries a Pelican/OSDF token inside a URI.
_WORDS = r"token|api[_-]?key|secret|password|passwd|credentials?|authz|authorization"
_SECRET_NAME = re.compile(rf"(?i)({_WORDS})$")
MASK = "***"
# `name=value` (a dotted key, an argument, a URI query parameter) whose name ends in a secret word; the value runs
# to the end of its quotes, else to a space, quote, comma, `&`, `;` or closing bracket (a colon ends it, not
# being part of it: `key=***: unknown key`).
_ASSIGNED = re.compile(
    rf"""(?i)(?P<name>[\w.-]*(?:{_WORDS}))(?P<sep>\s*=\s*)(?P<value>'[^']*'?|"[^"]*"?|[^\s'",;&\]}})]*[^\s'",;&\]}}):])"""
)
# `{token: value}` in a YAML flow mapping, `{'token': 'value'}` in the repr of a mapping.
_MAPPED = re.compile(
    rf"""(?i)(?P<name>[{{,]\s*(['"]?)[\w.-]*(?:{_WORDS})\2\s*:\s*)(?P<value>'[^']*'?|"[^"]*"?|[^\s'",}}\]]+)"""
)
_BEARER = re.compile(r"(?i)\b(bearer\s+)[^\s'\",;]+")
# Query parameters of a URI that carry a credential under a name no secret word ends with: cloud stores' signed
# URLs (S3 `X-Amz-Signature`, Azure SAS `sig`, GCS `X-Goog-Signature`), API keys (`key`, `apikey`), OAuth `code`.
# (`authz`, `access_token`, `X-Amz-Security-Token`, `X-Amz-Credential` end in a secret word: `_ASSIGNED`.)
_QUERY = re.compile(r"(?i)([?&](?:sig|[\w.-]*signature|key|apikey|code|sas)=)[^&#\s'\"\]}),;]+")
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://[^/\s:@'\"]+:)[^/\s@'\"]+@")


def is_masked(value: Any) -> bool:
    """Whether a secret's value is a mask written in its place, not a secret: pydantic's `'**********'` in a saved
    config.yaml, our `***` in messages (only asterisks, at least three). Read back (`--config` of a saved
    config.yaml, a copied `.env` line) it is unset, never sent as a token or key."""
    if hasattr(value, "get_secret_value"):
        value = value.get_secret_value()
    text = value.strip() if isinstance(value, str) else ""
    return len(text) >= 3 and text.strip("*") == ""


def looks_secret(key: str) -> bool:
    """Whether a dotted key (or an argument's `key=`) names something secret-like, e.g. `*.token`."""
    return bool(_SECRET_NAME.search(key.lstrip("-").rsplit(".", 1)[-1].rsplit("__", 1)[-1]))


def scrub_argv(argv: list[str]) -> list[str]:
    """`argv` with every secret masked: the value of a secret-looking `key=value`, and any secret inside a value
    (a token in a URI's query, a password in its user part)."""
    out = []
    for arg in argv:
        key, sep, _ = arg.partition("=")
        out.append(f"{key}={MASK}" if sep and looks_secret(key) else mask_secrets(arg))
    return out


def mask_secrets(text: str) -> str:
    """`text` with every value that looks secret replaced by *** (`token=...`, `?authz=...`, `'api_key': '...'`,
    `Bearer ...`, `https://user:password@host`): applied to every error line, whatever raised it."""
    if "=" in text:
        text = _ASSIGNED.sub(_masked, text)
    if ":" in text:
        text = _MAPPED.sub(lambda m: f"{m['name']}{MASK}", text)
        text = _USERINFO.sub(rf"\1{MASK}@", text)
    if "?" in text or "&" in text:
        text = _QUERY.sub(rf"\1{MASK}", text)
    return _BEARER.sub(rf"\1{MASK}", text)


def mask_tree(value: Any) -> Any:
    """`value` (plain data: a dumped config, a record) with `mask_secrets` applied to every string in it and
    to the value of every key that looks secret: what is written or sent (config.yaml, a checkpoint's config,
    W&B's config, an export) holds no token in a URI (`data.paths`, `checkpoint.mirror_to`, `checkpoint.dir`,
    `checkpoint.resume`, any key that holds a URL), so the same masking also makes two configs that differ by a
    token alone (one renewed) the same run."""
    if isinstance(value, str):
        return mask_secrets(value)
    if isinstance(value, dict):
        return {k: _masked_entry(str(k), v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [mask_tree(v) for v in value]
    return value


def _masked_entry(key: str, value: Any) -> Any:
    # a secret-looking key's text (a SecretStr field is masked by pydantic already: kept as it shows it)
    if looks_secret(key) and isinstance(value, str) and value.strip("*"):
        return MASK
    return mask_tree(value)


class MaskSecrets(logging.Filter):
    """A logging filter for the handlers hpctrain writes (stderr, training.log): every record's text with
    `mask_secrets` applied (a URI with its token in a warning of ours or of a library), its traceback too."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            text = record.getMessage()
        except Exception:  # a record that cannot format: the handler says so itself
            return True
        masked = mask_secrets(text)
        if masked != text:
            record.msg, record.args = masked, None
        if record.exc_info and not record.exc_text:
            record.exc_text = mask_secrets(logging.Formatter().formatException(record.exc_info))
        return True


def mask_handlers(*handlers: logging.Handler) -> None:
    """Put a `MaskSecrets` filter on each handler (once)."""
    for handler in handlers:
        if not any(isinstance(f, MaskSecrets) for f in handler.filters):
            handler.addFilter(MaskSecrets())


def _masked(match: re.Match[str]) -> str:
    # `TOKEN=...` in a hint is a placeholder, not a value.
    value = match["value"] if match["value"].strip("'\"") == "..." else MASK
    return f"{match['name']}{match['sep']}{value}"


def _flat_keys(key: str, value: Any) -> Iterator[str]:
    yield key
    if isinstance(value, dict):
        for child, sub in value.items():
            yield from _flat_keys(f"{key}.{child}", sub)


def refuse_secret(key: str, value: Any, secrets: set[str], source: str) -> None:
    """A secret on the command line or in an HPCTRAIN_ variable is visible to others and recorded by shells,
    process lists, SLURM and W&B: refuse it (without echoing it) and say where it belongs."""
    for dotted in _flat_keys(key, value):
        if dotted in secrets:
            hint = SECRET_HINTS.get(dotted, "put it in .env or a YAML config file only you can read")
            raise UserError(
                f"{dotted} is a secret and may not be given {source}, where process lists, shell history "
                f"and job records keep it: {hint}"
            )
