"""Which torch build is installed (CPU or CUDA), read from torch's version file without importing torch: a login
node's `hpctrain submit` must not pay for the import, and a CPU-only torch on a GPU job should be said before the
job waits in the queue."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

# What a cluster user runs to get the CUDA build (the README's "Installing on a cluster (CUDA)").
CUDA_INSTALL = 'make install TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu126"'


def installed_build() -> tuple[str, str | None] | None:
    """(torch's version, its CUDA version or None for a CPU-only build); None when torch is not found."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    version_file = Path(next(iter(spec.submodule_search_locations))) / "version.py"
    try:
        text = version_file.read_text()
    except OSError:
        return None
    version = re.search(r"""^__version__\s*=\s*['"]([^'"]+)['"]""", text, re.M)
    cuda = re.search(r"""^cuda\s*(?::[^=]*)?=\s*['"]([^'"]+)['"]""", text, re.M)
    return (version.group(1) if version else "?", cuda.group(1) if cuda else None)


def cpu_only_message(version: str, source: str = "") -> str:
    """The one line for train.device=cuda on a CPU-only torch."""
    said = f" ({source})" if source else ""
    return (
        f"train.device=cuda{said} but the installed torch {version} is a CPU-only build: install the CUDA build "
        f"({CUDA_INSTALL}, or pip install torch --index-url <your site's CUDA wheel index>), or set "
        "train.device=cpu to train on the CPU"
    )


def cuda_problem(device: str) -> str | None:
    """For train.device=cuda: the line saying why this torch cannot use CUDA at all (a CPU-only build), else
    None. No torch import; whether a GPU is visible is the job's business (pick_device)."""
    if device != "cuda":
        return None
    build = installed_build()
    if build is None or build[1] is not None:
        return None
    return cpu_only_message(build[0])
