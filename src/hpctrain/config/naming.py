"""Automatic run names: the folder of a run without `run.name`, a pure function of what the run trains.

    <base>[-<token>...][-<hash>]        e.g. single_gpu-lr0.00002, muons-hidden128-seed3

- base: the config file's stem and the preset (`default_run_name`: debug, single_gpu, fields-single_gpu), the
  stem made folder-safe first (`my run.yaml` -> `my_run`, `...yaml` -> `run`, a long stem cut and hashed);
- one token per identity key (config/identity.py) whose resolved value differs from the base's, i.e. from the
  config file and preset alone: `lr0.00002` (floats positional, so names sort by value), `hidden64_64`, `seed1`, `precision_bf16`, in the schema's order; a
  value that is no folder-safe text (a path, a nested list) gives its key alone (`paths`) and the hash below.
  Values are compared, not spellings: `optim.lr=2e-5` on the command line, `LR=2e-5` from `sbatch
  --export` and `HPCTRAIN_OPTIM__LR=0.00002` name the same folder, and a value equal to the base's adds nothing;
- keys that may change between hops (may_change: run.out_dir, checkpoint and resume settings, slurm.time,
  logging, workers, device) and the run's length (grows: train.total_updates, train.epochs) never enter: every
  hop of a chain, and the same command run again, continue the same folder;
- a name over MAX_LENGTH characters, or one with such a value, keeps the tokens that fit and ends in 8 hex
  digits of the differences' hash: two different runs never share a folder.

An explicit `run.name` always wins. Nothing here imports torch (login nodes).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from decimal import Decimal
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from hpctrain.config.identity import IDENTITY, classify, identity_values

MAX_LENGTH = 64
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def default_run_name(config_path: str | None, preset: str | None) -> str:
    """<config stem>, <config stem>-<preset> with a preset, the preset alone without a config file (debug):
    the base of every automatic name. A job with other settings (an sbatch template implies its preset) gets
    a folder of its own instead of continuing another run's."""
    if not config_path:
        return preset if preset and preset != "none" else "default"
    stem = folder_safe(Path(config_path).stem)
    return f"{stem}-{preset}" if preset and preset != "none" else stem


def folder_safe(text: str) -> str:
    """A config file's stem as the base of a run name (a folder name): other characters than letters, digits,
    '.', '_' and '-' as '_' (`my run` -> `my_run`), no '.', '_' or '-' at either end (`..` -> `run`), and at most
    MAX_LENGTH characters (a longer stem is cut and ends in 8 hex digits of its hash: two stems that share
    their start still name two folders)."""
    safe = _UNSAFE.sub("_", text).strip("._-") or "run"
    if len(safe) <= MAX_LENGTH:
        return safe
    digest = hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()[:8]
    return f"{safe[: MAX_LENGTH - len(digest) - 1].rstrip('._-')}-{digest}"


def identity_differences(cfg: BaseModel, base: BaseModel | None, later: set[str]) -> dict[str, Any]:
    """Identity key -> value of `cfg` where it differs from `base` (the config file and preset alone). Without
    a base (it does not validate on its own), the identity keys the later layers set (`later`)."""
    values = _named_values(cfg)
    if base is None:
        return {k: v for k, v in values.items() if k in later}
    before = _named_values(base)
    return {k: v for k, v in values.items() if k not in before or before[k] != v}


def _named_values(cfg: BaseModel) -> dict[str, Any]:
    values = identity_values(cfg)
    if values.get("data.global_batch_size") is not None:
        values.pop("data.batch_size", None)  # the global batch is the setting; the per-GPU one is derived
    return values


def short_keys(keys: list[str], every_key: list[str]) -> dict[str, str]:
    """Each dotted key's shortest dotted suffix that no other key of the config ends with: `optim.lr` -> `lr`,
    `model.type` and `data.type` stay whole."""
    short = {}
    for key in keys:
        parts = key.split(".")
        for n in range(1, len(parts) + 1):
            tail = ".".join(parts[-n:])
            if not any(other != key and (other == tail or other.endswith("." + tail)) for other in every_key):
                break
        short[key] = tail
    return short


def _text(value: Any) -> tuple[str, bool]:
    """A value as folder-safe text, and whether that text still tells it apart from every other value."""
    if isinstance(value, bool):
        return ("true" if value else "false"), True
    if isinstance(value, float) and math.isfinite(value) and abs(value) < 1e6:
        # positional, the shortest that reads back as the same float: lr0.00002 sorts before lr0.001 (`ls`, the
        # status table), where lr0.00002 came after it
        return format(Decimal(repr(value)), "f"), True
    if isinstance(value, (int, float)):
        text = repr(value).replace("e+", "e")  # 1e16, not 1e+16: a '+' is no run.name character
        return _UNSAFE.sub("_", text), _UNSAFE.search(text) is None
    if value is None:
        return "none", True
    if isinstance(value, str):
        safe = _UNSAFE.sub("_", value)
        return safe, safe == value and safe != ""
    if isinstance(value, list) and all(isinstance(v, (int, float, str, bool)) for v in value):
        parts = [_text(v) for v in value]  # joined by "_": exact only when no item holds one
        exact = all(ok and "_" not in text for text, ok in parts) and len(value) > 0
        return "_".join(text for text, _ in parts), exact
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return _UNSAFE.sub("_", text).strip("_"), False


def _token(short: str, value: Any) -> tuple[str, bool]:
    """`lr0.00002`, `precision_bf16`; a value that is no folder-safe text (paths, nested lists) is its key alone:
    the name's hash tells it apart."""
    text, exact = _text(value)
    key = short.replace(".", "_")
    if not exact:
        return key, False
    return f"{key}{'' if text[:1].isdigit() else '_'}{text}", True


def automatic_name(base: str, differences: dict[str, Any], every_key: list[str]) -> str:
    """`base` plus one token per differing identity key; cut and hashed when long or inexact."""
    if not differences:
        return base
    short = short_keys(list(differences), every_key)
    tokens = [_token(short[k], v) for k, v in differences.items()]
    name = "-".join([base, *(t for t, _ in tokens)])
    if len(name) <= MAX_LENGTH and all(exact for _, exact in tokens):
        return name
    digest = hashlib.sha256(json.dumps(differences, sort_keys=True).encode()).hexdigest()[:8]
    kept = base[: MAX_LENGTH - len(digest) - 1]
    for text, _ in tokens:  # whole tokens while they fit: a cut value would read as another one
        if len(kept) + len(text) + len(digest) + 2 > MAX_LENGTH:
            break
        kept += "-" + text
    return f"{kept}-{digest}"


def name_run(
    cfg: BaseModel, base_name: str, base: BaseModel | None, later: set[str], retyped: dict[str, Any]
) -> tuple[str, str]:
    """The automatic name of `cfg`, and how it was formed (for the line at start). `retyped`: the model/data
    `type` keys that differ from the base's (which was built with cfg's types)."""
    marks = classify(cfg)
    differences = {**retyped, **identity_differences(cfg, base, later)}
    name = automatic_name(base_name, differences, list(marks))
    shown = ", ".join(f"{k}={json.dumps(v)}" for k, v in differences.items())
    how = f"automatic run.name: {base_name}" + (f" + {shown}" if shown else "")
    return name, how


def is_identity(cfg: BaseModel, key: str) -> bool:
    """Whether a dotted key (or every key of a section) enters automatic names."""
    marks = classify(cfg)
    found = [m for k, m in marks.items() if k == key or k.startswith(key + ".")]
    return bool(found) and all(m == IDENTITY for m in found)
