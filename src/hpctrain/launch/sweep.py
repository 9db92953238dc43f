"""Sweeps: a grid of overrides, one run folder per element, queued as ONE job array.

`hpctrain submit --sweep optim.lr=1e-5,2e-5 --sweep model.hidden=[64],[128]` (or `--sweep-file`, a YAML mapping
key -> list) makes the grid (the last key varies fastest), resolves and checks every element's config before
anything is queued, and writes a plan (`plan.json`): the `hpctrain train` arguments of each element. Array task k
runs element k (`slurm/common.sh`: `--sweep-plan PLAN` and SLURM_ARRAY_TASK_ID, which a requeued task keeps);
each element's run folder is its automatic name (config/naming.py: `debug-lr0.00001-hidden64`), so every hop
of its chain continues it. An afterany successor is no array task: it gets the element's arguments themselves.

    python -m hpctrain.launch.sweep args PLAN INDEX    # the element's arguments, as shell words (batch shell)

No torch here (login nodes, batch shells).
"""

from __future__ import annotations

import itertools
import json
import math
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from hpctrain.config import keys
from hpctrain.config.loading import ConfigRequest, Provenance
from hpctrain.config.naming import is_identity
from hpctrain.config.secrets import looks_secret, mask_secrets
from hpctrain.config.yaml_file import load_yaml
from hpctrain.errors import EXIT_BAD_INPUT, UserError
from hpctrain.fsutil import PRIVATE_MODE, atomic_write_json, make_folders
from hpctrain.remote.mirror import copy_destinations

MAX_ELEMENTS = 1000  # more only with --yes (SLURM's default MaxArraySize is 1001)
PLAN_VERSION = 1


@dataclass(frozen=True)
class Element:
    index: int
    overrides: list[str]  # `key=value` texts, read like command-line overrides
    name: str
    run_dir: Path


def split_values(text: str) -> list[str]:
    """`1e-5,2e-5` -> ["1e-5", "2e-5"]; commas inside brackets or quotes stay (`[64,64],[128]`)."""
    items, depth, quote, current = [], 0, "", ""
    for char in text:
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "[{":
            depth += 1
        elif char in "]}":
            depth -= 1
        elif char == "," and depth == 0:
            items.append(current)
            current = ""
            continue
        current += char
    return [*items, current]


def parse_sweep_args(texts: list[str]) -> dict[str, list[str]]:
    """`--sweep KEY=V1,V2,...` options as key -> value texts (in the order given)."""
    axes: dict[str, list[str]] = {}
    for text in texts:
        key, sep, values = text.partition("=")
        key = key.strip()
        if not sep or not key:
            raise UserError(f"--sweep {text!r}: give KEY=V1,V2,... (e.g. --sweep optim.lr=1e-5,2e-5)")
        items = [v.strip() for v in split_values(values)] if values.strip() else []
        _add_axis(axes, key, items, f"--sweep {key}")
    return axes


