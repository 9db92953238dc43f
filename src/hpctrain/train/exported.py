"""An export folder (`hpctrain export RUN --out DIR`): one update of a trained model outside its run folder, read
back by `hpctrain.load(DIR)`, `hpctrain sample DIR` and `hpctrain evaluate DIR` on any machine.

It holds `<network>.pt` (a plain state dict each: `torch.load(path, weights_only=True)`), `config.yaml` (the run's
configuration, the exporting machine's own paths cleared), `README.md` and `export.json` (what was exported and
the SHA-256 of every file), and no absolute path.

Writing (`write_export`): export.json first becomes a marker of an export in progress that names every file of
the earlier export and of this one with their hashes; then the files are written, each atomically; then the
earlier export's files this one has not are removed; export.json, written last, describes the new files. A kill
at any point leaves the earlier export, the marker (refused by readers, accepted by the next export) or the new
export: never one run's export.json over another's weights. Only plain file names an earlier export recorded,
whose bytes still have the hash it recorded, are removed or replaced: an export.json naming `../x` or `/x` (or
a user's file since put under an export's name) loses nothing.

Reading (`read_export`): every file is checked against its hash in export.json before it is used (a folder
changed or mixed by hand is refused, one line), and the result has the form of a checkpoint's state (`config`,
`modules`, `counters`), so the model verbs take an export where they take a run folder.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from pydantic import BaseModel

from hpctrain.config.dump import dump_config
from hpctrain.config.yaml_file import load_yaml
from hpctrain.errors import UserError
from hpctrain.fsutil import atomic_write_bytes, atomic_write_json

if TYPE_CHECKING:
    import torch

EXPORT_JSON = "export.json"
CONFIG_FILE = "config.yaml"
README_FILE = "README.md"
FORMAT = 2  # 1: the first exports (no hashes; absolute paths), read by nothing
MAX_META_BYTES = 16 * 2**20
_PLAIN = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")  # a file name in the folder: no '/', no '..'


def is_export(folder: Path) -> bool:
    """Whether `folder` is an export folder (an export.json and no run's checkpoints/ beside it)."""
    return (folder / EXPORT_JSON).is_file() and not (folder / "checkpoints").is_dir()


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _file_hash(path: Path) -> str | None:
    """The SHA-256 of a regular file (not a link), None for anything else."""
    if path.is_symlink() or not path.is_file():
        return None
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _read_meta(folder: Path) -> dict[str, Any] | None:
    """export.json's object, None when there is none or it is no JSON object (bounded: no 1 GB file read)."""
    path = folder / EXPORT_JSON
    try:
        with path.open("rb") as fh:
            raw = fh.read(MAX_META_BYTES + 1)
        meta = json.loads(raw) if len(raw) <= MAX_META_BYTES else None
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


def _recorded(meta: dict[str, Any]) -> dict[str, list[str]]:
    """Plain file name -> the SHA-256 values export.json (or an export's marker) accepts for it. An export of the
    first format recorded no hashes: its own names with none (replaced by name, never removed)."""
    files = meta.get("files")
    out: dict[str, list[str]] = {}
    if isinstance(files, dict):
        for name, hashes in files.items():
            given = [hashes] if isinstance(hashes, str) else hashes if isinstance(hashes, list) else []
            out[str(name)] = [str(h) for h in given if isinstance(h, str)]
    else:
        networks = meta.get("networks")
        names = (
            [n.get("file") for n in networks.values() if isinstance(n, dict)]
            if isinstance(networks, dict)
            else []
        )
        out = {str(name): [] for name in [*names, CONFIG_FILE, README_FILE] if isinstance(name, str)}
    return {name: hashes for name, hashes in out.items() if _PLAIN.match(name) and name != EXPORT_JSON}


def earlier_export(out: Path, option: str = "--out") -> dict[str, list[str]]:
    """The files an earlier export in `out` wrote (name -> the hashes it recorded); {} for a new or empty folder.
    A folder that holds other files and no export is refused (UserError): an export never mixes with them."""
    if out.exists() and not out.is_dir():
        raise UserError(f"{option} {out}: is a file; name a folder")
    if not out.is_dir() or not any(out.iterdir()):
        return {}
    meta = _read_meta(out)
    if meta is None:
        raise UserError(
            f"{option} {out}: holds other files and no earlier export; name a new or empty folder"
        )
    return _recorded(meta)


def machine_path(value: Any) -> bool:
    """Whether a config value is a path of the machine it was set on (absolute, home-relative, file://)."""
    return isinstance(value, str) and (value.startswith(("/", "~", "file:")) or os.path.isabs(value))


def portable_config(cfg: BaseModel) -> tuple[str, list[str]]:
    """The config as YAML (secrets masked, as config.yaml in the run folder) with the machine's own paths
    cleared: a value set to its default, a list without them; also the dotted keys cleared."""
    tree = dump_config(cfg)
    kinds = {s: {"type": getattr(getattr(cfg, s, None), "type", None)} for s in ("model", "data")}
    try:
        default = dump_config(
            type(cfg).model_validate({k: v for k, v in kinds.items() if v["type"] is not None})
        )
    except ValueError:  # a config type without defaults for everything
        default = {}
    cleared: list[str] = []

    def clean(node: Any, base: Any, key: str) -> Any:
        if isinstance(node, dict):
            below = base if isinstance(base, dict) else {}
            return {k: clean(v, below.get(k), f"{key}.{k}" if key else k) for k, v in node.items()}
        if isinstance(node, list):
            kept = [v for v in node if not machine_path(v)]
            if len(kept) != len(node):
                cleared.append(key)
            return kept
        if machine_path(node):
            cleared.append(key)
            return None if machine_path(base) else base
        return node

    return str(yaml.safe_dump(clean(tree, default, ""), sort_keys=False)), cleared


def state_bytes(module: torch.nn.Module) -> bytes:
    """A network's state dict as the bytes of a plain `torch.save` (tensors on the CPU, nothing around them)."""
    import torch

    buffer = io.BytesIO()
    torch.save({key: value.detach().cpu() for key, value in module.state_dict().items()}, buffer)
    return buffer.getvalue()


def write_export(
    out: Path, files: dict[str, bytes], meta: dict[str, Any], readme: Callable[[dict[str, Any]], str]
) -> tuple[list[str], list[str]]:
    """Write the export (`files`: name -> bytes, config.yaml included; `meta`: export.json less its `files`;
    `readme(meta)`: README.md's text) into `out` in the order of the module docstring. Returns (the names
    written, the earlier export's files left in place because they are no longer what it wrote)."""
    earlier = earlier_export(out)
    files = {**files, README_FILE: readme(meta).encode()}
    for name in files:
        target = out / name
        if (target.exists() or target.is_symlink()) and not _written_by(target, earlier.get(name)):
            raise UserError(
                f"--out {out}: holds {name}, which the earlier export there did not write (it recorded another "
                "SHA-256, or none): nothing was written; move it, or name a new or empty folder"
            )
    hashes = {name: sha256(data) for name, data in files.items()}
    out.mkdir(parents=True, exist_ok=True)
    marker = {
        name: [*earlier.get(name, []), *([hashes[name]] if name in hashes else [])]
        for name in {*earlier, *files}
    }
    atomic_write_json(
        out / EXPORT_JSON,
        {"format": FORMAT, "complete": False, "note": "an export being written", "files": marker},
    )
    for name, data in files.items():
        atomic_write_bytes(out / name, data)
    left = []
    for name in sorted(set(earlier) - set(files)):
        target = out / name
        if _written_by(target, earlier[name]) and earlier[name]:
            target.unlink()  # a network of the earlier export that this model has not
        elif target.exists() or target.is_symlink():
            left.append(name)
    atomic_write_json(out / EXPORT_JSON, {**meta, "format": FORMAT, "complete": True, "files": hashes})
    return [*files, EXPORT_JSON], left


def _written_by(path: Path, hashes: list[str] | None) -> bool:
    """Whether the file at `path` is one an earlier export wrote: named by it, and with a hash it recorded (an
    export of the first format recorded none: its own names count)."""
    if hashes is None:
        return False
    if not hashes:
        return not path.is_symlink()
    return _file_hash(path) in hashes


def read_export(folder: Path) -> dict[str, Any]:
    """The export in `folder` as a checkpoint's state (`config`, `modules`, `counters.step`, `params_sha256`),
    every file checked against export.json's hash first; any problem is one UserError line naming the folder."""
    meta = _read_meta(folder)
    if meta is None:
        raise UserError(f"{folder}: {EXPORT_JSON} cannot be read as a JSON object; export the model again")
    if meta.get("format") != FORMAT:
        raise UserError(
            f"{folder}: an export of format {meta.get('format', 1)!r}, which this hpctrain does not read (format "
            f"{FORMAT} records the files' SHA-256); export the model again"
        )
    if meta.get("complete") is not True:
        raise UserError(
            f"{folder}: an export that was cut short ({EXPORT_JSON} is its marker); export it again"
        )
    recorded = _recorded(meta)
    networks = meta.get("networks")
    if not isinstance(networks, dict) or not networks:
        raise UserError(f"{folder}: {EXPORT_JSON} names no networks; export the model again")
    from hpctrain.train.tensor_file import Refused, load_tensors  # torch

    modules: dict[str, Any] = {}
    for name, net in networks.items():
        file = net.get("file") if isinstance(net, dict) else None
        data = _checked(folder, file, recorded)
        try:
            modules[str(name)] = load_tensors(data)
        except Refused as exc:  # the hash matched: someone wrote objects into the export on purpose
            raise UserError(f"{folder / str(file)}: {exc}") from None
        except Exception as exc:  # any unpickling/format error: the file is not what the hash promised
            raise UserError(f"{folder / str(file)}: not a state dict ({type(exc).__name__})") from None
    text = _checked(folder, CONFIG_FILE, recorded).decode("utf-8", errors="replace")
    try:
        config = load_yaml(text, f"{folder / CONFIG_FILE}")
    except yaml.YAMLError:
        config = None
    if not isinstance(config, dict):
        raise UserError(
            f"{folder / CONFIG_FILE}: not a configuration (a YAML mapping); export the model again"
        )
    state = {
        "config": config,
        "modules": modules,
        "counters": {"step": int(meta.get("step") or 0)},
        "params_sha256": str(meta.get("params_sha256", "")),
    }
    return state


def _checked(folder: Path, name: Any, recorded: dict[str, list[str]]) -> bytes:
    """The bytes of the export's file `name`, whose SHA-256 is the one export.json recorded."""
    if not isinstance(name, str) or name not in recorded or not recorded[name]:
        raise UserError(f"{folder}: {EXPORT_JSON} records no SHA-256 for {name!r}; export the model again")
    path = folder / name
    if path.is_symlink():
        raise UserError(f"{path}: a link, not the file the export wrote; export the model again")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise UserError(f"{path}: cannot be read ({exc.strerror or exc}); export the model again") from None
    if sha256(data) not in recorded[name]:
        raise UserError(
            f"{path}: its SHA-256 does not match {EXPORT_JSON} (changed since the export, or files of two exports "
            "mixed); export the model again"
        )
    return data


def check_params(state: dict[str, Any], found_in: Path, digest: str) -> None:
    """An export's weights, once built into the networks, have the params_sha256 export.json gives."""
    expected = state.get("params_sha256")
    if expected and expected != digest:
        raise UserError(
            f"{found_in}: the networks built from it have params_sha256 {digest[:16]}..., not the "
            f"{str(expected)[:16]}... {EXPORT_JSON} gives; export the model again"
        )
