"""A resolved config as plain data: what is printed and saved (secrets masked), its hash, its differences from
the defaults."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import yaml
from pydantic import BaseModel

from hpctrain.config.identity import identity_values
from hpctrain.config.provenance import leaves
from hpctrain.config.secrets import mask_tree


def dump_config(cfg: BaseModel) -> dict[str, Any]:
    """The resolved config as plain data with secrets masked, tokens inside URIs too (what is printed, saved
    in config.yaml and every checkpoint, sent to W&B, exported). Of the batch's two
    forms only the one in use is written, so a saved config.yaml can be given back with --config."""
    tree: dict[str, Any] = mask_tree(cfg.model_dump(mode="json"))  # a token inside a URI too
    data = tree.get("data")
    if isinstance(data, dict) and data.get("global_batch_size") is not None:
        data.pop("batch_size", None)
    return tree


def config_hash(cfg: BaseModel) -> str:
    """Hash of the identity keys (what defines the training, config/identity.py), not where, how long or how it
    is watched: equal hashes, the same run."""
    data = identity_values(cfg)
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def differences(cfg: BaseModel) -> dict[str, Any]:
    """The dotted keys whose value differs from the default of the same model/data type (secrets masked):
    what a terminal shows at start instead of the whole config."""
    values = {k.lstrip("."): v for k, v in leaves("", dump_config(cfg))}
    kinds = {s: {"type": getattr(getattr(cfg, s, None), "type", None)} for s in ("model", "data")}
    try:
        default = type(cfg).model_validate({k: v for k, v in kinds.items() if v["type"] is not None})
    except ValueError:  # a config type without defaults for everything: no short form
        return values
    base = {k.lstrip("."): v for k, v in leaves("", dump_config(default))}
    return {k: v for k, v in values.items() if base.get(k, object()) != v}


def to_yaml(cfg: BaseModel) -> str:
    return str(yaml.safe_dump(dump_config(cfg), sort_keys=False))


def override_text(value: Any) -> str:
    """A value as it is typed in a `key=value` override: `0.003`, `adam`, `[64,64]`, `[{type: cosine, ...}]`
    (YAML's flow style; nulls inside a mapping left out)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return (
            "[" + ",".join(override_text(v) if not isinstance(v, dict) else _mapping(v) for v in value) + "]"
        )
    if isinstance(value, dict):
        return _mapping(value)
    if isinstance(value, float):
        return repr(value)
    return str(yaml.safe_dump(value, default_flow_style=True, width=10**6)).removesuffix("\n...\n").strip()


def _mapping(value: dict[str, Any]) -> str:
    return "{" + ", ".join(f"{k}: {override_text(v)}" for k, v in value.items() if v is not None) + "}"
