"""A config tree checked against its pydantic type: every error as one short line that names the dotted key, the
value as the user wrote it (cut short, secrets masked) and where it came from."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, SecretStr, ValidationError

from hpctrain.config import keys
from hpctrain.config.messages import cut, quote
from hpctrain.config.secrets import looks_secret
from hpctrain.errors import UserError

# Errors named in the line (a 20,000-element list of wrong items is 20,000 errors): then how many more.
MAX_ERRORS = 5


def validate(cls: type[BaseModel], tree: dict[str, Any], origins: Mapping[str, str] | None = None) -> Any:
    """`cls` built from `tree`; a mistake is a UserError of one line (`origins`: dotted key -> its source)."""
    try:
        return cls.model_validate(tree)
    except ValidationError as exc:
        raise UserError(format_error(exc, origins or {}, cls)) from None


def format_error(exc: ValidationError, origins: Mapping[str, str], cls: type[BaseModel] | None = None) -> str:
    errors = exc.errors()
    parts = [_one(error, origins, cls) for error in errors[:MAX_ERRORS]]
    if len(errors) > MAX_ERRORS:
        parts.append(f"and {len(errors) - MAX_ERRORS} more errors")
    return "; ".join(parts)


def _one(error: Any, origins: Mapping[str, str], cls: type[BaseModel] | None) -> str:
    loc = [str(p) for p in error["loc"]]
    tag = None  # the union member (model.type, data.type) the error is in
    # Drop the union member tag pydantic inserts (e.g. model.regression.hidden -> model.hidden).
    if len(loc) >= 2 and loc[0] in ("model", "data") and error.get("type") != "union_tag_invalid":
        tag = loc[1] if len(loc) > 2 else None
        if (
            len(loc) == 2 and error.get("type") == "value_error"
        ):  # a check across the member's keys: it names them
            said = str(error["msg"]).removeprefix("Value error, ")
            return said if said.startswith(f"{loc[0]}.") else f"{loc[0]}: {said}"
        loc = [loc[0], *loc[2:]] if len(loc) > 2 else loc
    key = ".".join(loc)
    value = error.get("input")
    message = error["msg"]
    if error["type"] == "extra_forbidden":
        message = "unknown key"
        full = next((k for k in origins if k.startswith(key + ".")), None)
        if isinstance(value, dict) and full:  # an unknown section: name the dotted key the user wrote
            node: Any = value
            for part in full[len(key) + 1 :].split("."):
                node = node.get(part) if isinstance(node, dict) else None
            key, value = full, node
        owners = keys.types_with(cls, key) if cls is not None and tag is not None else []
        near = keys.suggest(cls, key) if cls is not None else []
        if owners:  # a key of another type of this section, not a misspelling
            section = key.partition(".")[0]
            message = f"not a key of {section}.type={cut(str(tag))} (a key of {' and '.join(owners)})"
        elif near:
            message += f" (did you mean {' or '.join(near)}?)"
    elif error["type"] == "union_tag_not_found":
        key, value, message = f"{key}.type", None, "missing: say which type this section is"
    elif error["type"] == "union_tag_invalid":
        key = f"{key}.type" if not key.endswith("type") else key
        expected = error.get("ctx", {}).get("expected_tags", "")
        message = f"unknown type (allowed: {expected})"
        value = error.get("ctx", {}).get("tag", value)
    elif error["type"] == "list_type" and isinstance(value, str):
        # data.paths=a,b: the brackets make a list on the command line (one item needs none)
        message = f"a list of several takes brackets, quoted for the shell: '{key}=[{cut(value)}]'"
    message = cut(message, 300)
    said = message.removeprefix("Value error, ")
    if not key or (error["type"] == "value_error" and said.startswith(f"{key}.")):
        # a check across sections (the whole config) or a section's keys: its message names the keys (it was
        # "distributed: Value error, distributed.hang_seconds=... must be below ...")
        return said
    shown = "" if isinstance(value, dict) or value is None else f"={quote(value)}"
    if looks_secret(key) or isinstance(value, SecretStr):
        shown = "=***" if shown else ""  # a (misspelt) secret is never echoed
    origin = origins.get(key)
    return f"{cut(key, 120)}{shown}: {message}" + (f" (from {cut(origin, 160)})" if origin else "")
