"""Loading a configuration: YAML file < preset < .env < environment < command line, validated.

Later sources win, in the order of pydantic-settings and Hydra: what is typed on the command line beats the
environment, which beats the `.env` file, which beats the preset, which beats the YAML file. `Provenance`
remembers every source that set each key, so that a conflict and every value taken from the environment can be
named. A value typed on the command line or in a variable is read by its field's type (a string field keeps
`2024` as text). Every mistake becomes a one-line `UserError` naming the dotted key, the value and what is
allowed, before any work is done.

This module is the pipeline and the entry point (`ConfigRequest`, `resolve_config`, `load_config`,
`validate`); each step is a module of its own: `yaml_file` (reading YAML, bounded), `environ` (.env, variables,
`${VAR}`), `overrides` (typed `key=value`), `secrets`, `provenance` (sources and the notes at start),
`validation` (pydantic errors as one line), `messages` (error text), `dump` (printing, hashing, differences).
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from hpctrain.config import presets
from hpctrain.config.environ import ENV_PREFIX, dotenv_file, env_overrides, interpolate, refuse_misspelt
from hpctrain.config.keys import all_keys, secret_keys
from hpctrain.config.messages import error_line, quote
from hpctrain.config.naming import default_run_name, name_run
from hpctrain.config.overrides import coerce_text, parse_override, parse_typed, set_dotted
from hpctrain.config.provenance import Layer, Provenance, Source
from hpctrain.config.secrets import is_masked, looks_secret, refuse_secret
from hpctrain.config.validation import validate
from hpctrain.config.yaml_file import read_yaml
from hpctrain.errors import UserError

__all__ = ["ConfigRequest", "Provenance", "load_config", "resolve_config", "validate"]


@dataclass
class ConfigRequest:
    """What the user asked for on the command line (the same arguments for train, config show and submit)."""

    config_path: str | None = None
    preset: str | None = None
    overrides: list[str] = field(default_factory=list)
    env_file: str | None = ".env"  # "" or None: no file
    env_file_named: bool = False  # the user named env_file (--env-file): a missing one is then a mistake


def load_config(
    request: ConfigRequest,
    cls: type[BaseModel],
    environ: Mapping[str, str] | None = None,
    prepare: Callable[[dict[str, Any]], None] | None = None,
) -> Any:
    """Resolve and validate a configuration from every source, later sources winning."""
    return resolve_config(request, cls, environ, prepare)[0]


def resolve_config(
    request: ConfigRequest,
    cls: type[BaseModel],
    environ: Mapping[str, str] | None = None,
    prepare: Callable[[dict[str, Any]], None] | None = None,
) -> tuple[Any, Provenance]:
    """The validated configuration and where each value came from: YAML < preset < .env < environment <
    command line."""
    try:
        return _resolve(request, cls, environ, prepare)
    except UserError as exc:
        # The guard for every message of the pipeline and of the validators it runs: secrets masked, one line.
        raise UserError(error_line(exc)) from None


def _resolve(
    request: ConfigRequest,
    cls: type[BaseModel],
    environ: Mapping[str, str] | None,
    prepare: Callable[[dict[str, Any]], None] | None,
) -> tuple[Any, Provenance]:
    environ = dict(os.environ if environ is None else environ)
    file_vars = dotenv_file(request.env_file, required=request.env_file_named)
    variables = {k: v for k, v in file_vars.items() if v is not None}
    variables.update(environ)
    if not request.config_path and request.preset is None:
        request = replace(request, config_path=None, preset="debug")

    tree: dict[str, Any] = {}
    origins: dict[str, str] = {}
    sources = Provenance()
    secrets = secret_keys(cls)
    if request.config_path:
        tree = interpolate(read_yaml(request.config_path), variables)
        file = Source(Layer.CONFIG_FILE, Path(request.config_path).name)
        _drop_masked(tree, secrets, file, sources)
        coerce_text(tree, cls)
        for key, value in tree.items():
            sources.add(key, value, file)
    for key, value in presets.flat(request.preset) if request.preset else ():
        _put(tree, origins, sources, key, value, Source(Layer.PRESET, request.preset or ""))
    # The config file and preset alone: what automatic names compare with.
    base_tree, base_origins = copy.deepcopy(tree), dict(origins)
    known = all_keys(cls)
    for layer, found in ((Layer.DOTENV, file_vars), (Layer.ENVIRONMENT, environ)):
        refuse_misspelt(found, layer.value, known)
        for key, raw, name in env_overrides(found):
            source = Source(layer, name)
            if key in secrets and is_masked(raw):
                sources.masked.append(f"{key} ({source})")
                continue
            value = parse_typed(cls, key, raw)
            if layer is Layer.ENVIRONMENT and name.startswith(ENV_PREFIX):
                # WANDB_API_KEY and BEARER_TOKEN are the secrets' own routes; HPCTRAIN_ names are not.
                refuse_secret(key, value, secrets, f"in the environment variable {name}")
            _put(tree, origins, sources, key, value, source)
            sources.raw[source] = raw
    for text in request.overrides:
        key, value = parse_override(text, cls)
        refuse_secret(key, value, secrets, f"on the command line ({key}=...)")
        shown = f"override {key}=***" if looks_secret(key) else f"override {quote(text)}"
        _put(tree, origins, sources, key, value, Source(Layer.COMMAND_LINE, ""), shown)

    _one_batch_form(tree, origins, request.config_path)
    run = tree.get("run")
    named = isinstance(run, dict) and bool(run.get("name"))
    if prepare is not None:
        prepare(tree)
    cfg = validate(cls, tree, origins)
    if not named:
        base_name = default_run_name(request.config_path, request.preset)
        base, retyped = _base_config(cls, (base_tree, base_origins), tree, request.config_path, prepare)
        later = {key for key, sets in sources.sets.items() if not sets[-1][0].named}
        cfg.run.name, sources.naming = name_run(cfg, base_name, base, later, retyped)
    return cfg, sources


def _drop_masked(tree: dict[str, Any], secrets: set[str], source: Source, sources: Provenance) -> None:
    """Secrets of a file whose value is a mask (a saved config.yaml given back with --config writes them as
    '**********'): unset, as if the file did not name them, and said at start; never sent as a key or token."""
    for dotted in sorted(secrets):
        *path, last = dotted.split(".")
        node: Any = tree
        for part in path:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict) and is_masked(node.get(last)):
            del node[last]
            sources.masked.append(f"{dotted} ({source})")


def _put(
    tree: dict[str, Any],
    origins: dict[str, str],
    sources: Provenance,
    key: str,
    value: Any,
    source: Source,
    origin: str | None = None,
) -> None:
    """One layer's value at a dotted key: in the tree, in the sources, and as the key's origin named in errors
    (`origin`, when errors name it more fully than the sources: the override as typed)."""
    origin = origin or str(source)
    set_dotted(tree, key, value, origin)
    origins[key] = origin
    sources.add(key, value, source)


def _base_config(
    cls: type[BaseModel],
    base_layers: tuple[dict[str, Any], dict[str, str]],
    tree: dict[str, Any],
    config_path: str | None,
    prepare: Callable[[dict[str, Any]], None] | None,
) -> tuple[Any, dict[str, Any]]:
    """The config of the config file and preset alone (None when it does not validate on its own: overrides
    complete it), with the final model and data types; and the `type` keys the later layers changed (another
    type is one difference, not one per key of its section)."""
    base_tree, origins = base_layers
    if prepare is not None:
        prepare(base_tree)
    retyped = {}
    for section in ("model", "data"):
        kind = _section(tree, section).get("type")
        if kind is not None and _section(base_tree, section).get("type") != kind:
            retyped[f"{section}.type"] = kind
            base_tree[section] = {
                "type": kind,
                **{k: v for k, v in base_tree[section].items() if k != "type"},
            }
    try:
        _one_batch_form(base_tree, origins, config_path)
        return cls.model_validate(base_tree), retyped
    except (UserError, ValidationError):
        return None, retyped


def _section(tree: dict[str, Any], name: str) -> dict[str, Any]:
    node = tree.get(name)
    if not isinstance(node, dict):
        node = tree[name] = {}
    return node


_LAYERS = ("preset", ".env", "environment", "override")  # after the config file, in the order they win


def _one_batch_form(tree: dict[str, Any], origins: Mapping[str, str], config_path: str | None) -> None:
    """data.batch_size (per GPU) and data.global_batch_size are one setting in two forms: the later layer's
    wins, as for any key; both in one layer are refused."""
    data = tree.get("data")
    if not isinstance(data, dict) or "batch_size" not in data or "global_batch_size" not in data:
        return
    if data["global_batch_size"] is None:
        del data["global_batch_size"]
        return

    def layer(key: str) -> int:
        source = origins.get(key, "")
        return next((i + 1 for i, name in enumerate(_LAYERS) if source.startswith(name)), 0)

    per_gpu, whole = layer("data.batch_size"), layer("data.global_batch_size")
    if per_gpu == whole:
        where = origins.get("data.batch_size") or f"config file {config_path}"
        raise UserError(
            f"data.batch_size and data.global_batch_size are both set ({where}): set one, the per-GPU batch "
            "or the global batch split over the GPUs"
        )
    del data["batch_size" if per_gpu < whole else "global_batch_size"]
