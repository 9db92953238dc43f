"""`hpctrain export RUN --out DIR [--which latest|best|step_N]`: a trained model for use outside hpctrain.

DIR gets one plain state dict per network (`model.pt`, `generator.pt`, ...: `torch.load(path, weights_only=True)`
gives parameter name -> tensor, nothing around it), the run's resolved `config.yaml`, `export.json` (what was
exported: run, checkpoint, update, params_sha256, each network's class and constructor settings) and a README.md
with the loading code, with and without hpctrain.
"""

from __future__ import annotations

import io
import json
import time
from pathlib import Path
from typing import Any

import torch

from hpctrain import __version__
from hpctrain.commands.common import ArgParser
from hpctrain.config.dump import to_yaml
from hpctrain.errors import UserError
from hpctrain.fsutil import atomic_write_bytes, atomic_write_json, atomic_write_text
from hpctrain.workloads.trained import Trained, load

EXPORT_JSON = "export.json"
SHOWN_TENSORS = 24  # tensors listed per network in the README (all of them are in the file)


def main(argv: list[str]) -> int:
    parser = ArgParser(
        prog="hpctrain export",
        description="Write a trained model's networks as plain state dicts, with its config and loading code.",
    )
    parser.add_argument("run", help="run folder or checkpoint file")
    parser.add_argument("--out", required=True, help="folder to write (new, empty, or an earlier export)")
    parser.add_argument(
        "--which", default="latest", help="latest (default), best, or step_N: which checkpoint of the run"
    )
    args = parser.parse_args(argv)
    out = Path(args.out)
    old = _check_out(out)

    trained = load(args.run, args.which, "cpu")
    written = write_export(trained, out, args.run, args.which, old)
    print(
        f"exported update {trained.step} of {args.run} ({trained.checkpoint.name}) to {out}: "
        f"{', '.join(written)}; params_sha256={trained.params_sha256}"
    )
    return 0


def _check_out(out: Path) -> list[str]:
    """The files an earlier export in `out` wrote ([] when there is none); refuses a folder that holds anything
    else, so an export never mixes with or overwrites other files."""
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out}: is a file; name a folder")
    if not out.is_dir() or not any(out.iterdir()):
        return []
    try:
        old = json.loads((out / EXPORT_JSON).read_text())
        return [str(net["file"]) for net in old["networks"].values()]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        raise UserError(
            f"--out {out}: holds other files and no earlier export; name a new or empty folder"
        ) from None


def write_export(trained: Trained, out: Path, run: str, which: str, old: list[str]) -> list[str]:
    """Write the export's files into `out` (each atomically; the README last). Returns their names."""
    out.mkdir(parents=True, exist_ok=True)
    networks: dict[str, Any] = {}
    for name, module in trained.models.items():
        state = {key: value.detach().cpu() for key, value in module.state_dict().items()}
        buffer = io.BytesIO()
        torch.save(state, buffer)
        atomic_write_bytes(out / f"{name}.pt", buffer.getvalue())
        cls = type(module)
        networks[name] = {
            "file": f"{name}.pt",
            "class": f"{cls.__module__}.{cls.__qualname__}",
            "settings": trained.settings.get(name),
            "parameters": sum(p.numel() for p in module.parameters()),
            "tensors": {key: list(value.shape) for key, value in state.items()},
        }
    for stale in set(old) - {net["file"] for net in networks.values()}:
        (out / stale).unlink(missing_ok=True)  # a network of the earlier export that this model has not
    atomic_write_text(out / "config.yaml", to_yaml(trained.config))
    meta = {
        "run": str(trained.run_dir.absolute()) if trained.run_dir is not None else None,
        "source": str(run),
        "checkpoint": str(trained.checkpoint.absolute()),
        "which": which,
        "step": trained.step,
        "params_sha256": trained.params_sha256,
        "model_type": trained.model_type,
        "networks": networks,
        "sampler": trained.sampler is not None,
        "hpctrain": __version__,
        "torch": torch.__version__,
        "exported": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    atomic_write_json(out / EXPORT_JSON, meta)
    atomic_write_text(out / "README.md", readme(meta))
    return [*(net["file"] for net in networks.values()), "config.yaml", EXPORT_JSON, "README.md"]


def readme(meta: dict[str, Any]) -> str:
    """The export folder's README: what it holds and the loading code (with hpctrain, then with torch alone)."""
    nets = meta["networks"]
    first, net = next(iter(nets.items()))
    module, _, cls = net["class"].rpartition(".")
    source = meta["run"] or meta["checkpoint"]
    lines = [
        f"# {meta['model_type']} model, update {meta['step']}",
        "",
        f"Exported by hpctrain {meta['hpctrain']} (torch {meta['torch']}) on {meta['exported']} from "
        f"`{meta['checkpoint']}` (`--which {meta['which']}`).",
        f"params_sha256 `{meta['params_sha256']}` (over every network's state dict: the figure the run's "
        "summary.json and last line give for the same checkpoint).",
        "",
        "| file | network | class | parameters |",
        "|---|---|---|---:|",
        *(f"| `{n['file']}` | {name} | `{n['class']}` | {n['parameters']:,} |" for name, n in nets.items()),
        "",
        "`config.yaml` is the run's resolved configuration (`hpctrain train --config config.yaml run.name=NEW` "
        "trains the same model afresh); "
        "`export.json` lists the files, each network's class and its constructor settings (`settings`).",
        "",
        "## With hpctrain",
        "",
        "```python",
        "import hpctrain",
        "",
        f'trained = hpctrain.load("{source}")  # which="best" | "step_N"; device="cuda"',
        f'net = trained.models["{first}"]  # in eval mode; trained.config, trained.step, trained.params_sha256',
    ]
    if meta["sampler"]:
        lines.append(
            "events = trained.sampler.sample(10_000, seed=0)  # the bundles `hpctrain sample` writes"
        )
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
