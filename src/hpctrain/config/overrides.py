"""Values typed as text (`key=value` on the command line, variables) read by the type of the field they set, and
put into the config tree at their dotted key."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from hpctrain.config import keys
from hpctrain.config.environ import ENV_ALIASES, ENV_KEYS
from hpctrain.config.messages import cut, quote
from hpctrain.config.yaml_file import parse_value
from hpctrain.errors import UserError


def set_dotted(tree: dict[str, Any], key: str, value: Any, source: str) -> None:
    parts = key.split(".")
    if not all(parts):
        raise UserError(f"{source}: {quote(key)} is not a dotted key like optim.lr")
    node = tree
    for part in parts[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = {}
            node[part] = child
        node = child
    node[parts[-1]] = value


def parse_typed(cls: type[BaseModel] | None, key: str, raw: str) -> Any:
    """A value typed as text, read by the type of the field it sets: a string field keeps `2024`, `007` or
    `1e3` as written (`null` is None where allowed); a boolean gets the text, which pydantic reads as
    true/false/yes/no/on/off/1/0 in any case; a list field takes one value without brackets as a
    list of one (`data.paths=data/muons/train`); anything else is a YAML scalar or list."""
    kind = keys.kind(cls, key) if cls is not None else None
    null = raw.strip() in ("null", "~") and cls is not None and keys.optional(cls, key)
    if kind == "text":
        return None if null else raw
    if kind == "bool":
        return None if null else raw.strip()  # train.compile_background=null: back to the default's rule
    value = parse_value(raw, f"the value of {quote(key)}")
    # data.paths=data/muons/train: the one path (the seeds' -i took one); text with commas is left to the field
    # (checkpoint.accept_changes splits it) or refused with the bracket form (validation.py)
    several = isinstance(value, list) or (isinstance(value, str) and "," in value)
    return [value] if kind == "list" and value is not None and not several else value


def parse_override(text: str, cls: type[BaseModel] | None = None) -> tuple[str, Any]:
    """`key=value` from the command line as (dotted key, typed value)."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise UserError(f"override {quote(text)} must look like key=value (e.g. optim.lr=2e-5)")
    alias = ENV_ALIASES.get(key.strip()) or ENV_KEYS.get(key.strip())
    if key.strip() in ("WANDB_API_KEY", "BEARER_TOKEN"):  # the secrets' own routes: never on a command line
        raise UserError(
            f"{key.strip()}=*** on the command line: a secret is never typed there (process lists and shell "
            "history keep it): put it in .env or the environment"
        )
    if alias is not None:  # `hpctrain train LR=2e-5`: the sbatch scripts' variable, typed as an override
        raise UserError(
            f"{cut(text)} after the command: {key.strip()} is an environment variable (what `sbatch "
            f"--export={key.strip()}=...` sets), not a key: write {alias}={cut(raw)}, or put it before the "
            f"command ({cut(text)} hpctrain ...)"
        )
    return key.strip(), parse_typed(cls, key.strip(), raw)


def coerce_text(tree: dict[str, Any], cls: type[BaseModel], prefix: str = "") -> None:
    """Numbers YAML read where the field is a string become its text (`name: 2024`, `time: 30`)."""
    for name, value in tree.items():
        key = f"{prefix}{name}"
        if isinstance(value, dict):
            coerce_text(value, cls, key + ".")
        elif (
            isinstance(value, (int, float)) and not isinstance(value, bool) and keys.kind(cls, key) == "text"
        ):
            tree[name] = str(value)
