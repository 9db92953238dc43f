"""Loading a configuration: YAML file < preset < .env < environment < command line, validated.

Later sources win, in the order of pydantic-settings and Hydra: what is typed on the command line beats the
environment, which beats the `.env` file, which beats the preset, which beats the YAML file. `Provenance`
remembers every source that set each key, so that a conflict and every value taken from the environment can be
named. A value typed on the command line or in a variable is read by its field's type (a string field keeps
`2024` as text). Every mistake becomes a one-line `UserError` naming the dotted key, the value and what is
allowed, before any work is done.

Size (~610 lines): the layers are one pipeline (read, interpolate, type each value by its field, merge, name
where each value came from, validate): split, each step would need the others' intermediate trees.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import sys
import typing
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from dotenv import dotenv_values
from pydantic import BaseModel, SecretStr, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from hpctrain.config import keys, presets
from hpctrain.config.identity import identity_values
from hpctrain.config.naming import default_run_name, name_run
from hpctrain.errors import UserError

ENV_PREFIX = "HPCTRAIN_"
# Short names the sbatch templates and users pass with `--export` (values go through validation like any other).
# The cosmology scripts' names map to the workload's own data keys; a workload without the key refuses the
# variable in one line (unknown key data.kind, from environment DATA_TYPE). slurm/common.sh lists the same names.
ENV_ALIASES = {
    "LR": "optim.lr",
    "BATCH_SIZE": "data.batch_size",
    "GLOBAL_BATCH_SIZE": "data.global_batch_size",
    "TOTAL_UPDATES": "train.total_updates",
    "EPOCHS": "train.epochs",
    "SEED": "run.seed",
    "GPUS": "slurm.gpus_per_node",  # tasks per node follow (one per GPU) unless slurm.tasks_per_node is set
    "NODES": "slurm.nodes",
    "DATA_TYPE": "data.kind",
    "TRAIN_SAMPLES": "data.n_train",
}
# Variables with a fixed key of their own (paths and the secrets' allowed routes), from the environment or .env.
ENV_KEYS = {
    "RESULTS_DIR": "run.out_dir",
    "WANDB_API_KEY": "logging.wandb.api_key",
    "BEARER_TOKEN": "data.pelican.token",
}


class DotEnv(BaseSettings):
    """Paths and secrets from the environment or a `.env` file (the real environment wins over the file)."""

    model_config = SettingsConfigDict(env_file=".env", extra="ignore", case_sensitive=True)
    DATA_DIR: str | None = None
    RESULTS_DIR: str | None = None
    WANDB_API_KEY: SecretStr | None = None
    BEARER_TOKEN: SecretStr | None = None  # the Pelican/OSDF token (data.pelican.token)


# Where each secret may come from instead of the command line (said in the refusal).
SECRET_HINTS = {
    "data.pelican.token": "put the token in a file only you can read and set data.pelican.token_file=PATH, "
    "or put BEARER_TOKEN=... in .env",
    "logging.wandb.api_key": "put WANDB_API_KEY=... in .env (or in the environment as WANDB_API_KEY)",
}
# Key names that look secret: their values are masked in messages and in sys.argv even when misspelt.
_SECRET_NAME = re.compile(r"(?i)(token|api[_-]?key|secret|password|passwd|credentials?)$")


def looks_secret(key: str) -> bool:
    """Whether a dotted key (or an argument's `key=`) names something secret-like, e.g. `*.token`."""
    return bool(_SECRET_NAME.search(key.lstrip("-").rsplit(".", 1)[-1].rsplit("__", 1)[-1]))


def scrub_argv(argv: list[str]) -> list[str]:
    """`argv` with the value of every secret-looking `key=value` replaced by ***."""
    out = []
    for arg in argv:
        key, sep, _ = arg.partition("=")
        out.append(f"{key}=***" if sep and looks_secret(key) else arg)
    return out


def _types_in(annotation: Any) -> Iterator[Any]:
    """The classes an annotation may hold: through Optional, unions, Annotated and containers."""
    args = typing.get_args(annotation)
    if not args:
        yield annotation
    for arg in args:
        yield from _types_in(arg)


def secret_keys(cls: type[BaseModel], prefix: str = "") -> set[str]:
    """Dotted keys of every SecretStr field; a union's members (model/data types) share their section's key."""
    found: set[str] = set()
    for name, info in cls.model_fields.items():
        for kind in _types_in(info.annotation):
            if kind is SecretStr:
                found.add(prefix + name)
            elif isinstance(kind, type) and issubclass(kind, BaseModel):
                found |= secret_keys(kind, f"{prefix}{name}.")
    return found


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


@dataclass
class ConfigRequest:
    """What the user asked for on the command line (the same arguments for train, config show and submit)."""

    config_path: str | None = None
    preset: str | None = None
    overrides: list[str] = field(default_factory=list)
    env_file: str | None = ".env"


class _Loader(yaml.SafeLoader):  # type: ignore[misc]  # (PyYAML ships no type hints)
    """YAML 1.1 without base-60 numbers: `time: 1:00:00` stays the text SLURM means, not the integer 3600."""


_Loader.yaml_implicit_resolvers = {
    first: [
        (tag, regexp)
        for tag, regexp in resolvers
        if tag not in ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")
    ]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:int",
    re.compile(r"^(?:[-+]?0b[0-1_]+|[-+]?0[0-7_]+|[-+]?(?:0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+)$"),
    list("-+0123456789"),
)
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+][0-9]+)?|\.[0-9][0-9_]*(?:[eE][-+][0-9]+)?"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
    ),
    list("-+0123456789."),
)