def read_sweep_file(path: str) -> dict[str, list[str]]:
    """A YAML mapping key -> list of values, as value texts (JSON for anything but a string)."""
    try:
        # Bounded as a config file is (alias bombs, depth): a sweep file is the same kind of input.
        data = load_yaml(Path(path).read_text(encoding="utf-8"), f"--sweep-file {path!r}")
    except FileNotFoundError:
        raise UserError(f"--sweep-file {path!r} not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"--sweep-file {path!r} cannot be read: {exc}") from None
    except yaml.YAMLError as exc:
        raise UserError(f"--sweep-file {path!r}: malformed YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise UserError(f"--sweep-file {path!r}: the top level must be a mapping of key -> list of values")
    axes: dict[str, list[str]] = {}
    for key, values in data.items():
        where = f"--sweep-file {path}: {key}"
        if not isinstance(values, list):
            raise UserError(f"{where}: give a list of values (e.g. {key}: [1e-5, 2e-5])")
        _add_axis(axes, str(key), [v if isinstance(v, str) else json.dumps(v) for v in values], where)
    return axes


def _add_axis(axes: dict[str, list[str]], key: str, values: list[str], where: str) -> None:
    if key in axes:
        raise UserError(f"{where}: the key is swept twice; give all its values once")
    if not values:
        raise UserError(f"{where}: no values (an empty list sweeps nothing)")
    if any(v == "" for v in values):
        raise UserError(f"{where}: an empty value in {','.join(values)!r}")
    if len(set(values)) < len(values):
        raise UserError(f"{where}: a value is listed twice ({','.join(values)})")
    axes[key] = values


def check_axes(axes: dict[str, list[str]], cls: type[BaseModel], overrides: list[str], yes: bool) -> int:
    """Refuse keys that are unknown, SLURM settings (one for the whole array) or also plain overrides, and a
    grid over MAX_ELEMENTS without `yes`; return the number of elements."""
    if not axes:
        raise UserError("a sweep needs at least one --sweep KEY=V1,V2,... or a --sweep-file")
    given = {text.partition("=")[0].strip() for text in overrides}
    for key in axes:
        if looks_secret(key):  # its values would be in the plan, the job's arguments and its log
            raise UserError(
                f"--sweep {key}: a secret is never swept (put it in .env or a file only you read)"
            )
        if not keys.field_infos(cls, key):
            near = keys.suggest(cls, key)
            hint = f" (did you mean {' or '.join(near)}?)" if near else ""
            raise UserError(f"--sweep {key}: unknown key{hint}")
        if key.split(".")[0] == "slurm":
            raise UserError(
                f"--sweep {key}: the slurm settings are one for the whole job array; set them outside the sweep"
            )
        if key in given:
            raise UserError(f"--sweep {key}: also given as an override ({key}=...); give it once")
    count = math.prod(len(values) for values in axes.values())
    if count > MAX_ELEMENTS and not yes:
        raise UserError(
            f"the sweep has {count} elements ({' x '.join(str(len(v)) for v in axes.values())}), over "
            f"{MAX_ELEMENTS}: say --yes to queue them all"
        )
    return count


def grid(axes: dict[str, list[str]]) -> list[list[str]]:
    """Each element's overrides, the last key varying fastest."""
    return [
        [f"{key}={value}" for key, value in zip(axes, combo)] for combo in itertools.product(*axes.values())
    ]


def build_plan(
    request: ConfigRequest,
    axes: dict[str, list[str]],
    resolve: Callable[[ConfigRequest], tuple[Any, Provenance]],
    check: Callable[[Any, Provenance], Path],
) -> tuple[list[Element], Any]:
    """Every element resolved and checked as its job will resolve it (a mistake names the element), and no
    two sharing a run folder. Returns the elements and the first element's config (its slurm section is the
    array's)."""
    elements: list[Element] = []
    first_cfg = None
    folders: dict[Path, Element] = {}
    copies: dict[tuple[str, str], Element] = {}
    for index, overrides in enumerate(grid(axes)):
        what = f"sweep element {index} ({' '.join(overrides)})"
        try:
            element_request = replace(request, overrides=[*request.overrides, *overrides])
            cfg, sources = resolve(element_request)
            run_dir = check(cfg, sources).resolve()
        except UserError as exc:
            raise UserError(f"{what}: {exc}") from None
        element = Element(index, overrides, cfg.run.name, run_dir)
        if run_dir in folders:
            raise UserError(_collision(folders[run_dir], element, axes, cfg, sources))
        folders[run_dir] = element
        for setting, place in copy_destinations(cfg):
            if (setting, place) in copies:
                raise UserError(_shared_copies(copies[setting, place], element, setting, place))
            copies[setting, place] = element
        elements.append(element)
        first_cfg = first_cfg if first_cfg is not None else cfg
    return elements, first_cfg


def _shared_copies(first: Element, second: Element, setting: str, place: str) -> str:
    """Two elements whose checkpoint copies would go to one place: each copy prunes what its run pruned."""
    if setting == "checkpoint.dir":
        fix = (
            "a checkpoint.dir holds one run's checkpoints: sweep it too, or use checkpoint.mirror_to, which keeps "
            "each run in <mirror_to>/<run name>/"
        )
    else:
        fix = "their runs have one name (under other run.out_dir): give them other names or mirror_to"
    return (
        f"sweep elements {first.index} ({' '.join(first.overrides)}) and {second.index} "
        f"({' '.join(second.overrides)}) would share {setting} ({mask_secrets(place)}): each would replace and "
        f"remove the other's checkpoints there; {fix}"
    )


def _collision(
    first: Element, second: Element, axes: dict[str, list[str]], cfg: Any, sources: Provenance
) -> str:
    if sources.naming is None:
        why = f"run.name={cfg.run.name} is given: leave it out of a sweep (each element is named from its values)"
    else:
        unnamed = [k for k in axes if not is_identity(cfg, k)]
        why = (
            f"{', '.join(unnamed)} may change between hops and does not name runs: sweep keys that define the run"
            if unnamed
            else "their values name the same folder"
        )
    return (
        f"sweep elements {first.index} ({' '.join(first.overrides)}) and {second.index} "
        f"({' '.join(second.overrides)}) would share the run folder {second.run_dir}: {why}"
    )


def plan_record(
    request: ConfigRequest, axes: dict[str, list[str]], elements: list[Element]
) -> dict[str, Any]:
    """What plan.json holds: the `hpctrain train` arguments of every element (paths absolute), and for people
    the grid and each element's name and run folder."""
    return {
        "version": PLAN_VERSION,
        "sweep": axes,
        "elements": [
            {
                "index": e.index,
                "args": train_args(request, e.overrides),
                "name": e.name,
                "run_dir": str(e.run_dir),
            }
            for e in elements
        ],
    }


def train_args(request: ConfigRequest, overrides: list[str]) -> list[str]:
    args = ["--config", request.config_path] if request.config_path else []
    args += ["--preset", request.preset] if request.preset else []
    args += ["--env-file", request.env_file] if request.env_file is not None else []  # "": none
    return [*args, *request.overrides, *overrides]


def write_plan(path: Path, record: dict[str, Any]) -> None:
    make_folders(path.parent, PRIVATE_MODE)  # the job's arguments: the submitter's alone (submit checks it)
    atomic_write_json(path, record)


def element_args(plan: Path, index: int) -> list[str]:
    """The `hpctrain train` arguments of element `index` of a plan (UserError when there is none)."""
    try:
        record = json.loads(plan.read_text())
    except OSError as exc:
        raise UserError(f"sweep plan {plan} cannot be read: {exc.strerror or exc}") from None
    except (ValueError, RecursionError):
        raise UserError(
            f"sweep plan {plan} is not JSON: was it written by `hpctrain submit --sweep`?"
        ) from None
    elements = record.get("elements", []) if isinstance(record, dict) else []
    elements = elements if isinstance(elements, list) else []
    if not 0 <= index < len(elements):
        raise UserError(f"sweep plan {plan} has elements 0..{len(elements) - 1}, not {index}")
    args = elements[index].get("args") if isinstance(elements[index], dict) else None
    if not isinstance(args, list):
        raise UserError(f"sweep plan {plan}: element {index} holds no list of arguments (a damaged plan?)")
    return [str(arg) for arg in args]


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 3 or args[0] != "args" or not args[2].isdigit():
        print("usage: python -m hpctrain.launch.sweep args PLAN INDEX", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        words = element_args(Path(args[1]), int(args[2]))
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(shlex.join(words))
    return 0


if __name__ == "__main__":
    sys.exit(main())
