"""The environment and `.env` as config sources: which variables set which keys, and `${VAR}` in YAML strings.

Only three kinds of names are config: `HPCTRAIN_SECTION__KEY`, the short names sbatch templates pass with
`--export` (ENV_ALIASES), and the variables with a fixed key of their own (ENV_KEYS: paths and the secrets' own
routes). Everything else in the environment is left alone.
"""

from __future__ import annotations

import io
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dotenv import dotenv_values
from dotenv.parser import parse_stream
from pydantic_settings import BaseSettings, SettingsConfigDict

from hpctrain.config.messages import cut
from hpctrain.config.secret_type import Secret
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
    "VAL_SAMPLES": "data.n_val",
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
    WANDB_API_KEY: Secret = None
    BEARER_TOKEN: Secret = None  # the Pelican/OSDF token (data.pelican.token)


def dotenv_file(path: str | None, required: bool = False) -> dict[str, str | None]:
    """The variables of a `.env` file ({} when there is none, unless the user named it: `required`). A line
    python-dotenv cannot parse is refused naming the file and line (dotenv alone would drop the setting with
    a warning that names neither, and the run would go on without it); its text is not shown (secrets)."""
    if not path:
        return {}
    where = Path(path)
    if not where.is_file():
        if required:  # the default .env may be missing, or a folder (a virtualenv is often named .env)
            what = "is a folder" if where.is_dir() else "does not exist"
            raise UserError(f"env file {path!r} {what}: name a file of NAME=value lines (--env-file)")
        return {}
    try:
        text = where.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"env file {path!r} is not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise UserError(f"env file {path!r} cannot be read: {exc.strerror or exc}") from None
    for binding in parse_stream(io.StringIO(text)):
        if binding.error:
            name = re.match(r"\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)\s*=", binding.original.string)
            which = f" (setting {name.group(1)})" if name else ""
            raise UserError(
                f"env file {path!r} line {binding.original.line}{which} is not NAME=value (an unclosed quote?): "
                "nothing was run; fix or remove the line"
            )
    return dict(dotenv_values(stream=io.StringIO(text)))


def env_overrides(environ: Mapping[str, str | None]) -> list[tuple[str, str, str]]:
    """(dotted key, raw value, variable name) of every variable that sets a key."""
    found = []
    for name, value in sorted(environ.items()):
        if value is None:
            continue
        if name.startswith(ENV_PREFIX) and "__" in name[len(ENV_PREFIX) :]:
            # Only SECTION__KEY names are config: HPCTRAIN_HOME and other script variables are not.
            key = name[len(ENV_PREFIX) :].lower().replace("__", ".")
            found.append((key, value, name))
        elif name in ENV_ALIASES and value != "":
            found.append((ENV_ALIASES[name], value, name))
        elif name in ENV_KEYS and value != "":
            found.append((ENV_KEYS[name], value, name))
    return found


def refuse_misspelt(environ: Mapping[str, str | None], where: str, keys: list[str]) -> None:
    """HPCTRAIN_OPTIM_LR (one underscore where the section ends) names a key but sets nothing: only
    SECTION__KEY names are config (other HPCTRAIN_ names are the scripts'), so it was ignored and the run
    trained with the value it was meant to replace. A name that spells a key with single underscores is refused,
    naming the right spelling; a name that matches no key stays the scripts' business."""
    spelt = {
        key.replace(".", "_"): key for key in keys if "." in key
    }  # a section alone has no other spelling
    for name in sorted(environ):
        rest = name[len(ENV_PREFIX) :].lower() if name.startswith(ENV_PREFIX) else ""
        if rest and "__" not in rest and rest in spelt:
            right = ENV_PREFIX + spelt[rest].upper().replace(".", "__")
            raise UserError(
                f"{where} variable {name} sets nothing: write {right} for {spelt[rest]} (two underscores "
                "between section and key)"
            )


_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def interpolate(node: Any, variables: Mapping[str, str]) -> Any:
    """Replace ${VAR} in strings with environment/.env values; an unknown variable is an error."""
    if isinstance(node, dict):
        return {k: interpolate(v, variables) for k, v in node.items()}
    if isinstance(node, list):
        return [interpolate(v, variables) for v in node]
    if isinstance(node, str) and "${" in node:

        def repl(match: re.Match[str]) -> str:
            name = match.group(1)
            if name not in variables:
                raise UserError(
                    f"${{{cut(name)}}} is used in the config but not set in the environment or .env"
                )
            return variables[name]

        return _VAR.sub(repl, node)
    return node