def _safe_load(text: str) -> Any:
    return yaml.load(text, Loader=_Loader)


def read_yaml(path: str) -> dict[str, Any]:
    file = Path(path)
    if file.is_dir():
        raise UserError(f"config file {path!r} is a folder; name a YAML file in it (e.g. {path}/debug.yaml)")
    if not file.is_file():
        raise UserError(f"config file {path!r} not found")
    try:
        data = _safe_load(file.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise UserError(
            f"config file {path!r} is not UTF-8 text (byte {exc.start}): is it a YAML file?"
        ) from None
    except OSError as exc:
        raise UserError(f"config file {path!r} cannot be read: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise UserError(f"config file {path!r}: malformed YAML{where}: {problem}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserError(f"config file {path!r}: the top level must be a mapping of sections")
    return data


def parse_value(text: str) -> Any:
    """YAML scalars (`0`, `true`, `[1, 2]`, `null`), and numbers YAML 1.1 misses (`2e-5`); else the string."""
    try:
        value = _safe_load(text)
    except yaml.YAMLError:
        return text
    if isinstance(value, str) and re.fullmatch(r"[+-]?(\d+\.?\d*|\.\d+)[eE][+-]?\d+", value):
        return float(value)
    return value


def set_dotted(tree: dict[str, Any], key: str, value: Any, source: str) -> None:
    parts = key.split(".")
    if not all(parts):
        raise UserError(f"{source}: {key!r} is not a dotted key like optim.lr")
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
    true/false/yes/no/on/off/1/0 in any case; anything else is a YAML scalar or list."""
    kind = keys.kind(cls, key) if cls is not None else None
    if kind == "text":
        return None if raw.strip() in ("null", "~") and keys.optional(cls, key) else raw  # type: ignore[arg-type]
    if kind == "bool":
        return raw.strip()
    return parse_value(raw)


def parse_override(text: str, cls: type[BaseModel] | None = None) -> tuple[str, Any]:
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise UserError(f"override {text!r} must look like key=value (e.g. optim.lr=2e-5)")
    return key.strip(), parse_typed(cls, key.strip(), raw)


def env_overrides(
    environ: Mapping[str, str | None], where: str = "environment"
) -> list[tuple[str, str, str]]:
    """(dotted key, raw value, "<where> NAME") of every variable that sets a key."""
    found = []
    for name, value in sorted(environ.items()):
        if value is None:
            continue
        if name.startswith(ENV_PREFIX) and "__" in name[len(ENV_PREFIX) :]:
            # Only SECTION__KEY names are config: HPCTRAIN_HOME and other script variables are not.
            key = name[len(ENV_PREFIX) :].lower().replace("__", ".")
            found.append((key, value, f"{where} {name}"))
        elif name in ENV_ALIASES and value != "":
            found.append((ENV_ALIASES[name], value, f"{where} {name}"))
        elif name in ENV_KEYS and value != "":
            found.append((ENV_KEYS[name], value, f"{where} {name}"))
    return found


def _shown(key: str, value: Any) -> str:
    if looks_secret(key) or isinstance(value, SecretStr):
        return "***"
    return value if isinstance(value, str) else json.dumps(value)


# Sources a user does not see in the command: a value from one of them is always named at start.
_IMPLICIT = ("environment ", ".env ")


@dataclass
class Provenance:
    """Every source that set each dotted key, in the order applied (the last one won)."""

    sets: dict[str, list[tuple[str, Any]]] = field(default_factory=dict)
    raw: dict[str, str] = field(default_factory=dict)  # the text of variables, as the user wrote it
    naming: str | None = None  # how an automatic run.name was formed (None: run.name was given)

    def add(self, key: str, value: Any, source: str) -> None:
        for dotted, leaf in _leaves(key, value):
            self.sets.setdefault(dotted, []).append((source, leaf))

    def source(self, key: str) -> str | None:
        """The source whose value a key holds (None: the default)."""
        found = self.sets.get(key)
        return found[-1][0] if found else None

    def conflicts(self) -> list[str]:
        """One line (or none) naming every key that the environment or .env set to a value another source
        contradicts, and which won. The layers a user names in the command itself (config file, preset,
        overrides) replace each other by design: `config show` marks where each value came from."""
        items = []
        for key, sets in self.sets.items():
            winner, value = sets[-1]
            losers = [(src, v) for src, v in sets[:-1] if v != value]
            implicit = any(src.startswith(_IMPLICIT) for src, _ in [(winner, value), *losers])
            if losers and implicit:
                beaten = ", ".join(f"{src}: {_shown(key, self.raw.get(src, v))}" for src, v in losers)
                items.append(f"{key}={_shown(key, value)} from {winner} (over {beaten})")
        return ["note: where sources disagree the later one wins: " + "; ".join(items)] if items else []

    def from_environment(self) -> str | None:
        """One line naming every value taken from the environment or .env (key, value, variable)."""
        items = []
        for key, sets in self.sets.items():
            src = sets[-1][0]
            if src.startswith(_IMPLICIT):
                items.append(f"{key}={_shown(key, self.raw.get(src, sets[-1][1]))} ({src})")
        return "note: taken from the environment or .env: " + ", ".join(items) if items else None


def _leaves(key: str, value: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(value, dict) and value:
        for child, sub in value.items():
            yield from _leaves(f"{key}.{child}", sub)
    else:
        yield key, value


def _coerce_text(tree: dict[str, Any], cls: type[BaseModel], prefix: str = "") -> None:
    """Numbers YAML read where the field is a string become its text (`name: 2024`, `time: 30`)."""
    for name, value in tree.items():
        key = f"{prefix}{name}"
        if isinstance(value, dict):
            _coerce_text(value, cls, key + ".")
        elif (
            isinstance(value, (int, float)) and not isinstance(value, bool) and keys.kind(cls, key) == "text"
        ):
            tree[name] = str(value)


def _interpolate(node: Any, variables: Mapping[str, str]) -> Any:
    """Replace ${VAR} in strings with environment/.env values; an unknown variable is an error."""
    if isinstance(node, dict):
        return {k: _interpolate(v, variables) for k, v in node.items()}
    if isinstance(node, list):
        return [_interpolate(v, variables) for v in node]
    if isinstance(node, str) and "${" in node:

        def repl(match: re.Match[str]) -> str:
            name = match.group(1)
            if name not in variables:
                raise UserError(f"${{{name}}} is used in the config but not set in the environment or .env")
            return variables[name]

        return re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", repl, node)
    return node


def _format_error(
    exc: ValidationError, origins: Mapping[str, str], cls: type[BaseModel] | None = None
) -> str:
    parts = []
    for error in exc.errors():
        loc = [str(p) for p in error["loc"]]
        tag = None  # the union member (model.type, data.type) the error is in
        # Drop the union member tag pydantic inserts (e.g. model.regression.hidden -> model.hidden).
        if len(loc) >= 2 and loc[0] in ("model", "data") and error.get("type") != "union_tag_invalid":
            tag = loc[1] if len(loc) > 2 else None
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
                message = f"not a key of {section}.type={tag} (a key of {' and '.join(owners)})"
            elif near:
                message += f" (did you mean {' or '.join(near)}?)"
        elif error["type"] == "union_tag_not_found":
            key, value, message = f"{key}.type", None, "missing: say which type this section is"
        elif error["type"] == "union_tag_invalid":
            key = f"{key}.type" if not key.endswith("type") else key
            expected = error.get("ctx", {}).get("expected_tags", "")
            message = f"unknown type (allowed: {expected})"
            value = error.get("ctx", {}).get("tag", value)
        shown = "" if isinstance(value, dict) or value is None else f"={value!r}"
        if not key:  # a check across sections (the whole config): its message names the keys
            parts.append(message.removeprefix("Value error, "))
            continue
        if looks_secret(key) or isinstance(value, SecretStr):
            shown = "=***" if shown else ""  # a (misspelt) secret is never echoed
        origin = origins.get(key)
        parts.append(f"{key}{shown}: {message}" + (f" (from {origin})" if origin else ""))
    return "; ".join(parts)


def validate(cls: type[BaseModel], tree: dict[str, Any], origins: Mapping[str, str] | None = None) -> Any:
    try:
        return cls.model_validate(tree)
    except ValidationError as exc:
        raise UserError(_format_error(exc, origins or {}, cls)) from None


def load_config(
    request: ConfigRequest,
    cls: type[BaseModel],
    environ: Mapping[str, str] | None = None,
    prepare: Callable[[dict[str, Any]], None] | None = None,
) -> Any:
    """Resolve and validate a configuration from every source, later sources winning."""
    return resolve_config(request, cls, environ, prepare)[0]


def _dotenv_file(path: str | None) -> dict[str, str | None]:
    if not path or not Path(path).is_file():
        return {}
    try:
        return dict(dotenv_values(path, encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise UserError(f"env file {path!r} is not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise UserError(f"env file {path!r} cannot be read: {exc.strerror or exc}") from None


def resolve_config(
    request: ConfigRequest,
    cls: type[BaseModel],
    environ: Mapping[str, str] | None = None,
    prepare: Callable[[dict[str, Any]], None] | None = None,
) -> tuple[Any, Provenance]:
    """The validated configuration and where each value came from: YAML < preset < .env < environment <
    command line."""
    environ = dict(os.environ if environ is None else environ)
    file_vars = _dotenv_file(request.env_file)
    variables = {k: v for k, v in file_vars.items() if v is not None}
    variables.update(environ)

    tree: dict[str, Any] = {}
    origins: dict[str, str] = {}
    sources = Provenance()
    if request.config_path:
        tree = _interpolate(read_yaml(request.config_path), variables)
        _coerce_text(tree, cls)
        for key, value in tree.items():
            sources.add(key, value, f"config file {Path(request.config_path).name}")
    elif request.preset is None:
        request = ConfigRequest(None, "debug", request.overrides, request.env_file)
    if request.preset:
        for key, value in presets.flat(request.preset):
            set_dotted(tree, key, value, f"preset {request.preset}")
            origins[key] = f"preset {request.preset}"
            sources.add(key, value, f"preset {request.preset}")
    # The config file and preset alone: what automatic names compare with.
    base_tree, base_origins = copy.deepcopy(tree), dict(origins)
    secrets = secret_keys(cls)
    for where, found in ((".env", file_vars), ("environment", environ)):
        for key, raw, source in env_overrides(found, where):
            value = parse_typed(cls, key, raw)
            if where == "environment" and source.split()[-1].startswith(ENV_PREFIX):
                # WANDB_API_KEY and BEARER_TOKEN are the secrets' own routes; HPCTRAIN_ names are not.
                refuse_secret(
                    key, value, secrets, f"in the {source.replace('environment', 'environment variable')}"
                )
            set_dotted(tree, key, value, source)
            origins[key] = source
            sources.add(key, value, source)
            sources.raw[source] = raw
    for text in request.overrides:
        key, value = parse_override(text, cls)
        refuse_secret(key, value, secrets, f"on the command line ({key}=...)")
        shown = f"override {key}=***" if looks_secret(key) else f"override {text!r}"
        set_dotted(tree, key, value, shown)
        origins[key] = shown
        sources.add(key, value, "command line")

    _one_batch_form(tree, origins, request.config_path)
    run = tree.get("run")
    named = isinstance(run, dict) and bool(run.get("name"))
    if prepare is not None:
        prepare(tree)
    cfg = validate(cls, tree, origins)
    if not named:
        base_name = default_run_name(request.config_path, request.preset)
        base, retyped = _base_config(cls, (base_tree, base_origins), tree, request.config_path, prepare)
        later = {key for key, sets in sources.sets.items() if not sets[-1][0].startswith(_NAMED_LAYERS)}
        cfg.run.name, sources.naming = name_run(cfg, base_name, base, later, retyped)
    return cfg, sources


# The layers a name is based on; values from the others (.env, environment, command line) name the run.
_NAMED_LAYERS = ("config file ", "preset ")


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


def dump_config(cfg: BaseModel) -> dict[str, Any]:
    """The resolved config as plain data with secrets masked (what is printed and saved). Of the batch's two
    forms only the one in use is written, so a saved config.yaml can be given back with --config."""
    tree: dict[str, Any] = cfg.model_dump(mode="json")
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
    values = {k.lstrip("."): v for k, v in _leaves("", dump_config(cfg))}
    kinds = {s: {"type": getattr(getattr(cfg, s, None), "type", None)} for s in ("model", "data")}
    try:
        default = type(cfg).model_validate({k: v for k, v in kinds.items() if v["type"] is not None})
    except ValueError:  # a config type without defaults for everything: no short form
        return values
    base = {k.lstrip("."): v for k, v in _leaves("", dump_config(default))}
    return {k: v for k, v in values.items() if base.get(k, object()) != v}


def to_yaml(cfg: BaseModel) -> str:
    return str(yaml.safe_dump(dump_config(cfg), sort_keys=False))


def is_rank_zero(environ: dict[str, str] | None = None) -> bool:
    """Whether this process speaks for the job: torchrun's RANK, else srun's SLURM_PROCID, is 0 or absent."""
    environ = dict(os.environ) if environ is None else environ
    rank = environ.get("RANK") or environ.get("SLURM_PROCID") or "0"
    return rank.strip() == "0"


def announce(sources: Provenance) -> None:
    """On stderr, rank 0 only: the values taken from the environment or .env, and every conflict resolved."""
    if not is_rank_zero():
        return
    line = sources.from_environment()
    for text in ([line] if line else []) + sources.conflicts():
        print(text, file=sys.stderr, flush=True)
