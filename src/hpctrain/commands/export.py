"""`hpctrain export RUN --out DIR [--which latest|best|step_N]`: a trained model for use outside hpctrain and
outside its run folder (train/exported.py: what the folder holds, how it is written and checked).

DIR gets one plain state dict per network (`model.pt`, `generator.pt`, ...: `torch.load(path, weights_only=True)`
gives parameter name -> tensor, nothing around it), the run's `config.yaml` (the machine's own paths cleared),
`export.json` (what was exported: run name, checkpoint, update, params_sha256, each network's class and
constructor settings, every file's SHA-256) and a README.md with the loading code, with and without hpctrain.
`hpctrain.load(DIR)`, `hpctrain sample DIR` and `hpctrain evaluate DIR` read it on any machine.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpctrain import __version__
from hpctrain.commands.common import ArgParser
from hpctrain.train.exported import (
    CONFIG_FILE,
    EXPORT_JSON,
    earlier_export,
    portable_config,
    state_bytes,
    write_export,
)

if TYPE_CHECKING:
    from hpctrain.workloads.trained import Trained

SHOWN_TENSORS = 24  # tensors listed per network in the README (all of them are in the file)


def main(argv: list[str]) -> int:
    parser = ArgParser(
        prog="hpctrain export",
        description="Write a trained model's networks as plain state dicts, with its config and loading code.",
    )
    parser.add_argument("run", help="run folder, checkpoint file, or an earlier export folder")
    parser.add_argument("--out", required=True, help="folder to write (new, empty, or an earlier export)")
    parser.add_argument(
        "--which", default="latest", help="latest (default), best, or step_N: which checkpoint of the run"
    )
    args = parser.parse_args(argv)
    out = Path(args.out)
    earlier_export(out)  # a folder of other files is refused before torch and the model load
    print("export: loading torch and the checkpoint", flush=True)  # seconds; a minute on a busy machine
    from hpctrain.train.checkpoint import locate

    found = locate(args.run, args.which)  # a run that is not there: one line before torch loads
    import torch

    from hpctrain.workloads.trained import build

    trained = build(found, torch.device("cpu"))
    files, meta = export_files(trained, args.which)
    written, left = write_export(out, files, meta, lambda m: readme(m, out))
    kept = f"; left {', '.join(left)} (not as the earlier export wrote them)" if left else ""
    print(
        f"exported update {trained.step} of {args.run} ({trained.checkpoint.name}) to {out}: "
        f"{', '.join(written)}{kept}; params_sha256={trained.params_sha256}"
    )
    return 0


def export_files(trained: Trained, which: str) -> tuple[dict[str, bytes], dict[str, Any]]:
    """The export's files (name -> bytes; the README aside) and export.json's content less the files' hashes.
    No absolute path: the run by its name, the checkpoint by its place in the run folder."""
    import torch  # loaded with the checkpoint

    files: dict[str, bytes] = {}
    networks: dict[str, Any] = {}
    for name, module in trained.models.items():
        files[f"{name}.pt"] = state_bytes(module)
        cls = type(module)
        networks[name] = {
            "file": f"{name}.pt",
            "class": f"{cls.__module__}.{cls.__qualname__}",
            "settings": trained.settings.get(name),
            "parameters": sum(p.numel() for p in module.parameters()),
            "tensors": {key: list(value.shape) for key, value in module.state_dict().items()},
        }
    config, cleared = portable_config(trained.config)
    files[CONFIG_FILE] = config.encode()
    checkpoint = trained.checkpoint
    if trained.run_dir is not None and checkpoint.is_relative_to(trained.run_dir):
        where = checkpoint.relative_to(trained.run_dir).as_posix()
    else:
        where = checkpoint.name
    meta = {
        "run": str(trained.config.run.name),
        "checkpoint": where,
        "which": which,
        "step": trained.step,
        "params_sha256": trained.params_sha256,
        "model_type": trained.model_type,
        "networks": networks,
        "config_paths_cleared": cleared,
        "sampler": trained.sampler is not None,
        "hpctrain": __version__,
        "torch": torch.__version__,
        "exported": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    return files, meta


def readme(meta: dict[str, Any], out: Path) -> str:
    """The export folder's README: what it holds and the loading code (with hpctrain, then with torch alone).
    Names no absolute path: the folder by its own name, the checkpoint by its place in the run folder."""
    nets = meta["networks"]
    first, net = next(iter(nets.items()))
    module, _, cls = net["class"].rpartition(".")
    folder = out.resolve().name or "."
    cleared = meta["config_paths_cleared"]
    paths = (
        f" The exporting machine's own paths are cleared ({', '.join(cleared)}): set yours, e.g. "
        f"`{cleared[0]}=...` on the command line."
        if cleared
        else ""
    )
    lines = [
        f"# {meta['model_type']} model, update {meta['step']}",
        "",
        f"Exported by hpctrain {meta['hpctrain']} (torch {meta['torch']}) on {meta['exported']} from "
        f"`{meta['checkpoint']}` of run `{meta['run']}` (`--which {meta['which']}`).",
        f"params_sha256 `{meta['params_sha256']}` (over every network's state dict: the figure the run's "
        "summary.json and last line give for the same checkpoint).",
        "",
        "| file | network | class | parameters |",
        "|---|---|---|---:|",
        *(f"| `{n['file']}` | {name} | `{n['class']}` | {n['parameters']:,} |" for name, n in nets.items()),
        "",
        "`config.yaml` is the run's configuration (`hpctrain train --config config.yaml run.name=NEW` trains the "
        f"same model afresh).{paths} "
        f"`{EXPORT_JSON}` lists the files with their SHA-256, each network's class and its constructor settings "
        "(`settings`); hpctrain checks every file against it before use.",
        "",
        "## With hpctrain",
        "",
        "This folder is what `hpctrain.load`, `hpctrain sample` and `hpctrain evaluate` take, on any machine:",
        "",
        "```python",
        "import hpctrain",
        "",
        f'trained = hpctrain.load("{folder}")  # this folder, by any path; device="cuda"',
        f'net = trained.models["{first}"]  # in eval mode; trained.config, trained.step, trained.params_sha256',
    ]
    if meta["sampler"]:
        lines += [
            "events = trained.sampler.sample(10_000, seed=0)  # the bundles `hpctrain sample --events` writes",
            "# for primaries of your own, by named columns with units (help(trained.sampler.generate)):",
            'events = trained.sampler.generate({"energy_GeV": [1e6], "zenith_rad": [0.0], "mass_GeV": [0.938], '
            '"depth_m": [1500.0]}, seed=0)',
        ]
    lines += [
        "```",
        "",
        "or from these files, with hpctrain's network classes:",
        "",
        "```python",
        "import json",
        "",
        "import torch",
        "",
        f"from {module} import {cls}",
        "",
        'meta = json.load(open("export.json"))',
        f'net = {cls}(**meta["networks"]["{first}"]["settings"])',
        f'net.load_state_dict(torch.load("{net["file"]}", weights_only=True))',
        "net.eval()",
        "```",
        "",
        "## Without hpctrain",
        "",
        "Each `.pt` file is a plain state dict (parameter name -> tensor) that torch alone reads:",
        "",
        "```python",
        "import torch",
        "",
        f'state = torch.load("{net["file"]}", weights_only=True)',
        "for key, tensor in state.items():",
        "    print(key, tuple(tensor.shape))",
        "net = YourNetwork()  # the same layers under the same names (below)",
        "net.load_state_dict(state)",
        "",
        '# a script that expects ckpt["model_state_dict"]:',
        'ckpt = {"model_state_dict": state}',
        "```",
    ]
    for name, n in nets.items():
        tensors = list(n["tensors"].items())
        lines += ["", f"`{n['file']}` ({name}, settings `{json.dumps(n['settings'])}`):", "```"]
        lines += [f"{key} {tuple(shape)}" for key, shape in tensors[:SHOWN_TENSORS]]
        if len(tensors) > SHOWN_TENSORS:
            lines.append(f"... and {len(tensors) - SHOWN_TENSORS} more (export.json lists them all)")
        lines.append("```")
    return "\n".join(lines) + "\n"
